"""Self-contained exported models: TorchScript + sentencepiece + JSON, no Lightning, no Hydra.

One job per module; import from the module that has it (this package re-exports nothing):

- :mod:`attnlab.export.trace`: trace a trained net into an export folder.
  A translation export folder ``models/<model>/`` holds ``init_state.pt`` and
  ``step.pt`` (TorchScript traces of the model's decoding interface, see
  :mod:`attnlab.decoding`), ``spm.model`` and ``config.json``
  (:func:`~attnlab.export.trace.export_translation`). NW exports ``model.pt``
  mapping x (Q,) float32 → ŷ (Q,), with its training points baked in
  (:func:`~attnlab.export.trace.export_regression`).
- :mod:`attnlab.export.translator`: the runtime that loads such a folder with torch and
  sentencepiece only (:func:`~attnlab.export.translator.load_translator`), and
  :class:`~attnlab.export.translator.Translator`, the text-in, text-out front end
  (``src/translate.py`` and the MLflow model of :mod:`attnlab.serving` use it) with its
  input limits and request errors. It is the served model's runtime: it imports nothing
  beyond torch, sentencepiece and :mod:`attnlab.decoding`.
- :mod:`attnlab.export.registry`: MLflow serving.
  :func:`~attnlab.export.registry.log_served_model` logs an export folder as an MLflow
  pyfunc model and registers it (the export stage calls it for every translation model);
  the newest version has the alias ``champion``; the registered model's name, URI and
  ``mlflow models serve`` command.
- :mod:`attnlab.export.requirements`: the served model's ``requirements.txt``
  (:func:`~attnlab.export.requirements.served_requirements`), which pins everything its
  code imports (``src/attnlab/serving.py`` and the attnlab modules it reaches), so it
  loads in a fresh environment built from that file alone.
"""
