"""What a stopped export leaves in the MLflow store: nothing PENDING.

``mlflow.pyfunc.log_model`` creates the run's logged model PENDING and marks it READY when it
is done, FAILED on an exception, but not on Ctrl-C or SIGTERM (or SIGKILL). The served-model
logging (:func:`attnlab.serving.registry.log_served_model`) therefore

* holds a first Ctrl-C or SIGTERM until the MLflow step under way ends (:class:`HeldStops`),
  so that no write to the store is cut in half (an interrupted SQLite transaction can keep the
  store locked for the cleanup), then stops there; a second one stops at once;
* after any failure or stop, finalizes what it logged FAILED (:func:`fail_logged_models`) and
  gives the training run back its status (:func:`end_run_as`);
* at its start, finalizes FAILED the PENDING models an earlier export of the run left (killed,
  or stopped twice), and says so.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

log = logging.getLogger(__name__)


def now_ms() -> int:
    """The time as MLflow stamps a logged model's creation: milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class HeldStops:
    """Ctrl-C (SIGINT) and SIGTERM in the main thread, held until a safe point, until
    :meth:`restore`.

    The first one is noted (and said on the log) and raised by the next :meth:`check`:
    ``KeyboardInterrupt``, or ``SystemExit(143)`` for SIGTERM (128 + 15, the status of a process
    SIGTERM ends; Python's default would end the process without its cleanup). A second one is
    raised at once. While :attr:`cleaning` they are ignored. Other threads cannot set signal
    handlers: there nothing changes.
    """

    def __init__(self, what: str):
        self.what, self.held, self.cleaning, self.old = what, None, False, {}
        if threading.current_thread() is threading.main_thread():
            self.old = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _raise(signum: int):
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _stop(self, signum, frame):
        if self.cleaning:
            return
        if self.held is not None:
            self._raise(signum)
        self.held = signum
        log.warning(
            "%s: stopping once the step under way ends, so that the MLflow store is left whole "
            "(%s again stops at once)",
            self.what,
            "Ctrl-C" if signum == signal.SIGINT else "SIGTERM",
        )

    def check(self) -> None:
        """Raise the stop held, if any (a safe point)."""
        if self.held is not None:
            self._raise(self.held)

    def restore(self) -> None:
        """Put the signal handlers back as they were."""
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        self.old = {}


def fail_logged_models(
    tracking_uri: str, run_id: str, since: int = 0, pending_only: bool = False
) -> list[str]:
    """Finalize FAILED the logged models of run ``run_id`` created at or after ``since`` (ms,
    :func:`now_ms`) that are not FAILED yet, or only the PENDING ones. The store is searched
    (not MLflow's memory of the last model logged, which a stop right after the model is
    created comes before).

    Returns:
        the ids of the models finalized.
    """
    import mlflow
    from mlflow.entities import LoggedModelStatus

    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.get_run(run_id).info.experiment_id
    query = f"source_run_id = '{run_id}' AND creation_timestamp >= {int(since)}"
    done = []
    for model in client.search_logged_models([experiment], filter_string=query):
        if model.status == LoggedModelStatus.PENDING or (
            not pending_only and model.status != LoggedModelStatus.FAILED
        ):
            client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
            done.append(model.model_id)
    return done


def end_run_as(tracking_uri: str, run_id: str, status: str) -> None:
    """End this process's active run, if any, and the run ``run_id`` if it is still RUNNING,
    as ``status``."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.end_run(status)
    client = mlflow.MlflowClient(tracking_uri)
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, status)
