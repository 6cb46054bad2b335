"""The console's log settings: what a stage hides from its logs, warnings and stderr.

:func:`setup` (called first by every Hydra app in ``src/``) hides the known noise, and more
under ``dvc repro``; :func:`hide_mlflow_prints` drops MLflow's registry prints. What is
hidden, and when, is described in :mod:`attnlab.console`. ``ATTNLAB_VERBOSE=1``
(:func:`verbose`) hides nothing.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress

VERBOSE_ENV = "ATTNLAB_VERBOSE"
DVC_STAGE_ENV = "DVC_STAGE"

# Warnings that say nothing about a run of this project (regular expressions matched at the
# start of the message, as `warnings.filterwarnings` does).
NOISE_WARNINGS = (
    r".*does not have many workers",  # our loaders batch in the main process by design
    r".*is smaller than the logging interval",  # log_every_n_steps vs. a short epoch
    r".*isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning vs. this torch version
    # one per CJK character of a heatmap: the boxes are a known limit (docs/how-to/own-corpus.md)
    r"Glyph \d+ .*missing from font",
)
# Log lines of Lightning and MLflow that are noise for every run (regular expressions searched
# in the formatted message).
NOISE_LINES = (
    r"Tip: For seamless cloud",
    r"^Experiment with name .* not found\. Creating it\.",
    r"^`Trainer\(val_check_interval=1\.0\)` was configured so validation will run at the end",
)
# Shown outside `dvc repro` only: the overwrite is by design (checkpoints/ is a persistent out).
QUIET_WARNINGS = (r"Checkpoint directory .* exists and is not empty",)
# Console lines hidden under `dvc repro` (still in the Hydra log file): (logger, message template).
# The averaging line repeats the summary's "kept" row.
QUIET_LINES = (
    ("attnlab.lit.checkpoints", "rank %d: checkpoint %s (exists: %s)"),
    ("attnlab.lit.checkpoints", "kept checkpoint: the mean of the weights after epochs %s"),
)
# MLflow's own prints (not logging) around model registration.
MLFLOW_PRINTS = (
    r"^Successfully registered model ",
    r"^Registered model .* already exists",
    r"^Created version '",
)
_LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric")


def verbose() -> bool:
    """``$ATTNLAB_VERBOSE`` is set to anything but ``""``/``0``/``false``/``no``: hide nothing."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def quiet() -> bool:
    """Running as a ``dvc repro`` stage (``$DVC_STAGE`` set) and not :func:`verbose`."""
    return bool(os.environ.get(DVC_STAGE_ENV)) and not verbose()


def is_terminal() -> bool:
    """stdout is a terminal (where Lightning draws its progress bar)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


class _DropLines(logging.Filter):
    """Drops records whose message matches one of ``patterns`` or whose (logger, template)
    is one of ``templates``."""

    def __init__(self, patterns: Iterable[str] = (), templates: Iterable[tuple[str, str]] = ()):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]
        self.templates = set(templates)

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.name, str(record.msg)) in self.templates:
            return False
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: let its handler report it
            return True
        return not any(p.search(message) for p in self.patterns)


class _QuietLoggers(logging.Filter):
    """Drops records below WARNING from the loggers ``names`` (and their children). Their own
    level is not enough: importing Lightning sets its logger back to INFO, and evaluate imports it
    after :func:`setup` (to choose the device)."""

    def __init__(self, names: Iterable[str]):
        super().__init__()
        self.names = tuple(names)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not any(
            record.name == n or record.name.startswith(n + ".") for n in self.names
        )


class _FullDiskToLogFile(logging.Filter):
    """Keeps a library's error record of a full disk, traceback and all, off the console (MLflow
    logs each SQLite error it then re-raises); it goes to the log files of the root logger's
    handlers (Hydra's ``<app>.log``) instead. The app's own line says the disk is full
    (:func:`attnlab.console.errors.user_errors`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from attnlab.console.errors import disk_full

        error = record.exc_info[1] if record.exc_info else None
        if error is None or disk_full(error) is None:
            return True
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.FileHandler):
                h.handle(record)
        return False


def _handlers(console_only: bool) -> list[logging.Handler]:
    found = []
    for name in ("", *_LIGHTNING_LOGGERS):  # root (Hydra's handlers) and Lightning's own
        for h in logging.getLogger(name).handlers:
            if console_only and isinstance(h, logging.FileHandler):
                continue
            if h not in found:
                found.append(h)
    return found


def setup(mlflow: bool = True) -> None:
    """Console settings for a stage; call it first in ``main()`` (after Hydra set up logging).

    Makes stdout line-buffered (so a log file keeps stdout and stderr lines in order); unless
    :func:`verbose`, hides the known noise (:mod:`attnlab.console`) and, under ``dvc repro``
    (:func:`quiet`), Lightning's INFO lines. Idempotent.

    Args:
        mlflow: the stage uses MLflow: set ``MLFLOW_LOGGING_LEVEL=WARNING`` and
            ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false`` in this process's environment
            (only where unset, so a user's own values win), which MLflow and the processes
            this one starts (DDP ranks) read; and send the tracebacks MLflow's loggers print of
            a full disk to the log file only (the stage's own line says the disk is full).
    """
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            with suppress(ValueError, OSError):  # a stream that cannot (closed, detached)
                stream.reconfigure(line_buffering=True)
    if verbose():
        return
    for pattern in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    if mlflow:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        import mlflow as _  # noqa: F401 - MLflow's logger and its handlers exist from here on

        mlflow_logger = logging.getLogger("mlflow")
        # MLflow reads MLFLOW_LOGGING_LEVEL at import, which may have come before this call
        mlflow_logger.setLevel(os.environ["MLFLOW_LOGGING_LEVEL"].upper())
        for h in mlflow_logger.handlers:
            if not any(isinstance(f, _FullDiskToLogFile) for f in h.filters):
                h.addFilter(_FullDiskToLogFile())
    noise = _DropLines(NOISE_LINES)
    for h in _handlers(console_only=False):
        if not any(isinstance(f, _DropLines) and f.patterns == noise.patterns for f in h.filters):
            h.addFilter(noise)
    if not quiet():
        return
    for pattern in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in _LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    hide = _DropLines(templates=QUIET_LINES)
    for h in _handlers(console_only=True):
        if not any(isinstance(f, _DropLines) and f.templates == hide.templates for f in h.filters):
            h.addFilter(hide)
        if not any(isinstance(f, _QuietLoggers) for f in h.filters):
            h.addFilter(_QuietLoggers(_LIGHTNING_LOGGERS))


@contextmanager
def hide_mlflow_prints() -> Iterator[None]:
    """Drop MLflow's registry prints (:data:`MLFLOW_PRINTS`: "Successfully registered model",
    "Created version ...") from stderr inside the block; every other line passes, in order,
    when it is complete. Nothing is hidden when :func:`verbose`."""
    if verbose():
        yield
        return
    real = sys.stderr
    filtered = _LineFilter(real, [re.compile(p) for p in MLFLOW_PRINTS])
    sys.stderr = filtered
    try:
        yield
    finally:
        sys.stderr = real
        filtered.close()


class _LineFilter:
    """A write-only text stream: complete lines not matching ``patterns`` go to ``target``."""

    def __init__(self, target, patterns: list[re.Pattern]):
        self.target, self.patterns, self._partial = target, patterns, ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if not any(p.search(line) for p in self.patterns):
                self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def close(self) -> None:
        if self._partial and not any(p.search(self._partial) for p in self.patterns):
            self.target.write(self._partial)
        self._partial = ""
        self.target.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):  # encoding, fileno, ...: the real stream's
        return getattr(self.target, name)
