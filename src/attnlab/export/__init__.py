"""Self-contained exported models: ``torch.export`` programs, CTranslate2 models, sentencepiece, JSON.

One job per module (this package re-exports nothing):

* :mod:`attnlab.export.program`: the decoding interface (``init_state``, ``step``) as
  ``torch.export`` programs with dynamic shapes (``.pt2``); the step is also compiled
  with AOTInductor where the CPU allows it.
* :mod:`attnlab.export.trace`: a trained net → an export folder ``models/<model>/``
  (programs, ``spm.model``, ``config.json``); NW's ``model.pt`` (x → ŷ).
* :mod:`attnlab.export.ctranslate2`: the Transformer as a CTranslate2 model (float32, int8).
* :mod:`attnlab.export.tasks`: what the export stage does for each model's ``task``.

The folder is read back by :mod:`attnlab.serving.translator` with torch and sentencepiece
alone; :mod:`attnlab.serving.registry` logs it to MLflow.
"""
