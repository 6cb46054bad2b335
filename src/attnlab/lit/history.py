"""Per-epoch metrics as one CSV row per epoch, the file `dvc plots` draws the training curves from."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pytorch_lightning.loggers.logger import Logger, rank_zero_experiment
from pytorch_lightning.utilities import rank_zero_only

from attnlab.files import write_text_atomic

# Columns first in this order; any other epoch-level metric follows, sorted.
LEADING = ("epoch", "step", "train_loss", "val_loss", "val_bleu", "val_chrf", "tokens_per_sec")


class EpochHistoryLogger(Logger):
    """A Lightning logger that keeps the epoch-level metrics, one row per epoch, in a CSV file.

    Lightning logs an epoch's validation metrics and its training metrics in separate calls,
    each carrying ``epoch`` (0-based); this logger merges them into one row whose ``epoch``
    column is 1-based (``epoch`` 1 = after the first pass over the data) and whose ``step`` is
    the optimizer step of the epoch's last log call (MLflow's step for the same values).
    (Lightning adds ``epoch`` to step-level metrics too: a metric logged per step would hold
    its epoch's last value; attnlab logs per epoch only.) The file is rewritten whole
    (temp file, then rename) after every call, so it is never half-written.

    Args:
        path: the CSV file (e.g. ``plots/transformer/history.csv``).
        resume: keep the rows already in ``path`` (a run resumed from a checkpoint: the epochs
            before the kill); an epoch the resumed run logs again replaces its row. Otherwise
            the file starts empty.
    """

    def __init__(self, path: Path, resume: bool = False):
        super().__init__()
        self.path = Path(path)
        self.rows: dict[int, dict[str, float]] = {}
        if resume and self.path.exists():
            for row in csv.DictReader(io.StringIO(self.path.read_text(encoding="utf-8"))):
                self.rows[int(row["epoch"])] = {k: float(v) for k, v in row.items() if v != ""}

    @property
    def name(self) -> str:
        return "epoch_history"

    @property
    def version(self) -> str:
        return "0"

    @property
    @rank_zero_experiment
    def experiment(self) -> None:
        return None

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "epoch" not in metrics:
            return
        epoch = int(metrics["epoch"]) + 1
        row = self.rows.setdefault(epoch, {"epoch": epoch})
        row.update({k: float(v) for k, v in metrics.items() if k != "epoch"})
        if step is not None:
            row["step"] = step
        self._write()

    def _write(self) -> None:
        keys = {k for row in self.rows.values() for k in row}
        columns = [k for k in LEADING if k in keys] + sorted(keys - set(LEADING))
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, lineterminator="\n")
        writer.writeheader()
        for epoch in sorted(self.rows):
            writer.writerow(
                {k: int(v) if k in ("epoch", "step") else repr(float(v)) for k, v in self.rows[epoch].items()}
            )
        write_text_atomic(self.path, out.getvalue())
