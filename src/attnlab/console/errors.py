"""How a Hydra app ends on an error: a :class:`~attnlab.errors.UserError` as its message alone.

Every Hydra app in ``src/`` puts :func:`user_errors` under ``@hydra.main``::

    @hydra.main(version_base="1.3", config_path="../conf", config_name="config")
    @user_errors("train")
    def main(cfg): ...

An error the project raises on purpose (a :class:`~attnlab.errors.UserError`: its message says
what was wrong and what to do) then ends the app with ``train: <message>`` on stderr and exit
status 1, and its traceback goes to the run's Hydra log file
(``outputs/<date>/<time>/<app>.log``) only. ``HYDRA_FULL_ERROR=1`` shows the traceback instead,
as Hydra does for every error. Any other exception is a bug: Hydra prints its traceback.

* In a DDP process other than rank 0 (Lightning starts them as copies of the command, the log
  file ``<app>_ddp_process_<rank>.log``) the line says its rank: ``train: rank 1: <message>``.
* A full disk (or quota) that a library meets on its own (MLflow writing ``mlflow.db`` or
  ``mlruns/``: SQLite's "database or disk is full", an ``OSError`` ENOSPC, EDQUOT or EFBIG
  anywhere in the exception's chain) ends the app with one line that says so, like a user's
  error: nothing the project writes itself is left half-written (:mod:`attnlab.files`), and
  SQLite rolls back what it had not committed.
* Ctrl-C (SIGINT) ends the app with one line, ``train: stopped by Ctrl-C …``, and exit status
  130 (128 + SIGINT, as a shell reports a program Ctrl-C stopped), not a
  ``KeyboardInterrupt`` traceback. Every file the project writes goes through
  :mod:`attnlab.files`, so what was being written is left as it was.
* In a multirun (``-m``) the failed job is recorded as Hydra records any failed job (the other
  jobs still run, the sweep's MLflow parent run is tagged), and the sweep ends with the message
  of the first failed job, without a traceback.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from hydra.errors import CompactHydraException

from attnlab.errors import UserError
from attnlab.files import NO_ROOM

F = TypeVar("F", bound=Callable)
INTERRUPTED_STATUS = 130  # 128 + SIGINT: what a shell reports for a program Ctrl-C stopped
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"  # Hydra's own switch: "1" shows every traceback in full
# The variables DDP launchers set, in the order Lightning reads them for the global rank.
RANK_ENV = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


class JobError(CompactHydraException):
    """A :class:`~attnlab.errors.UserError` that ended one job of a multirun (its ``__cause__``).
    Hydra prints a compact exception's message without a traceback."""


def process_rank() -> int:
    """This process's global rank, from the variables DDP launchers set (:data:`RANK_ENV`, as
    Lightning reads them); 0 when none is set (a single process, or rank 0 before it starts the
    others)."""
    for key in RANK_ENV:
        if os.environ.get(key) is not None:
            return int(os.environ[key])
    return 0


def full_errors() -> bool:
    """``HYDRA_FULL_ERROR=1``: show tracebacks in full, a user's errors too."""
    return os.environ.get(FULL_ERROR_ENV) == "1"


def _multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def log_traceback(message: str) -> list[str]:
    """Write ``message`` and the exception being handled, with its traceback, to the log files
    of the root logger's handlers (Hydra's ``<app>.log``), and to no console.

    Returns:
        the paths of the files written to (none when logging has no file).
    """
    record = logging.LogRecord(__name__, logging.ERROR, __file__, 0, message, None, sys.exc_info())
    written = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
            handler.flush()
            written.append(handler.baseFilename)
    return written


_SQLITE_FULL = "database or disk is full"  # SQLITE_FULL's message
# SQLITE_IOERR's: a write the OS refused for another reason than a full disk (a file-size
# limit, EFBIG; a quota on some filesystems; a failing disk), which SQLite does not tell apart
_SQLITE_IO = "disk i/o error"


def disk_full(error: BaseException) -> str | None:
    """What ``error`` says of a full disk, if anything in its chain (``__cause__``,
    ``__context__``, SQLAlchemy's ``orig``) is one: ``"the disk is full (No space left on
    device: …)"``; SQLite's "disk I/O error" too (its word for a write the OS refused, a file
    size limit say); None otherwise."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            where = f": {e.filename}" if e.filename else ""
            return f"{NO_ROOM[e.errno]} ({e.strerror}{where})"
        if _SQLITE_FULL in str(e).lower():
            return f"the disk is full (SQLite: {_SQLITE_FULL})"
        if _SQLITE_IO in str(e).lower():
            return (
                "the disk refused a write (SQLite: disk I/O error: the disk is full, a file "
                "is over its size limit, or the disk failed)"
            )
        todo += [e.__cause__, e.__context__, getattr(e, "orig", None)]
    return None


def _end(message: str, error: BaseException) -> None:
    """End the app on ``error`` with ``message`` (called inside its ``except``): the traceback
    to the log; then the error itself (``HYDRA_FULL_ERROR=1``), a :class:`JobError` (multirun)
    or ``SystemExit(message)``."""
    log_traceback(message)
    if full_errors():
        raise error
    if _multirun():
        raise JobError(message) from error
    raise SystemExit(message) from None


def user_errors(stage: str) -> Callable[[F], F]:
    """Decorate a Hydra app's task function (under ``@hydra.main``): a
    :class:`~attnlab.errors.UserError` it raises ends the app with ``<stage>: <message>`` (see
    the module's text).

    Args:
        stage: the name the line starts with (``train``, ``tokenize``, ...).
    Raises:
        SystemExit: status 1, the message (a single run); status 130 and one line after
            Ctrl-C (a multirun too: Ctrl-C stops the whole sweep).
        JobError: from the user error, in a multirun.
        UserError: the error itself, with ``HYDRA_FULL_ERROR=1``.
    """

    def decorate(main: F) -> F:
        @functools.wraps(main)  # Hydra unwraps __wrapped__ to find the app's file and name
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except UserError as e:
                rank = process_rank()
                message = f"{stage}: {e}" if rank == 0 else f"{stage}: rank {rank}: {e}"
                if (full := disk_full(e)) is not None and full not in message:
                    message += f" (the cause: {full})"  # a wrapped store error, say
                _end(message, e)
            except Exception as e:
                full = disk_full(e)
                if full is None:
                    raise  # a bug: Hydra prints its traceback
                _end(
                    f"{stage}: {full}; what was being written is as it was. Free space on that "
                    "disk (`df -h .`), then run the same command (or `dvc repro`) again",
                    e,
                )
            except KeyboardInterrupt:
                log_traceback(f"{stage}: stopped by Ctrl-C (SIGINT)")
                if full_errors():
                    raise
                print(
                    f"{stage}: stopped by Ctrl-C before it finished; every file it was writing is "
                    "as it was. Run the same command (or `dvc repro`) again to finish",
                    file=sys.stderr,
                    flush=True,
                )
                raise SystemExit(INTERRUPTED_STATUS) from None

        return run  # type: ignore[return-value]

    return decorate
