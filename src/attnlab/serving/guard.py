"""Hold MLflow to the served model's whole signature, and keep server details out of its errors.

MLflow 3.17 enforces a model's signature in ``PyFuncModel.predict``, but
``mlflow.models.utils._enforce_schema`` and ``_enforce_params_schema`` drop an undeclared
column or param with a logged warning alone, before the model's ``predict`` runs, so the
model cannot refuse them; and it refuses a plain list for a named column. Its scoring server
answers an error with the exception's message prefixed by a dump of the request, and adds
``stack_trace`` (a traceback with the server's file paths) to a CSV or Parquet body it cannot
parse and to any non-MLflow exception of ``predict`` (then with status 400). No setting
changes either, so :func:`install` wraps the two places, for models that opt in with
``attnlab_signature_guard = True`` on their python model (:class:`attnlab.serving.model.TranslationModel`)
and passes every other model through untouched:

* ``mlflow.pyfunc.PyFuncModel.predict`` (Python and HTTP): the raw input goes through
  :func:`attnlab.serving.signature.input_frame` and the raw params through
  :func:`~attnlab.serving.signature.check_params` before MLflow's own enforcement; any error is
  raised as :class:`ServedModelError` (one line; a fault that is not the request's is
  ``INTERNAL_ERROR``, its cause chained).
* ``mlflow.pyfunc.scoring_server.invocations`` (HTTP): the raw body goes through
  :func:`attnlab.serving.request_body.check_body` first (the server would turn a JSON item
  that is not a string into one, and pandas reads some CSV lines as other text); every
  error answer is one JSON object
  ``{"error_code", "message", "error_id"}`` whose message is one line ending in
  ``(error id <12 hex digits>)``, with no traceback and no server path; the server log gets
  that id, the status, the message and the whole traceback (logger ``attnlab.serving``).

Wrapping is the least intrusive way there is: MLflow offers no hook before its enforcement,
nor one for its error bodies, and the served model must behave the same under
``mlflow models serve``, its ``--env-manager`` builds and ``generate-dockerfile`` images,
which all run MLflow's own server and load the model through ``load_context``.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import uuid

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE, ErrorCode

from attnlab.serving.request_body import check_body
from attnlab.serving.signature import check_params, input_frame
from attnlab.serving.translator import InputTooLongError, InvalidRequestError

GUARD_ATTRIBUTE = "attnlab_signature_guard"  # set True on a python model to opt in
INTERNAL_MESSAGE = (
    "internal error of the served model while answering this request (not a problem with the "
    "request); the server log has the details under the error id"
)
MAX_MESSAGE_CHARS = 2000
logger = logging.getLogger("attnlab.serving")


class ServedModelError(MlflowException):
    """An error of the served model: ``reason`` is its one-line message for the client.

    MLflow's scoring server rewrites ``message`` (it prefixes a dump of the request);
    ``reason`` stays as it was raised.
    """

    def __init__(self, reason: str, error_code: int | str = INVALID_PARAMETER_VALUE):
        reason = one_line(reason)
        if isinstance(error_code, str):  # an MlflowException's error_code is the code's name
            error_code = ErrorCode.Value(error_code)
        super().__init__(reason, error_code=error_code)
        self.reason = reason


def one_line(message: str) -> str:
    """``message`` on one line (whitespace runs → one space), at most :data:`MAX_MESSAGE_CHARS`."""
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def _is_guarded(pyfunc_model) -> bool:
    python_model = getattr(getattr(pyfunc_model, "_model_impl", None), "python_model", None)
    return getattr(python_model, GUARD_ATTRIBUTE, False) is True


def _guard_predict(predict):
    @functools.wraps(predict)
    def guarded(self, data, params=None):
        if not _is_guarded(self):
            return predict(self, data, params)
        try:
            column = self.metadata.get_input_schema().input_names()[0]
            data = input_frame(data, column)
            check_params(params, self.metadata.get_params_schema())
            return predict(self, data, params)
        except ServedModelError:
            raise
        except (InvalidRequestError, InputTooLongError) as e:
            raise ServedModelError(str(e), INVALID_PARAMETER_VALUE) from e
        except MlflowException as e:  # MLflow's enforcement, or the model's own 4xx
            if e.get_http_status_code() >= 500:  # not the request's fault: say nothing of the server
                raise ServedModelError(INTERNAL_MESSAGE, e.error_code) from e
            raise ServedModelError(e.message, e.error_code) from e
        except Exception as e:  # any other fault is the server's: a 500, its cause chained
            raise ServedModelError(INTERNAL_MESSAGE, INTERNAL_ERROR) from e

    guarded._attnlab_guard = True
    return guarded


def error_answer(error: BaseException) -> tuple[str, int]:
    """(JSON body, HTTP status) of the served model's answer to ``error``, logged with its id.

    A :class:`ServedModelError` answers its ``reason`` (:data:`INTERNAL_MESSAGE` for a server
    fault, a request past its deadline its own 504 message), another MlflowException (the
    scoring server's own, e.g. a body it cannot parse) the first line of its message; another
    server fault (status ≥ 500, or any other exception) :data:`INTERNAL_MESSAGE`.
    """
    error_id = uuid.uuid4().hex[:12]
    if isinstance(error, ServedModelError):
        message, code, status = error.reason, error.error_code, error.get_http_status_code()
    elif isinstance(error, MlflowException):
        first = next((line for line in error.message.splitlines() if line.strip()), error.error_code)
        message, code, status = one_line(first), error.error_code, error.get_http_status_code()
    else:
        message, code, status = INTERNAL_MESSAGE, "INTERNAL_ERROR", 500
    if status >= 500 and not isinstance(error, ServedModelError):  # may name the server's files
        message = INTERNAL_MESSAGE  # (a ServedModelError's reason is written for the client)
    logger.log(
        logging.ERROR if status >= 500 else logging.WARNING,
        "error id %s: HTTP %d %s: %s",
        error_id,
        status,
        code,
        message,
        exc_info=(type(error), error, error.__traceback__),
    )
    body = {"error_code": code, "message": f"{message} (error id {error_id})", "error_id": error_id}
    return json.dumps(body), status


def _guard_invocations(invocations, response_type):
    @functools.wraps(invocations)
    def guarded(data, content_type, model, input_schema):
        if not _is_guarded(model):
            return invocations(data, content_type, model, input_schema)
        try:
            try:
                check_body(data, content_type, model.metadata.get_input_schema().input_names()[0])
            except InvalidRequestError as e:
                raise ServedModelError(str(e), INVALID_PARAMETER_VALUE) from e
            return invocations(data, content_type, model, input_schema)
        except Exception as e:  # noqa: BLE001 - every error becomes one line + id; the trace is logged
            body, status = error_answer(e)
            return response_type(response=body, status=status, mimetype="application/json")

    guarded._attnlab_guard = True
    return guarded


def install() -> None:
    """Wrap ``PyFuncModel.predict`` and the scoring server's ``invocations`` (once per process),
    and give the ``attnlab.serving`` logger a stderr handler when logging has none."""
    import mlflow.pyfunc
    from mlflow.pyfunc import scoring_server

    model_class = mlflow.pyfunc.PyFuncModel
    if not getattr(model_class.predict, "_attnlab_guard", False):
        model_class.predict = _guard_predict(model_class.predict)
    if not getattr(scoring_server.invocations, "_attnlab_guard", False):
        scoring_server.invocations = _guard_invocations(
            scoring_server.invocations, scoring_server.InvocationsResponse
        )
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
