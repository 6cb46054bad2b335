"""MLflow serving: an export folder as a registered pyfunc model.

:func:`log_served_model` logs an export folder as an MLflow pyfunc model and
registers it (the export stage calls it for every translation model); the newest
version has the alias ``champion``, and the model's ``requirements.txt`` pins
everything its code imports (:func:`attnlab.serving.requirements.served_requirements`),
so it loads in a fresh environment built from that file alone.
:func:`registered_model_name`, :func:`served_model_uri` and :func:`serve_command`
name the registered model, its URI and the command that serves it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from attnlab.errors import UserError, brief
from attnlab.serving.requirements import PACKAGE_DIR, SERVING_CODE, served_requirements
from attnlab.serving.translator import Translator
from attnlab.tracking.logged_models import HeldStops, end_run_as, fail_logged_models, now_ms

EXPORT_ARTIFACT = "export"  # key of the export folder in the pyfunc's context.artifacts
SERVING_EXAMPLE = ["A man rides a bike."]
CHAMPION = "champion"  # registry alias of the newest version of each registered model

log = logging.getLogger(__name__)


class ServingExportError(UserError, RuntimeError):
    """Logging or registering the served model in MLflow failed."""


def registered_model_name(model: str) -> str:
    """Name of the MLflow registered model of architecture ``model``: ``attnlab-<model>``."""
    return f"attnlab-{model}"


def served_model_uri(name: str, version: int | str | None = None) -> str:
    """``models:/<name>@champion`` (the newest version), or ``models:/<name>/<version>``."""
    return f"models:/{name}@{CHAMPION}" if version is None else f"models:/{name}/{version}"


SERVE_PORT = 5001  # the README's and docs/how-to/serve.md's port (MLflow's 5000 is its UI's)
# uvicorn workers of the served command: two workers of cores/2 torch threads each served more
# sentences/s than one of all cores on both 2-core CPUs measured (results/serve_load.csv)
SERVE_WORKERS = 2


def serve_command(
    name: str, tracking_uri: str, version: int | str | None = None, *, local: bool = True
) -> str:
    """The shell command that serves registered model ``name``: its ``champion`` alias
    (the newest version), or ``version`` when given.

    ``local`` (default): as the README runs it, on port :data:`SERVE_PORT` with
    ``--env-manager local``: the model runs in this Python environment (the project's
    ``.venv``), nothing is installed. ``local=False``: MLflow's default environment manager
    (``virtualenv``) builds the model's own environment from its ``requirements.txt``
    (:func:`attnlab.serving.requirements.served_requirements`), so the command works on any
    machine that reaches the store and the package index (it needs pyenv). Both run
    :data:`SERVE_WORKERS` uvicorn workers (``-w``); each gives torch ``cores // workers`` threads
    (:func:`attnlab.serving.threads.match_threads`).
    """
    uri = served_model_uri(name, version)
    command = f"MLFLOW_TRACKING_URI={tracking_uri} mlflow models serve -m {uri} -w {SERVE_WORKERS}"
    return f"{command} -p {SERVE_PORT} --env-manager local" if local else command


def log_served_model(export_dir: Path, model: str, run_id: str, tracking_uri: str) -> tuple[str, int]:
    """Log a translation export folder to MLflow run ``run_id`` as a pyfunc model and register it.

    The pyfunc is a "model from code" (:mod:`attnlab.serving.model`, not a pickle) with
    the export folder as its artifact and the attnlab package as its code path, so a
    registered version keeps the decoding code it was logged with. Signature
    (:func:`attnlab.serving.signature.served_signature`): one string column ``text``; params
    ``alignments``, ``engine`` and ``beam_size`` with the export's defaults. Its metadata and
    the version's description state the input limits and the beam bounds. The logged model is loaded
    back and run on :data:`SERVING_EXAMPLE` before it is registered, so only a
    model that translates gets a version. Every call adds a new version and moves
    the alias ``champion`` (:data:`CHAMPION`) to it, so ``models:/<name>@champion``
    is the newest. Its ``requirements.txt`` is
    :func:`attnlab.serving.requirements.served_requirements`: exact
    pins of everything the logged code imports, so the model loads in a fresh
    environment built from that file alone (``--env-manager virtualenv``, Docker).
    Sets this process's MLflow tracking URI to ``tracking_uri``.

    A call that fails or is stopped before the version is registered leaves no PENDING model
    in the run: the model it logged ends FAILED, and the run keeps its status. A first Ctrl-C
    or SIGTERM stops it at the end of the MLflow step under way, a second at once
    (:mod:`attnlab.tracking.logged_models`); PENDING models an earlier export of the run left
    (killed) are marked FAILED at the start, with a warning.

    Args:
        export_dir: folder written by :func:`attnlab.export.trace.export_translation`.
        model: architecture name (``transformer``, ``bahdanau``); the registered
            model is :func:`registered_model_name` of it.
        run_id: the training run to attach the model to (``runs/<model>.json``).
        tracking_uri: the store holding that run; its registry gets the version.
    Returns:
        (registered model name, version number).
    Raises:
        FileNotFoundError, ValueError: ``export_dir`` is not a translation export.
        ServedRequirementsError: the served code imports a module that cannot be pinned
            (nothing is logged then).
        ServingExportError: logging, loading back, registering or setting the alias failed
            (names run, store, fix).
    """
    import mlflow
    import pandas as pd

    from attnlab.serving.signature import INPUT_COLUMN, MAX_BEAM_SIZE, served_signature

    export_dir = Path(export_dir).resolve()
    translator = Translator(export_dir)
    requirements = served_requirements()
    name = registered_model_name(model)
    limits = {
        key: getattr(translator, key)
        for key in (
            "max_input_chars",
            "max_input_tokens",
            "max_request_sentences",
            "max_request_chars",
            "max_request_tokens",
        )
    }
    metadata = {
        "model": model,
        **limits,
        "engines": translator.engines,
        "input": f"one string column, {INPUT_COLUMN}",
        "beam_size": translator.beam_size,
        "beam_size_range": [1, max(MAX_BEAM_SIZE, translator.beam_size)],
        "alpha": translator.alpha,
        "too_long_input": "HTTP 400 (INVALID_PARAMETER_VALUE)",
        "too_large_request": "HTTP 400 (INVALID_PARAMETER_VALUE), nothing decoded",
        "empty_request": "HTTP 400 (INVALID_PARAMETER_VALUE)",
        "empty_input": "translates to an empty string",
    }
    signature = served_signature(translator.engine, translator.beam_size)
    step, registered, status = "logging", False, None
    since = now_ms()  # the run's models logged since are this call's
    stops = HeldStops(f"export of {model}")  # Ctrl-C, SIGTERM: at the end of the step under way
    try:
        mlflow.set_tracking_uri(tracking_uri)
        status = mlflow.MlflowClient(tracking_uri).get_run(run_id).info.status
        status = status if status in ("FINISHED", "FAILED", "KILLED") else "FINISHED"
        for stale in fail_logged_models(tracking_uri, run_id, pending_only=True):
            log.warning("marked FAILED the served model %s an earlier, stopped export left PENDING", stale)
        mlflow.start_run(run_id=run_id)
        try:
            info = mlflow.pyfunc.log_model(
                name="translator",
                python_model=str(SERVING_CODE),
                artifacts={EXPORT_ARTIFACT: str(export_dir)},
                code_paths=[str(PACKAGE_DIR)],  # the whole attnlab package, importable as `attnlab`
                signature=signature,
                # MLflow checks the example against the signature with a list refused for a named
                # column, so a DataFrame (its serving_input_example.json: dataframe_split)
                input_example=(
                    pd.DataFrame({INPUT_COLUMN: SERVING_EXAMPLE}),
                    {p.name: p.default for p in signature.params.params},
                ),
                pip_requirements=requirements,
                metadata=metadata,
                tags={"model": model},
            )
        finally:  # the training run keeps its status (a failed export is not a failed training)
            mlflow.end_run(status)
        stops.check()
        step = "loading back"
        answer = mlflow.pyfunc.load_model(info.model_uri).predict(SERVING_EXAMPLE)
        if not (isinstance(answer, list) and len(answer) == 1 and isinstance(answer[0], str)):
            raise ValueError(
                f"the logged model answered {answer!r} to {SERVING_EXAMPLE!r}, expected a list of one string"
            )
        stops.check()
        step = "registering"
        version = int(mlflow.register_model(info.model_uri, name).version)
        registered = True
        client = mlflow.MlflowClient(tracking_uri)
        client.update_model_version(
            name,
            version,
            description=(
                f"{model} translation model of run {run_id}. Input: a list of sentences (one "
                f"string column, {INPUT_COLUMN}), each at most "
                f"{translator.max_input_chars} characters (longer: HTTP 400, INVALID_PARAMETER_VALUE); "
                f"per request 1 to {translator.max_request_sentences} sentences, at most "
                f"{translator.max_request_chars} characters and {translator.max_request_tokens} "
                "tokens together (else HTTP 400; split the request); "
                f'an empty sentence translates to "". Beam size {translator.beam_size} '
                f"(param beam_size: 1 to {max(MAX_BEAM_SIZE, translator.beam_size)}), alpha "
                f"{translator.alpha}. Serve: {serve_command(name, tracking_uri, version, local=False)}"
            ),
        )
        step = f"setting the alias {CHAMPION} of"
        client.set_registered_model_alias(name, CHAMPION, version)
    except BaseException as e:  # Ctrl-C and SIGTERM too: a model logged, not registered, ends FAILED
        stops.cleaning = True  # nothing stops the cleanup
        _clean_up(tracking_uri, run_id, status, None if registered else since)
        if not isinstance(e, Exception):
            raise
        raise ServingExportError(
            f"{step} the served model {name} (export {export_dir}) in MLflow run {run_id} at "
            f"{tracking_uri} failed: {brief(e)}. The export folder itself is written; "
            "check that the store is reachable and holds the run (runs/<model>.json), then "
            f"re-run `python src/export.py model={model}` (or `dvc repro export@{model}`)"
        ) from e
    finally:
        stops.restore()
    return name, version


def _clean_up(tracking_uri: str, run_id: str, status: str | None, since: int | None) -> None:
    """After a failed or stopped :func:`log_served_model`: the run's models logged since
    ``since`` (None: none, the model was registered) end FAILED, and the training run gets back
    its ``status`` (None: it was not opened). The store's own errors are logged, not raised: the
    error that stopped the export is the one to report."""
    try:
        if since is not None:
            fail_logged_models(tracking_uri, run_id, since)
        if status is not None:
            end_run_as(tracking_uri, run_id, status)
    except Exception as e:  # noqa: BLE001 - see above: logged, and the first error goes on
        log.warning("could not leave MLflow run %s in %s as it was: %s", run_id, tracking_uri, e)
