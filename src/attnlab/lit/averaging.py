"""Checkpoint averaging: the mean of the weights at the end of the last N epochs.

Vaswani et al. 2017, section 6.1 ("a single model obtained by averaging the last 5
checkpoints"); fairseq's ``scripts/average_checkpoints.py --num-epoch-checkpoints N``
does the same offline. Here the snapshots are kept in memory (on the CPU) and in
every checkpoint Lightning writes, so a killed and resumed run averages the same
epochs as an uninterrupted one.
"""
from __future__ import annotations

import lightning.pytorch as pl
import torch


class WeightAveraging(pl.Callback):
    """Keeps the module's ``state_dict`` at the end of each of the last ``n`` training epochs.

    Args:
        n: how many epoch-end snapshots to average (≥ 1).
    Memory: ``n`` float copies of the model on the CPU (about 30 MB each for the
    default Transformer), also stored in ``last.ckpt`` while training.
    Raises:
        ValueError: ``n`` < 1.
    """

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"checkpoint.average_last must be ≥ 1 to average (0 turns it off), got {n}")
        self.n = n
        self.snapshots: list[dict[str, torch.Tensor]] = []  # oldest first

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # Runs before ModelCheckpoint's own epoch-end save (Lightning orders checkpoint
        # callbacks last), so last.ckpt already holds this epoch's snapshot.
        self.snapshots.append({k: v.detach().to("cpu", copy=True) for k, v in pl_module.state_dict().items()})
        del self.snapshots[: -self.n]

    def state_dict(self) -> dict:
        return {"n": self.n, "snapshots": self.snapshots}

    def load_state_dict(self, state_dict: dict) -> None:
        self.snapshots = list(state_dict["snapshots"])[-self.n :]

    def average(self) -> dict[str, torch.Tensor]:
        """Element-wise mean of the kept snapshots, accumulated in float64 and cast back to
        each tensor's dtype; integer buffers (counters) take the newest snapshot's value.

        Raises:
            RuntimeError: no epoch has ended yet (nothing to average).
        """
        if not self.snapshots:
            raise RuntimeError("no epoch ended, so there are no weights to average; train at least "
                               "one full epoch or set checkpoint.average_last=0")
        newest = self.snapshots[-1]
        out = {}
        for key, value in newest.items():
            if value.is_floating_point():
                total = sum(s[key].double() for s in self.snapshots)
                out[key] = (total / len(self.snapshots)).to(value.dtype)
            else:
                out[key] = value.clone()
        return out

    def apply(self, pl_module: pl.LightningModule) -> int:
        """Load the average into ``pl_module`` (on its device); forget the snapshots, so a
        checkpoint saved afterwards does not carry them. Returns how many epochs were averaged."""
        count = len(self.snapshots)
        pl_module.load_state_dict(self.average())
        self.snapshots = []
        return count
