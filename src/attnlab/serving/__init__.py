"""The served model: the MLflow pyfunc, its translator runtime, the registry, requirements.

Kept light: MLflow loads :mod:`attnlab.serving.model` ("models from code") in a fresh
environment built from :mod:`attnlab.serving.requirements`, and this file runs first.

* :mod:`attnlab.serving.model`: the pyfunc model (input checks, params, engines).
* :mod:`attnlab.serving.signature`: its MLflow signature (one string column ``text``, the
  params) and the checks MLflow leaves out (other columns, unknown params).
* :mod:`attnlab.serving.request_body`: HTTP bodies MLflow's scoring server would change unseen.
* :mod:`attnlab.serving.guard`: runs those checks before MLflow's, and makes every error
  answer one line with an error id (the traceback goes to the server log).
* :mod:`attnlab.serving.translator`: loads an export folder with torch and sentencepiece
  alone; :class:`~attnlab.serving.translator.Translator`, text in, text out (also used by
  ``src/translate.py``).
* :mod:`attnlab.serving.registry`: logs an export as an MLflow model, registers it, and
  moves the ``champion`` alias.
* :mod:`attnlab.serving.requirements`: the served model's pinned ``requirements.txt``.
* :mod:`attnlab.serving.malloc`: the memory allocator settings of the served process.
"""
