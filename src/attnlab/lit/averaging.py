"""Checkpoint averaging: the mean of the weights at the end of the last N epochs.

Vaswani et al. 2017, section 6.1 ("a single model obtained by averaging the last 5
checkpoints"); fairseq's ``scripts/average_checkpoints.py --num-epoch-checkpoints N``
does the same offline. Here the snapshots are kept in memory (on the CPU) and in
every checkpoint Lightning writes, so a killed and resumed run averages the same
epochs as an uninterrupted one.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from attnlab.errors import ConfigError


class WeightAveraging(pl.Callback):
    """Keeps the module's ``state_dict`` at the end of each of the last ``n`` training epochs.

    The snapshot is taken after the epoch's last optimizer step (``on_train_batch_end`` of
    its last batch, before any checkpoint of that batch is written: Lightning runs
    ``ModelCheckpoint`` callbacks last) and again at ``on_train_epoch_end`` (the same
    weights; covers loaders of unknown length). Snapshots are keyed by epoch, so a hook
    that fires twice, or again after a resume, changes nothing. Tensors that share memory
    (tied embeddings) are copied once.

    Args:
        n: how many epoch-end snapshots to average (≥ 1).
    Memory: ``n`` float copies of the model on the CPU (about 30 MB each for the
    default Transformer), also stored in ``last.ckpt`` while training.
    Raises:
        ValueError: ``n`` < 1.
    """

    def __init__(self, n: int):
        if n < 1:
            raise ConfigError(f"checkpoint.average_last must be ≥ 1 to average (0 turns it off), got {n}")
        self.n = n
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}  # epoch (0-based) → state

    def _snapshot(self, epoch: int, pl_module) -> None:
        copies: dict[tuple, torch.Tensor] = {}
        state = {}
        for key, value in pl_module.state_dict().items():
            shared = (value.data_ptr(), tuple(value.shape), value.dtype)
            if shared not in copies:
                copies[shared] = value.detach().to("cpu", copy=True)
            state[key] = copies[shared]
        self.snapshots[epoch] = state
        for old in sorted(self.snapshots)[: -self.n]:
            del self.snapshots[old]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._snapshot(trainer.current_epoch, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._snapshot(trainer.current_epoch, pl_module)

    def state_dict(self) -> dict:
        return {"n": self.n, "snapshots": self.snapshots}

    def load_state_dict(self, state_dict: dict) -> None:
        kept = state_dict["snapshots"]
        self.snapshots = {epoch: kept[epoch] for epoch in sorted(kept)[-self.n :]}

    @property
    def epochs(self) -> list[int]:
        """The 1-based epochs whose weights are kept, oldest first."""
        return [epoch + 1 for epoch in sorted(self.snapshots)]

    def average(self) -> dict[str, torch.Tensor]:
        """Element-wise mean of the kept snapshots, accumulated in float64 and cast back to
        each tensor's dtype; integer buffers (counters) take the newest snapshot's value.

        Raises:
            RuntimeError: no epoch has ended yet (nothing to average).
        """
        if not self.snapshots:
            raise RuntimeError(
                "no epoch ended, so there are no weights to average; train at least "
                "one full epoch or set checkpoint.average_last=0"
            )
        snaps = [self.snapshots[epoch] for epoch in sorted(self.snapshots)]
        out = {}
        for key, value in snaps[-1].items():
            if value.is_floating_point():
                out[key] = (sum(s[key].double() for s in snaps) / len(snaps)).to(value.dtype)
            else:
                out[key] = value.clone()
        return out

    def apply(self, pl_module: pl.LightningModule) -> list[int]:
        """Load the average into ``pl_module`` (on its device); forget the snapshots, so a
        checkpoint saved afterwards does not carry them. Returns the averaged epochs (1-based).

        Raises:
            RuntimeError: as :meth:`average`.
        """
        epochs = self.epochs
        pl_module.load_state_dict(self.average())
        self.snapshots = {}
        return epochs
