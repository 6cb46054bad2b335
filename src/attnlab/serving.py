"""MLflow pyfunc model of an exported translation model ("models from code").

MLflow runs this file when it loads the model (``mlflow.pyfunc.load_model``,
``mlflow models serve``); :func:`attnlab.export.log_served_model` logs it with
the export folder (``models/<model>/``) as the artifact ``export``.

Input: a list of English sentences (``{"inputs": [...]}`` over HTTP, or a list
or one-column DataFrame in Python). Output: one French string per sentence,
decoded exactly as ``src/translate.py`` does (:class:`attnlab.export.Translator`:
the export's beam settings; "" → ""). A sentence longer than the export's
``serving.max_input_chars`` characters (default 500), or ``max_input_tokens``
sentencepiece tokens, raises ``MlflowException`` with
``INVALID_PARAMETER_VALUE``: the scoring server answers HTTP 400 with the
limit in the message, and nothing of the request is decoded.

No ``from __future__ import annotations`` here: MLflow reads ``predict``'s
type hints at class creation to build the signature and validate inputs.

The model's ``requirements.txt`` is derived from the imports of this file and of
the attnlab modules it reaches (:func:`attnlab.export.served_requirements`): a new
import statement there becomes a new pinned requirement. Import modules with
``import`` statements, not ``importlib``, which that derivation cannot see
(``tests/test_served_env.py`` would then fail in its fresh virtualenv).
"""
import mlflow
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from attnlab.export import EXPORT_ARTIFACT, InputTooLongError, Translator


class TranslationModel(mlflow.pyfunc.PythonModel):
    """English sentences → French translations with an exported TorchScript model."""

    def load_context(self, context) -> None:
        """Load the export folder ``context.artifacts["export"]`` (TorchScript + spm.model)."""
        self.translator = Translator(context.artifacts[EXPORT_ARTIFACT])

    def predict(self, context, model_input: list[str], params=None) -> list[str]:
        """Translate each sentence; list of N str → list of N str, input order.

        Raises:
            MlflowException: INVALID_PARAMETER_VALUE (HTTP 400) if a sentence is longer
                than ``max_input_chars`` characters or ``max_input_tokens`` tokens.
        """
        try:
            return self.translator(model_input)
        except InputTooLongError as e:
            raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None


mlflow.models.set_model(TranslationModel())
