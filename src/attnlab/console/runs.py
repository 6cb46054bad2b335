"""What the stage summaries read from MLflow: the kept checkpoint's epoch, and where to look at a run.

Used by :mod:`attnlab.console.summaries`. MLflow is imported only when a client is made
(:func:`mlflow_client`), so the stages that never use MLflow are spared its import.
"""

from __future__ import annotations

from attnlab.console.epoch_table import VAL_KEYS


def mlflow_links(tracking_uri: str, experiment_id: str | None, run_id: str) -> list[tuple[str, str]]:
    """Where to look at a run: for a SQLite store the ``mlflow ui`` command and the run's page
    on its default address; for an ``http(s)://`` tracking server the run's page there."""
    page = f"#/experiments/{experiment_id}/runs/{run_id}" if experiment_id is not None else None
    if tracking_uri.startswith("sqlite:"):
        return [
            ("browse", f"mlflow ui --backend-store-uri {tracking_uri}"),
            *([("run page", f"http://127.0.0.1:5000/{page}")] if page else []),
        ]
    if tracking_uri.startswith(("http://", "https://")):
        base = tracking_uri.rstrip("/")
        return [("run page", f"{base}/{page}" if page else base)]
    return []


def mlflow_client(tracking_uri: str):
    """An :class:`mlflow.tracking.MlflowClient` for ``tracking_uri``."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def best_epoch(client, run_id: str, monitor: str | None, mode: str = "min") -> dict | None:
    """The epoch of a run's kept checkpoint, from its MLflow history: the first epoch with the
    lowest (``mode="min"``) or highest ``monitor`` value, or the last logged epoch when
    ``monitor`` is ``None`` or never logged.

    Returns:
        ``{"epoch": 1-based epoch, "by": monitor or None, "val_loss": ..., "val_bleu": ...}``
        (the val_* logged at that epoch's step), or ``None`` if the run has no epoch history.
    """

    def by_step(key):
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    epochs = by_step("epoch")
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, monitor)) if monitor else []
    if history:
        pick = (min if mode == "min" else max)(history, key=lambda sv: sv[1])  # first of equals
        step = pick[0]
    elif epochs:
        step, monitor = max(epochs), None
    else:
        return None
    out = {"epoch": int(epochs.get(step, 0)) + 1, "by": monitor}
    for key in VAL_KEYS:
        values = by_step(key)
        if step in values:
            out[key] = values[step]
    return out
