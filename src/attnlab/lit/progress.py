"""Lightning callbacks of the console output (:mod:`attnlab.console`): a line per epoch, the bars.

:func:`console_callbacks` picks among them. They live here, not in the :mod:`attnlab.console`
package, because importing Lightning takes seconds and the stages that never train
(download, tokenize) use the console too.
"""

from __future__ import annotations

import math
import time

from pytorch_lightning.callbacks import Callback, ModelSummary, ProgressBar, RichProgressBar, TQDMProgressBar
from pytorch_lightning.callbacks.progress.rich_progress import _RICH_AVAILABLE
from pytorch_lightning.utilities.model_summary import get_human_readable_count

from attnlab.console.epoch_table import EPOCH_COLUMNS, VAL_KEYS, as_float, counted
from attnlab.console.logs import is_terminal, quiet


class EpochLines(Callback):
    """Prints one line per finished training epoch to stdout (global rank 0), e.g.::

        epoch 2/10  train_loss 4.1234  val_loss 3.9876  val_bleu 12.34  tokens/s 51234  (41.2 s)

    The numbers are the epoch's values as logged to MLflow (formats in
    :data:`attnlab.console.epoch_table.EPOCH_COLUMNS`; val_* only for an epoch that ran validation).
    An epoch's line is printed once its ``tokens_per_sec`` exists, i.e. at the next epoch's
    start or at the end of training; the seconds are wall time from the epoch's start to its end,
    validation included. A first line gives the parameter count, steps per epoch, device.

    Args:
        name: the model's name, which starts the first line.
    """

    def __init__(self, name: str):
        self.name = name
        self._ended: tuple[int, float] | None = None
        self._val: dict[str, float] = {}
        self._start = time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()
        if not trainer.is_global_zero:
            return
        n = sum(p.numel() for p in pl_module.parameters())
        params = f"{get_human_readable_count(n).replace(' ', '')} parameter{'' if n == 1 else 's'}"
        device = trainer.strategy.root_device.type
        if trainer.world_size > 1:
            device = f"{trainer.world_size} x {device}"
        steps = trainer.num_training_batches
        steps = counted(steps, "step") if math.isfinite(steps) else "? steps"
        epochs = "" if trainer.max_epochs in (None, -1) else f", max_epochs {trainer.max_epochs}"
        resumed = f", resuming in epoch {trainer.current_epoch + 1}" if trainer.global_step else ""
        print(f"{self.name}: {params} on {device}, {steps} per epoch{epochs}{resumed}", flush=True)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._flush(trainer)
        self._start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        self._val = {k: as_float(metrics[k]) for k in VAL_KEYS if k in metrics}

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # Runs before LightningModule.on_train_epoch_end logs tokens_per_sec: print later.
        self._ended = (trainer.current_epoch, time.perf_counter() - self._start)

    def on_train_end(self, trainer, pl_module) -> None:
        self._flush(trainer)

    def _flush(self, trainer) -> None:
        if self._ended is None:
            return
        epoch, seconds = self._ended
        logged = trainer.logged_metrics
        values = {k: as_float(logged[k]) for k, _, _ in EPOCH_COLUMNS if k in logged and k not in VAL_KEYS}
        values.update(self._val)
        self._ended, self._val = None, {}
        if not trainer.is_global_zero:
            return
        of = "" if trainer.max_epochs in (None, -1) else f"/{trainer.max_epochs}"
        cells = [f"{label} {values[k]:{fmt}}" for k, label, fmt in EPOCH_COLUMNS if k in values]
        print("  ".join([f"epoch {epoch + 1}{of}", *cells, f"({seconds:.1f} s)"]), flush=True)


class RichBar(RichProgressBar):
    """Lightning's Rich progress bar without ``v_num`` (a few characters of the MLflow run
    id, which the summary prints whole)."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


class TqdmBar(TQDMProgressBar):
    """Lightning's tqdm progress bar (where ``rich`` is not installed) without ``v_num``."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


class NoBar(ProgressBar):
    """Takes the place of Lightning's default progress bar and draws nothing."""

    def disable(self) -> None:
        pass

    def enable(self) -> None:
        pass


def console_callbacks(name: str, progress_bar: bool = True) -> list:
    """The callbacks for ``train.py``'s Trainer that make the console output described in
    :mod:`attnlab.console` (``conf/callbacks/default.yaml`` names this function).

    On a terminal with ``progress_bar`` true: Lightning's bar (Rich where installed; it shows
    ``loss`` and ``tokens/s``). Otherwise ``EpochLines``, plus a bar that draws nothing where
    Lightning would add its own. Under ``dvc repro`` (:func:`attnlab.console.logs.quiet`) also
    ``ModelSummary(max_depth=0)``: no model summary table. The classes are those of this module.

    Args:
        name: the model's name (``model.name``), which each epoch line starts with.
        progress_bar: ``trainer.enable_progress_bar``.
    """
    out = []
    if progress_bar and is_terminal():
        out.append(RichBar() if _RICH_AVAILABLE else TqdmBar())
    else:
        out.append(EpochLines(name))
        if progress_bar:
            out.append(NoBar())
    if quiet():
        out.append(ModelSummary(max_depth=0))
    return out
