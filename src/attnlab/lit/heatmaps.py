"""Attention maps of fixed validation sentences after every validation epoch (watch alignment form)."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from attnlab.viz import translation_heatmaps


def epoch_dir(epoch: int) -> str:
    """``epochs/epoch03`` for 1-based ``epoch`` 3: the folder of that epoch's maps, locally
    (under ``plots/<model>/attention/``) and in MLflow (under ``attention/``)."""
    return f"epochs/epoch{epoch:02d}"


class EpochHeatmaps(Callback):
    """After each validation epoch, draw the attention maps of ``sentences`` with the current
    weights and log them.

    The PNGs (one per sentence, kind in ``kinds`` and layer; see
    :func:`attnlab.viz.translation_heatmaps`) are written to
    ``<out_dir>/epochs/epochNN/`` (``NN`` = 1-based epoch, e.g. ``plots/transformer/attention``)
    and logged to the MLflow run under ``attention/epochs/epochNN/``. Only global rank 0
    draws; sanity-check validation is skipped. Sentences are greedy-decoded, as for ``val_bleu``.

    Args:
        sentences: source sentences (plain text), the same every epoch.
        kinds: attention kinds to draw, e.g. ``("encoder_decoder", "alignment")``; kinds the
            model does not have are skipped, and an empty list draws nothing.
        out_dir: local folder, or ``None`` to log to MLflow only (via a temporary folder).
        logger: the run's MLflow logger (``log_artifacts(local_dir, artifact_path)``), or ``None``.
    """

    def __init__(self, sentences: Sequence[str], kinds: Sequence[str], out_dir: Path | None,
                 logger=None):
        self.sentences, self.kinds = list(sentences), list(kinds)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.logger = logger

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (trainer.sanity_checking or not trainer.is_global_zero or not self.sentences
                or not self.kinds or pl_module.tokenizer is None):
            return
        sub = epoch_dir(trainer.current_epoch + 1)
        with tempfile.TemporaryDirectory() as tmp:
            folder = (self.out_dir if self.out_dir is not None else Path(tmp)) / sub
            paths = translation_heatmaps(pl_module.net, pl_module.tokenizer, self.sentences, folder,
                                         device=pl_module.device, kinds=self.kinds,
                                         title_prefix=f"epoch {trainer.current_epoch + 1}, ")
            if paths and self.logger is not None:
                self.logger.log_artifacts(str(folder), f"attention/{sub}")
