"""The checkpoints ``train.py`` writes, and ``Trainer.fit`` with what to do after a stop.

``checkpoints/<model>/`` holds the kept checkpoint (``checkpoint.filename``: the best by
``checkpoint.monitor``, the mean of the last ``checkpoint.average_last`` epochs' weights, or
the final weights) and, while training, ``last.ckpt`` (every epoch and every
``checkpoint.every_n_train_steps`` steps) that a killed run resumes from
(:mod:`attnlab.lit.resume`). The settings are ``conf/config.yaml``'s ``checkpoint`` block.
Every checkpoint is written whole or not at all (:class:`AtomicCheckpointIO`).
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities.exceptions import SIGTERMException

from attnlab.errors import ConfigError
from attnlab.files import FileWriteError, write_bytes_atomic
from attnlab.lit.averaging import WeightAveraging
from attnlab.lit.resume import LAST, ResumableCheckpoint, ResumePoint
from attnlab.loss import NonFiniteLossError

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` that writes a local checkpoint beside its destination,
    flushes it to disk and renames it into place (:func:`attnlab.files.write_bytes_atomic`).

    Lightning's own writes the checkpoint through an fsspec transaction, which for a local
    path stages it in the system's temporary folder and *copies* it over the destination
    when that is another filesystem: a disk that fills during the copy leaves a truncated
    ``best.ckpt`` in place of the good one. Here a failed write leaves the previous file as
    it was. Remote paths (``s3://`` …) keep Lightning's way. Memory: the serialized
    checkpoint once, as Lightning's.

    Raises:
        attnlab.files.FileWriteError: from :meth:`save_checkpoint`, when the file cannot be
            written (a full disk: names the file, the cause and the fix).
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        local = str(path).removeprefix("file://")
        if storage_options is not None or "://" in local:
            super().save_checkpoint(checkpoint, path, storage_options)  # refuses storage_options
            return
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_bytes_atomic(Path(local), buffer.getbuffer())


class TrainingCheckpoints:
    """The kept checkpoint and the resume checkpoints of one training run.

    Args:
        settings: ``checkpoint`` config (``monitor``, ``mode``, ``filename``,
            ``every_n_train_steps``, ``average_last``).
        folder: where they are written (``paths.checkpoints``).
    Raises:
        ConfigError: ``filename`` is ``last``, the resume checkpoint's name;
            ``average_last`` < 0.
    """

    def __init__(self, settings, folder: str | Path):
        self.folder, self.filename = Path(folder), settings.filename
        if settings.filename == LAST:
            raise ConfigError(
                f"checkpoint.filename={LAST} is reserved for the resume checkpoint; "
                "choose another name, e.g. checkpoint.filename=final"
            )
        if settings.average_last < 0:
            raise ConfigError(
                f"checkpoint.average_last={settings.average_last}: give the number of last "
                "epochs to average (≥ 1), or 0 to keep the best checkpoint by monitor"
            )
        d = str(self.folder)
        # The best by monitor; none without a monitor or when averaging (finish() saves those).
        self.kept = None
        if settings.monitor and not settings.average_last:
            self.kept = ResumableCheckpoint(
                dirpath=d,
                filename=settings.filename,
                monitor=settings.monitor,
                mode=settings.mode,
                save_top_k=1,
                enable_version_counter=False,
            )
        self.resume = [
            ResumableCheckpoint(dirpath=d, filename=LAST, every_n_epochs=1, enable_version_counter=False)
        ]
        if settings.every_n_train_steps:
            self.resume.append(
                ResumableCheckpoint(
                    dirpath=d,
                    filename=LAST,
                    enable_version_counter=False,
                    every_n_train_steps=settings.every_n_train_steps,
                )
            )
        self.averaging = WeightAveraging(settings.average_last) if settings.average_last else None

    @property
    def last(self) -> Path:
        """``last.ckpt``, the checkpoint a killed run resumes from."""
        return self.folder / f"{LAST}.ckpt"

    def plugins(self) -> list:
        """The checkpoint writer, for ``pl.Trainer(plugins=...)``: :class:`AtomicCheckpointIO`."""
        return [AtomicCheckpointIO()]

    def callbacks(self) -> list[pl.Callback]:
        """All :class:`ResumableCheckpoint` (a moved or cloned project keeps its best score and
        path) and the weight averaging, for ``pl.Trainer(callbacks=...)``."""
        return [c for c in (self.kept, *self.resume, self.averaging) if c is not None]

    def fit(
        self, trainer: pl.Trainer, module: pl.LightningModule, loaders, resume: ResumePoint | None, name: str
    ) -> None:
        """``trainer.fit`` from ``resume`` (or afresh), with the way on after a stop.

        Raises:
            SystemExit: stopped by SIGTERM (Lightning stops at the next batch and would exit 0):
                names the command that resumes.
            NonFiniteLossError: the loss became NaN or ±inf; says which checkpoint is the last good one.
            SystemExit: a checkpoint could not be written (a full disk): the
                :class:`attnlab.files.FileWriteError` (the file, kept as it was, and the fix),
                and the checkpoint the next run resumes from.
        """
        try:
            trainer.fit(module, *loaders, ckpt_path=resume.path if resume else None)
        except SIGTERMException:
            raise SystemExit(
                f"{name}: stopped by SIGTERM at step {trainer.global_step}; run the same "
                f"command (or `dvc repro`) again to resume from {self.last}"
            ) from None
        except NonFiniteLossError as e:
            kept = (
                (
                    f"the last good checkpoint is {self.last} (the weights of the step before; resuming "
                    "them unchanged meets the same loss)"
                )
                if self.last.exists()
                else "no checkpoint was written yet"
            )
            raise NonFiniteLossError(f"{e}; training stopped, {kept}") from None
        except FileWriteError as e:
            then = (
                f"then run the same command (or `dvc repro`) to resume from {self.last}"
                if self.last.exists()
                else "then run the same command (or `dvc repro`) again"
            )
            raise SystemExit(f"{name}: training stopped at step {trainer.global_step}: {e}; {then}") from None

    def finish(self, trainer: pl.Trainer, module: pl.LightningModule) -> tuple[str, list[int]]:
        """(the kept checkpoint's path, the epochs averaged into it (``[]`` if none)).

        With averaging, ``module`` gets the mean of the last epochs' weights (Vaswani et al. 6.1);
        with no monitor, averaging, or a stop before any validation, the final weights are saved.

        Raises:
            SystemExit: that checkpoint could not be written (the
                :class:`attnlab.files.FileWriteError`, and how to write it after freeing space).
        """
        best_path, averaged = (self.kept.best_model_path if self.kept else ""), []
        if self.averaging and not self.averaging.snapshots:
            log.warning(
                "checkpoint.average_last=%d but no epoch ended (max_steps?): keeping the final weights",
                self.averaging.n,
            )
        elif self.averaging:
            averaged = self.averaging.apply(module)
            log.info("kept checkpoint: the mean of the weights after epochs %s", averaged)
            if len(averaged) < self.averaging.n:
                log.warning(
                    "checkpoint.average_last=%d but only %d epoch(s) ended: averaged those",
                    self.averaging.n,
                    len(averaged),
                )
        if not best_path:
            best_path = str(self.folder / f"{self.filename}.ckpt")
            try:
                trainer.save_checkpoint(best_path)
            except FileWriteError as e:
                raise SystemExit(
                    f"training ended, but {e}; then run the same command (or `dvc repro`) again "
                    f"to write it from {self.last}"
                    if self.last.exists()
                    else f"training ended, but {e}"
                ) from None
        log.info(
            "rank %d: checkpoint %s (exists: %s)", trainer.global_rank, best_path, Path(best_path).exists()
        )
        return best_path, averaged
