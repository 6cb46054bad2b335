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
from pathlib import Path


def read_run_record(path: Path, model: str) -> dict:
    """The ``runs/<model>.json`` written by training: run id, tracking URI, checkpoint path.

    Raises:
        FileNotFoundError: if ``model`` was not trained yet (names the command to run).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: train first with "
                                f"`python src/train.py model={model}` or `dvc repro train@{model}`")
    return json.loads(path.read_text())


def log_to_run(run_id: str, uri: str, metrics: dict | None = None,
               artifacts: list[tuple[Path, str]] | None = None) -> None:
    """Add metrics and (file, artifact dir) pairs to an existing MLflow run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for k, v in (metrics or {}).items():
        client.log_metric(run_id, k, float(v))
    for path, artifact_dir in artifacts or []:
        client.log_artifact(run_id, str(path), artifact_dir)
