"""A callback that records the first training batch of a process and the loss computed on it.

Added to a real ``src/train.py`` run as a config callback (``tests/`` on ``PYTHONPATH``)::

    +callbacks.first_step={_target_: helpers.first_step.FirstStepLoss, folder: /tmp/x}

Each process that trains writes one file, ``<folder>/<n>.pt`` (n = 0, 1, … in the order the
processes ran: a killed run, then its resumed run): the batch (CPU tensors), the loss that
``training_step`` returned for it (computed before the optimizer step, so with the weights
the process started from) and the global step after that update.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch


class FirstStepLoss(pl.Callback):
    def __init__(self, folder: str):
        self.folder, self.done = Path(folder), False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.done:
            return
        self.done = True
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {
            "batch": {k: v.detach().cpu() for k, v in batch.items()},
            "loss": float(outputs["loss"]),
            "global_step": trainer.global_step,
        }
        torch.save(record, self.folder / f"{len(list(self.folder.glob('*.pt')))}.pt")


def records(folder: Path) -> list[dict]:
    """The records of ``folder``, in the order the processes wrote them."""
    files = sorted(Path(folder).glob("*.pt"), key=lambda p: int(p.stem))
    return [torch.load(f, weights_only=True) for f in files]
