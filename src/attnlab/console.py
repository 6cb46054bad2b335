"""What the stages print: quiet logs, a line per epoch when no bar is drawn, a summary at the end.

Every Hydra app in ``src/`` calls :func:`setup` first. Then:

* **Known noise is hidden** (unless ``ATTNLAB_VERBOSE=1``): Lightning's tips, its
  "Experiment ... not found. Creating it." and val_check_interval notices, MLflow's INFO lines
  (database creation, alembic, model signatures; through ``MLFLOW_LOGGING_LEVEL=WARNING``),
  MLflow's artifact download bars, and the warnings listed in :data:`NOISE_WARNINGS`.
* **Under** ``dvc repro`` (DVC sets ``DVC_STAGE`` for every stage command) the run is quiet too:
  Lightning's INFO banners (GPU/TPU available, seed, "fit stopped", restoring checkpoints),
  its model summary table and the per-rank checkpoint log line are hidden (the last stays in
  the Hydra log file). Warnings and errors always show, and so do the INFO lines of attnlab's
  own loggers (``train``'s resume notices, for one).
* **Progress**: on a terminal, Lightning's progress bar, with the step's ``loss`` and the epoch's
  running ``tokens/s`` (``attnlab.lit.translation``). When stdout is not a terminal (a log
  file, CI, ``dvc repro > log``) or the bar is off (``trainer.enable_progress_bar=false``),
  :class:`attnlab.lit.progress.EpochLines` prints one line per epoch instead, no
  carriage-return bar.
* **A summary** ends every stage: ``*_summary`` below, at most about 15 ASCII lines in a
  ``key : value`` layout.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

VERBOSE_ENV = "ATTNLAB_VERBOSE"
DVC_STAGE_ENV = "DVC_STAGE"

# Warnings that say nothing about a run of this project (regular expressions matched at the
# start of the message, as `warnings.filterwarnings` does).
NOISE_WARNINGS = (
    r".*does not have many workers",             # our loaders batch in the main process by design
    r".*is smaller than the logging interval",   # log_every_n_steps vs. a short epoch
    r".*isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning vs. this torch version
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
QUIET_LINES = (("train", "rank %d: checkpoint %s (exists: %s)"),)
# MLflow's own prints (not logging) around model registration.
MLFLOW_PRINTS = (r"^Successfully registered model ", r"^Registered model .* already exists",
                 r"^Created version '")
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
    :func:`verbose`, hides the known noise (module docstring) and, under ``dvc repro``
    (:func:`quiet`), Lightning's INFO lines. Idempotent.

    Args:
        mlflow: the stage uses MLflow: set ``MLFLOW_LOGGING_LEVEL=WARNING`` and
            ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false`` in this process's environment
            (only where unset, so a user's own values win), which MLflow and the processes
            this one starts (DDP ranks) read.
    """
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(line_buffering=True)
            except (ValueError, OSError):  # a stream that cannot (closed, detached)
                pass
    if verbose():
        return
    for pattern in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    if mlflow:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        if "mlflow" in sys.modules:  # imported already: MLflow read MLFLOW_LOGGING_LEVEL at import
            logging.getLogger("mlflow").setLevel(os.environ["MLFLOW_LOGGING_LEVEL"].upper())
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


# --- training progress --------------------------------------------------------------------
# The callbacks are in attnlab.lit.progress: they subclass Lightning's classes, and importing
# Lightning takes seconds, which the stages that never train (download, tokenize) are spared.

# (logged metric, label, format): the numbers of an epoch line, as MLflow has them.
EPOCH_COLUMNS = (("train_loss", "train_loss", ".4f"), ("val_loss", "val_loss", ".4f"),
                 ("val_bleu", "val_bleu", ".2f"), ("val_chrf", "val_chrf", ".2f"),
                 ("tokens_per_sec", "tokens/s", ".0f"))
_VAL_KEYS = ("val_loss", "val_bleu", "val_chrf")


def _scalar(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


def train_callbacks(cfg) -> list:
    """The callbacks for ``train.py``'s Trainer that make the console output described above.

    On a terminal with ``trainer.enable_progress_bar`` true: Lightning's bar (Rich where
    installed; it shows ``loss`` and ``tokens/s``). Otherwise ``EpochLines``, plus a bar that
    draws nothing where Lightning would add its own. Under ``dvc repro`` (:func:`quiet`) also
    ``ModelSummary(max_depth=0)``: no model summary table. The classes are those of
    :mod:`attnlab.lit.progress`.

    Args:
        cfg: the composed config (``trainer.enable_progress_bar``, ``model.name``).
    """
    from pytorch_lightning.callbacks import ModelSummary
    from pytorch_lightning.callbacks.progress.rich_progress import _RICH_AVAILABLE

    from attnlab.lit.progress import EpochLines, NoBar, RichBar, TqdmBar

    out = []
    bar = bool(cfg.trainer.get("enable_progress_bar", True))
    if bar and is_terminal():
        out.append(RichBar() if _RICH_AVAILABLE else TqdmBar())
    else:
        out.append(EpochLines(cfg.model.name))
        if bar:
            out.append(NoBar())
    if quiet():
        out.append(ModelSummary(max_depth=0))
    return out


# --- summaries ----------------------------------------------------------------------------

def block(title: str, rows: Iterable[tuple[str, object]], notes: Iterable[str] = ()) -> str:
    """``title`` then one ``  key : value`` line per row (keys padded to one width), then
    ``notes`` unindented. Rows whose value is ``None`` are left out."""
    rows = [(k, str(v)) for k, v in rows if v is not None]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([title, *(f"  {k:<{width}} : {v}" for k, v in rows), *notes])


def mlflow_links(tracking_uri: str, experiment_id: str | None, run_id: str) -> list[tuple[str, str]]:
    """Where to look at a run: for a SQLite store the ``mlflow ui`` command and the run's page
    on its default address; for an ``http(s)://`` tracking server the run's page there."""
    page = f"#/experiments/{experiment_id}/runs/{run_id}" if experiment_id is not None else None
    if tracking_uri.startswith("sqlite:"):
        return [("browse", f"mlflow ui --backend-store-uri {tracking_uri}"),
                *([("run page", f"http://127.0.0.1:5000/{page}")] if page else [])]
    if tracking_uri.startswith(("http://", "https://")):
        base = tracking_uri.rstrip("/")
        return [("run page", f"{base}/{page}" if page else base)]
    return []


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _brief(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


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
    for key in _VAL_KEYS:
        values = by_step(key)
        if step in values:
            out[key] = values[step]
    return out


def _val_rows(values: dict) -> list[tuple[str, str]]:
    fmt = dict((k, f) for k, _, f in EPOCH_COLUMNS)
    return [(k, f"{values[k]:{fmt[k]}}") for k in _VAL_KEYS if k in values]


def train_summary(cfg, trainer, logger, checkpoint: str | Path, averaged: Iterable[int] = ()) -> str:
    """The end-of-training summary: the kept checkpoint's epoch and val metrics, where it is,
    the MLflow run (id, name, artifact location) and how to open it.

    Args:
        cfg: the composed config (``model.name``, ``checkpoint.monitor``/``mode``,
            ``mlflow.tracking_uri``).
        trainer: the Trainer after ``fit`` (epochs and steps done; last metrics if offline).
        logger: the run's :class:`attnlab.lit.logger.ResilientMLFlowLogger`. When its
            ``offline_reason`` is set MLflow is not queried: the values are the last epoch's.
        checkpoint: the kept checkpoint file.
        averaged: the epochs (1-based) whose weights the kept checkpoint averages
            (``checkpoint.average_last``); empty: it is the best (or last) epoch's.
    Returns:
        At most ~12 ASCII lines (no trailing newline). Never raises for MLflow trouble: a
        failed read becomes a note line.
    """
    name, uri, run_id = cfg.model.name, cfg.mlflow.tracking_uri, logger.run_id
    title = f"{name}: trained {_count(trainer.current_epoch, 'epoch')} ({trainer.global_step} steps)"
    rows: list[tuple[str, object]] = []
    notes: list[str] = []
    run = None
    averaged = list(averaged)
    if averaged:
        span = f"epochs {averaged[0]}-{averaged[-1]}" if len(averaged) > 1 else f"epoch {averaged[0]}"
        rows.append(("kept", f"mean of the weights after {span} "
                             f"(checkpoint.average_last={cfg.checkpoint.average_last})"))
        try:
            run = _client(uri).get_run(run_id) if logger.offline_reason is None else None
        except Exception as e:  # noqa: BLE001 - a summary must not fail a finished run
            notes.append(f"{name}: could not read the run back from MLflow ({_brief(e)})")
    elif logger.offline_reason is None:
        try:
            client = _client(uri)
            run = client.get_run(run_id)
            best = best_epoch(client, run_id, cfg.checkpoint.monitor, cfg.checkpoint.mode)
        except Exception as e:  # noqa: BLE001 - a summary must not fail a finished run
            best = None
            notes.append(f"{name}: could not read the run back from MLflow ({_brief(e)})")
        if best is not None:
            how = (f"{'lowest' if cfg.checkpoint.mode == 'min' else 'highest'} {best['by']}"
                   if best["by"] else "last epoch")
            rows.append(("best epoch", f"{best['epoch']} of {trainer.current_epoch} ({how})"))
            rows += _val_rows(best)
    else:
        last = {k: _scalar(v) for k, v in trainer.callback_metrics.items() if k in _VAL_KEYS}
        rows.append(("last epoch", f"{trainer.current_epoch} (MLflow offline: best epoch unknown)"))
        rows += _val_rows(last)
    rows.append(("checkpoint", checkpoint))
    rows.append(("MLflow run", f"{run_id} ({run.info.run_name})" if run else run_id))
    if run is not None:
        rows.append(("artifacts", run.info.artifact_uri))
    rows.append(("tracking", uri))
    rows += mlflow_links(uri, run.info.experiment_id if run else None, run_id)
    if logger.offline_reason:
        notes.append(f"{name}: MLflow tracking stopped during the run ({logger.offline_reason}); "
                     "metrics after that point were not logged")
    return block(title, rows, notes)


def _run_rows(record: dict, logged: Iterable[str] = ()) -> tuple[list[tuple[str, object]], list[str]]:
    """MLflow run id (+ what was logged) and its links, from a ``runs/<model>.json`` record."""
    uri, run_id = record["tracking_uri"], record["run_id"]
    what = f" (logged {', '.join(logged)})" if logged else ""
    try:
        experiment_id = _client(uri).get_run(run_id).info.experiment_id
    except Exception as e:  # noqa: BLE001
        return [("MLflow run", run_id + what)], [f"could not read run {run_id} from {uri} ({_brief(e)})"]
    return [("MLflow run", run_id + what), *mlflow_links(uri, experiment_id, run_id)], []


def evaluate_summary(name: str, scores: dict, metrics_path: Path, record: dict,
                     hypotheses: Path | None = None, logged: Iterable[str] = ()) -> str:
    """The end-of-evaluation summary.

    Args:
        name: model name.
        scores: what ``metrics/<model>.json`` holds: seq2seq ``bleu``, ``bleu_lc``, ``chrf``
            (sacreBLEU, 0-100) and ``num_sentences``; NW ``mse``, ``mse_nonparametric``,
            ``mse_average_pooling``, ``w``, ``mse_<kernel>``, ``kernel_width``.
        metrics_path: the metrics JSON file.
        record: the ``runs/<model>.json`` record (``run_id``, ``tracking_uri``).
        hypotheses: the translations file (seq2seq).
        logged: the MLflow metric names added to the run.
    """
    if "bleu" in scores:
        title = f"{name}: {scores.get('num_sentences', '?')} test sentences scored"
        rows = [("test_bleu", f"{scores['bleu']:.2f} (sacreBLEU, cased, 13a)"),
                ("bleu_lc", f"{scores['bleu_lc']:.2f}"), ("chrF", f"{scores['chrf']:.2f}")]
    else:
        title = f"{name}: test MSE"
        rows = [("test MSE", f"{scores['mse']:.4f} (learned w {scores['w']:.4f})"),
                ("non-parametric", f"{scores['mse_nonparametric']:.4f} (gaussian, w 1)"),
                ("average pooling", f"{scores['mse_average_pooling']:.4f}")]
        width = scores.get("kernel_width")
        rows += [(k[4:], f"{v:.4f} (width {width})") for k, v in scores.items()
                 if k.startswith("mse_") and k not in ("mse_nonparametric", "mse_average_pooling")]
    rows += [("metrics", metrics_path), ("hypotheses", hypotheses)]
    run_rows, notes = _run_rows(record, logged)
    return block(title, rows + run_rows, notes)


def export_summary(name: str, folder: Path, record: dict, registered: str | None = None,
                   version: int | str | None = None, serve: str | None = None) -> str:
    """The end-of-export summary: the folder, the registered MLflow model (name, the new
    version, which now has the alias ``champion``), the run it was logged to, and the
    commands that serve (``serve``, from :func:`attnlab.export.serve_command`) and use it."""
    rows = [("folder", folder),
            ("registered", f"{registered} version {version} (alias champion)" if registered else None)]
    run_rows, notes = _run_rows(record)
    rows += [r for r in run_rows if r[0] == "MLflow run"]
    rows += [("serve", serve),
             ("translate", f'python src/translate.py model={name} +text="A dog runs."' if registered else None)]
    return block(f"{name}: exported", rows, notes)


def tokenize_summary(corpus: str, out: Path, splits: dict[str, str], vocabulary: str) -> str:
    """The end-of-tokenize summary: output folder, vocabulary, pairs per split, stats file.

    Args:
        corpus: e.g. ``multi30k en-fr``.
        out: the tokenized folder.
        splits: split name -> its pair count as text, e.g. ``{"train": "40 of 46"}``.
        vocabulary: e.g. ``8000 pieces``.
    """
    rows = [("output", out), ("vocabulary", vocabulary),
            ("pairs", ", ".join(f"{k} {v}" for k, v in splits.items())),
            ("counts", out / "stats.json")]
    return block(f"tokenize: {corpus}", rows)


def download_summary(folder: Path, files: list[tuple[str, bool]], source: str) -> str:
    """The end-of-download summary.

    Args:
        folder: the raw-data folder.
        files: (path relative to ``folder``, fetched now) per file, every one checksum-verified.
        source: ``mirror <folder>`` or ``canonical URLs``.
    """
    fetched = [f for f, new in files if new]
    names = ", ".join(fetched[:3]) + (f", +{len(fetched) - 3} more" if len(fetched) > 3 else "")
    size = sum((Path(folder) / f).stat().st_size for f, _ in files)
    rows = [("folder", folder), ("source", source),
            ("fetched", f"{len(fetched)} ({names})" if fetched else "0 (all present and verified)"),
            ("size", f"{size / 1e6:.1f} MB")]
    return block(f"download: {len(files)} files, checksums verified", rows)
