"""The MLflow logger of ``train.py``: Lightning's, made to survive a lost tracking server."""

from __future__ import annotations

import logging

from pytorch_lightning.loggers import MLFlowLogger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

log = logging.getLogger(__name__)


class ResilientMLFlowLogger(MLFlowLogger):
    """Lightning's ``MLFlowLogger`` that outlives its tracking server.

    The first failed call (server gone, network down) is reported once as a
    warning and the logger goes offline: training goes on, later calls are
    skipped, and checkpoints stay on local disk. ``offline_reason`` says why
    (``None`` while online). How long one call waits before failing is MLflow's
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT``.
    """

    def __init__(
        self, *args, tracking_uri: str | None = None, artifact_location: str | None = None, **kwargs
    ):
        # A new experiment's artifacts: at artifact_location for a local SQLite store; a tracking
        # server ($MLFLOW_TRACKING_URI=http://…) chooses its own.
        local = tracking_uri is not None and tracking_uri.startswith("sqlite:")
        super().__init__(
            *args, tracking_uri=tracking_uri, artifact_location=artifact_location if local else None, **kwargs
        )
        self.offline_reason: str | None = None

    def _guard(self, what: str, fn, *args, **kwargs):
        if self.offline_reason is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - tracking must never stop training
            self.offline_reason = f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:600]}"
            log.warning(
                "MLflow tracking at %s failed (%s); training continues without tracking, "
                "checkpoints stay on local disk",
                self._tracking_uri,
                self.offline_reason,
            )
            return None

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        self._guard("log_hyperparams", super().log_hyperparams, params)

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        self._guard("log_metrics", super().log_metrics, metrics, step)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        self._guard("finalize", super().finalize, status)

    @rank_zero_only
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """``MlflowClient.log_artifacts`` into this run (skipped when offline)."""
        self._guard(
            "log_artifacts", lambda: self.experiment.log_artifacts(self.run_id, local_dir, artifact_path)
        )

    @rank_zero_only
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """``MlflowClient.log_artifact`` into this run (skipped when offline)."""
        self._guard(
            "log_artifact", lambda: self.experiment.log_artifact(self.run_id, local_path, artifact_path)
        )

    @rank_zero_only
    def log_text(self, text: str, artifact_file: str) -> None:
        """``MlflowClient.log_text`` into this run (skipped when offline)."""
        self._guard("log_text", lambda: self.experiment.log_text(self.run_id, text, artifact_file))
