"""MLflow pyfunc model of an exported translation model ("models from code").

MLflow runs this file when it loads the model (``mlflow.pyfunc.load_model``,
``mlflow models serve``); :func:`attnlab.serving.registry.log_served_model` logs it with
the export folder (``models/<model>/``) as the artifact ``export``.

Input: a list of English sentences (``{"inputs": [...]}`` over HTTP, or a list
or one-column DataFrame in Python). Output: one French string per sentence,
decoded exactly as ``src/translate.py`` does (:class:`attnlab.serving.translator.Translator`:
the export's beam settings; "" → "").
With the param ``alignments`` true (``{"inputs": [...], "params": {"alignments": true}}``;
``params={"alignments": True}`` in Python) each answer is instead an object: the translation,
its source and target pieces and the cross attention that produced it
(:meth:`attnlab.serving.translator.Alignment.as_json`; docs: How-to, serving).
The param ``engine`` chooses the decoder among those the export holds
(:data:`attnlab.serving.translator.ENGINES`: ``torch``, the default; ``ctranslate2`` and
``ctranslate2_int8`` for a Transformer); another is an HTTP 400 naming those it has.

A request is checked before anything is decoded (:meth:`attnlab.serving.translator.Translator.check_request`):
no sentence; more than ``serving.max_request_sentences`` sentences (default 32),
``max_request_chars`` characters (4,000) or ``max_request_tokens`` sentencepiece tokens
(1,000) together; a sentence longer than ``max_input_chars`` characters (500) or
``max_input_tokens`` tokens; or an item that is not a string: each raises
``MlflowException`` with ``INVALID_PARAMETER_VALUE``, which the scoring server answers
with HTTP 400 and the message (the count, the limit, its setting, how to split). The
per-request limits keep a request well inside the scoring server's
``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT`` (60 s), after which it answers 504 whatever
the model is still doing. Bad JSON and a body without ``inputs`` never reach ``predict``:
MLflow answers those with its own 400.

No ``from __future__ import annotations`` here: MLflow reads ``predict``'s
type hints at class creation to build the signature and validate inputs.

The model's ``requirements.txt`` is derived from the imports of this file and of
the attnlab modules it reaches (:func:`attnlab.serving.requirements.served_requirements`): a new
import statement there becomes a new pinned requirement. Import modules with
``import`` statements, not ``importlib``, which that derivation cannot see
(``tests/test_served_env.py`` would then fail in its fresh virtualenv).
"""

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from attnlab.serving.malloc import cap_malloc_arenas
from attnlab.serving.registry import EXPORT_ARTIFACT
from attnlab.serving.translator import InputTooLongError, InvalidRequestError, Translator


class TranslationModel(mlflow.pyfunc.PythonModel):
    """Source sentences → translations with an exported model (``models/<model>/``)."""

    def load_context(self, context) -> None:
        """Load the export folder ``context.artifacts["export"]`` (programs + spm.model),
        and cap glibc's malloc arenas so the server's memory stays flat under concurrent
        requests (:func:`attnlab.serving.malloc.cap_malloc_arenas`)."""
        cap_malloc_arenas()
        self.translator = Translator(context.artifacts[EXPORT_ARTIFACT])

    def predict(self, context, model_input: list[str], params=None) -> list[str]:
        """Translate each sentence; list of N str (1 ≤ N ≤ ``max_request_sentences``) →
        list of N str, input order; with ``params={"alignments": True}`` a list of N dicts
        (:meth:`attnlab.serving.translator.Alignment.as_json`).

        Raises:
            MlflowException: INVALID_PARAMETER_VALUE (HTTP 400), nothing decoded, if the
                list is empty, holds a non-string, is over a per-request limit (sentences,
                characters, tokens), or a sentence is over a per-sentence limit; the
                message names the problem, the limit and its ``serving.*`` setting.
        """
        try:
            params = params or {}
            return self.translator.serve(
                model_input, alignments=bool(params.get("alignments")), engine=params.get("engine") or None
            )
        except (InputTooLongError, InvalidRequestError) as e:
            raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None


mlflow.models.set_model(TranslationModel())
