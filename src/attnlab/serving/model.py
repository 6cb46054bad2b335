"""MLflow pyfunc model of an exported translation model ("models from code").

MLflow runs this file when it loads the model (``mlflow.pyfunc.load_model``,
``mlflow models serve``); :func:`attnlab.serving.registry.log_served_model` logs it with
the export folder (``models/<model>/``) as the artifact ``export``.

Input (its MLflow signature, :func:`attnlab.serving.signature.served_signature`): one string
column, named ``text``: ``{"inputs": ["sentence", ...]}`` over HTTP (or ``instances``,
``dataframe_split``/``dataframe_records`` with the column ``text``, or a ``text/csv`` body with the
header line ``text``); a list of inputs or a DataFrame with the one column ``text`` in Python.
Other, extra or no columns, and params the signature does not declare, are refused (HTTP 400)
before MLflow would drop them (:mod:`attnlab.serving.guard`). Output: one translation per
input, decoded exactly as ``src/translate.py`` does
(:class:`attnlab.serving.translator.Translator`: each input cut into its sentences, each
sentence translated with the export's beam settings, the translations joined with the
input's own spaces and line breaks; "" → "").

Params (``{"inputs": [...], "params": {...}}``; ``params={...}`` in Python):
``details`` true answers each input with an object instead: the translation and the sentences
it was cut into, each with its translation
(:meth:`attnlab.serving.translator.Translation.as_json`); ``alignments`` true adds to each
sentence its source and target pieces and the cross attention that produced it
(:meth:`attnlab.serving.translator.Alignment.as_json`; docs: How-to, serving). ``engine``
chooses the decoder among those the export holds (:data:`attnlab.serving.translator.ENGINES`:
``torch``, the default; ``ctranslate2`` and ``ctranslate2_int8`` for a Transformer); another is
an HTTP 400 naming those it has. ``beam_size`` decodes with that beam (1 is greedy) instead of
the export's, 1 to :data:`attnlab.serving.signature.MAX_BEAM_SIZE`.

A request is checked before anything is decoded (:meth:`attnlab.serving.translator.Translator.check_request`):
no sentence; more than ``serving.max_request_sentences`` sentences (default 32),
``max_request_chars`` characters (4,000) or ``max_request_tokens`` sentencepiece tokens
(1,000) together; a sentence longer than ``max_input_chars`` characters (500) or
``max_input_tokens`` tokens; a sentence that is not text (a lone surrogate); or an item that
is not a string: each raises ``MlflowException`` with ``INVALID_PARAMETER_VALUE``, which the
scoring server answers with HTTP 400 and the message (the count, the limit, its setting, how
to split). The per-request limits keep a request well inside the scoring server's
``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT`` (60 s), after which it answers 504 whatever the
model is still doing. Bad JSON, a CSV body pandas cannot read and a body without ``inputs``
(or another input field) never reach ``predict``: MLflow answers those with its own 400.
Every error answer over HTTP is one line ending in an error id, never a traceback; the
server log has the id and the traceback (:mod:`attnlab.serving.guard`).

No ``from __future__ import annotations`` here: MLflow reads ``predict``'s type hints at
class creation; a DataFrame hint gives no signature of its own, so the one
:func:`attnlab.serving.registry.log_served_model` logs (named column ``text``, params) holds.

The model's ``requirements.txt`` is derived from the imports of this file and of
the attnlab modules it reaches (:func:`attnlab.serving.requirements.served_requirements`): a new
import statement there becomes a new pinned requirement. Import modules with
``import`` statements, not ``importlib``, which that derivation cannot see
(``tests/test_served_env.py`` would then fail in its fresh virtualenv).
"""

from attnlab.serving.threads import in_scoring_server, match_threads, passive_wait_policy

# before torch is imported (by the translator below): OpenMP reads it once. Only the scoring
# server's processes; a script or notebook that loads the model keeps its own.
WAIT_POLICY = passive_wait_policy() if in_scoring_server() else None

import logging  # noqa: E402 - after passive_wait_policy()
import os  # noqa: E402 - after passive_wait_policy()

import mlflow  # noqa: E402 - after passive_wait_policy()
import pandas as pd  # noqa: E402 - after passive_wait_policy()
from mlflow.exceptions import MlflowException  # noqa: E402 - after passive_wait_policy()
from mlflow.protos.databricks_pb2 import DEADLINE_EXCEEDED, INVALID_PARAMETER_VALUE  # noqa: E402 - after passive_wait_policy()

from attnlab.serving.batching import DeadlineExceededError, RequestBatcher  # noqa: E402 - after passive_wait_policy()
from attnlab.serving.guard import ServedModelError, install  # noqa: E402 - after passive_wait_policy()
from attnlab.serving.malloc import cap_malloc_arenas  # noqa: E402 - after passive_wait_policy()
from attnlab.serving.registry import EXPORT_ARTIFACT  # noqa: E402 - after passive_wait_policy()
from attnlab.serving.signature import INPUT_COLUMN, check_beam_size, input_frame  # noqa: E402 - after passive_wait_policy()
from attnlab.serving.translator import InputTooLongError, InvalidRequestError, Translator  # noqa: E402 - after passive_wait_policy()

log = logging.getLogger("attnlab.serving")


class TranslationModel(mlflow.pyfunc.PythonModel):
    """Source sentences → translations with an exported model (``models/<model>/``)."""

    # attnlab.serving.guard (GUARD_ATTRIBUTE): requests held to the whole signature, errors one line
    attnlab_signature_guard = True

    def load_context(self, context) -> None:
        """Load the export folder ``context.artifacts["export"]`` (programs + spm.model) and
        install :func:`attnlab.serving.guard.install` (signature checks, one-line errors with an
        id). In the scoring server's processes only (:func:`attnlab.serving.threads.in_scoring_server`;
        a script or notebook that loads the model keeps its malloc and threads and decodes each
        call at once): cap glibc's malloc arenas so the server's memory stays flat under
        concurrent requests (:func:`attnlab.serving.malloc.cap_malloc_arenas`), match torch's
        threads to the cores and the server's workers
        (:func:`attnlab.serving.threads.match_threads`) and batch concurrent requests
        (:class:`attnlab.serving.batching.RequestBatcher`, each request's deadline the scoring
        server's ``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT``, 60 s by default)."""
        install()
        self.translator = Translator(context.artifacts[EXPORT_ARTIFACT])
        if not in_scoring_server():
            return
        cap_malloc_arenas()
        threads = match_threads()
        log.info(
            "served model: %(workers)d worker(s) on %(cores)d core(s), %(threads)d torch "
            "thread(s) each (set by %(set_by)s), OpenMP wait policy %(policy)s",
            {**threads, "policy": WAIT_POLICY or "not set (torch was imported first)"},
        )
        self.translator.request_timeout_s = float(
            os.environ.get("MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT") or 60
        )
        self.translator.batcher = RequestBatcher(self.translator.decode_batch)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> list:
        """Translate each input of the column ``text``; N rows → list of N str, input order;
        with ``params={"details": True}`` or ``{"alignments": True}`` a list of N dicts
        (:meth:`attnlab.serving.translator.Translation.as_json`); ``engine`` and ``beam_size``
        choose the decoder and the beam.

        Raises:
            MlflowException: INVALID_PARAMETER_VALUE (HTTP 400), nothing decoded, if there is
                no sentence, an item is not a string or not text, the request is over a
                per-request limit (sentences, characters, tokens), a sentence is over a
                per-sentence limit, or ``engine`` or ``beam_size`` is not one this model has;
                the message names the problem, the limit and its ``serving.*`` setting.
        """
        params = params or {}
        try:
            sentences = input_frame(model_input, INPUT_COLUMN)[INPUT_COLUMN].tolist()
            return self.translator.serve(
                sentences,
                alignments=bool(params.get("alignments")),
                details=bool(params.get("details")),
                engine=params.get("engine") or None,
                beam_size=check_beam_size(params.get("beam_size"), self.translator.beam_size),
            )
        except (InputTooLongError, InvalidRequestError) as e:
            raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None
        except DeadlineExceededError as e:  # HTTP 504, as the scoring server's own timeout
            raise ServedModelError(str(e), DEADLINE_EXCEEDED) from None


mlflow.models.set_model(TranslationModel())
