"""MLflow store resolution and logging helpers.

The store URI comes from the config (``mlflow.tracking_uri`` in
``conf/config.yaml``): ``$MLFLOW_TRACKING_URI`` if set, else the SQLite file
``mlflow.db`` at the project root as an absolute ``sqlite:////…`` URI, so every
stage, Hydra run directory and DDP rank writes to the same store.
The training stage records its run id in ``runs/<model>.json`` so evaluate
and export add to the same run.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path



class TrackingServerError(ConnectionError):
    """The MLflow tracking server named by the tracking URI cannot be reached."""


@contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_tracking_server(uri: str, timeout_s: int = 10) -> None:
    """Fail fast when ``uri`` is an ``http(s)://`` MLflow server that does not answer.

    One request (``search_experiments``), no retries, ``timeout_s`` seconds. Local
    stores (``sqlite:``, ``file:``, paths) are not checked.

    Raises:
        TrackingServerError: the server is unreachable (names the URI and the fix).
    """
    if not uri.startswith(("http://", "https://")):
        return
    from mlflow.tracking import MlflowClient

    try:
        with _env(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=str(timeout_s)):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 - connection refused, timeout, HTTP error: all mean "not usable"
        reason = str(e).splitlines()[0][:600]
        raise TrackingServerError(
            f"MLflow tracking server {uri} is unreachable ({type(e).__name__}: {reason}). "
            "Start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or unset "
            "MLFLOW_TRACKING_URI to track in the project's mlflow.db") from None


def read_run_record(path: Path, model: str) -> dict:
    """The ``runs/<model>.json`` written by training: run id, tracking URI, checkpoint path.

    The checkpoint path is stored relative to the record's folder (the record travels
    with ``dvc push``/``dvc pull`` to other machines) and returned absolute.

    Raises:
        FileNotFoundError: if ``model`` was not trained yet (names the command to run).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: train first with "
                                f"`python src/train.py model={model}` or `dvc repro train@{model}`")
    record = json.loads(path.read_text())
    record["checkpoint"] = str((path.parent / record["checkpoint"]).resolve())
    return record


def write_run_record(path: Path, run_id: str, tracking_uri: str, experiment: str, checkpoint: Path) -> Path:
    """Write ``runs/<model>.json`` atomically (checkpoint stored relative to its folder)."""
    from attnlab.files import write_json_atomic

    path = Path(path)
    rel = os.path.relpath(Path(checkpoint).resolve(), path.parent.resolve())
    return write_json_atomic(path, {"run_id": run_id, "tracking_uri": tracking_uri,
                                    "experiment": experiment, "checkpoint": rel})


def log_to_run(run_id: str, uri: str, metrics: dict | None = None,
               artifacts: list[tuple[Path, str]] | None = None, tags: dict | None = None) -> None:
    """Add metrics, (file, artifact dir) pairs and tags (str → str) to an existing MLflow run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, str(v))
    for k, v in (metrics or {}).items():
        client.log_metric(run_id, k, float(v))
    for path, artifact_dir in artifacts or []:
        client.log_artifact(run_id, str(path), artifact_dir)
