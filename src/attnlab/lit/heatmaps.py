"""Attention maps of fixed validation sentences after every validation epoch (watch alignment form)."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from attnlab.analysis import explorer
from attnlab.analysis.viz import collect_translation_maps, draw_translation_maps

log = logging.getLogger(__name__)

EXPLORER = "explorer.html"  # in the local folder and under the run's attention/


def epoch_dir(epoch: int) -> str:
    """``epochs/epoch03`` for 1-based ``epoch`` 3: the folder of that epoch's maps, locally
    (under ``plots/<model>/attention/``) and in MLflow (under ``attention/``)."""
    return f"epochs/epoch{epoch:02d}"


class EpochHeatmaps(Callback):
    """After each validation epoch, collect the attention maps of ``sentences`` with the current
    weights, draw the PNGs of ``kinds`` and rebuild the attention explorer; log both.

    The PNGs (one per sentence, kind in ``kinds`` and layer; see
    :func:`attnlab.analysis.viz.draw_translation_maps`) are written to ``<out_dir>/epochs/epochNN/``
    (``NN`` = 1-based epoch, e.g. ``plots/transformer/attention``) and logged to the MLflow run
    under ``attention/epochs/epochNN/``. The explorer (:func:`attnlab.analysis.explorer.translation_explorer`:
    every kind the model has, every validation epoch so far on its slider) is written to
    ``explorer_path`` and logged as ``attention/explorer.html``, replacing the previous
    epoch's. Only global rank 0 works; sanity-check validation is skipped. Sentences are
    greedy-decoded, as for ``val_bleu``.

    The explorer page is also where the earlier epochs are kept: a resumed run (same
    ``out_dir``) reads them back from it (epochs before the current one, with the same
    sentences and kinds), so its explorer has every epoch of the killed run too.

    Args:
        sentences: source sentences (plain text), the same every epoch.
        kinds: attention kinds to draw as PNGs, e.g. ``("encoder_decoder", "alignment")``; kinds
            the model does not have are skipped (the explorer still shows every kind it has).
            No sentence or an empty ``kinds`` turns it all off: no PNG, no explorer.
        out_dir: local folder, or ``None`` to log to MLflow only (via a temporary folder; the
            earlier epochs are then kept in memory).
        logger: the run's MLflow logger (``log_artifact``, ``log_artifacts``), or ``None``.
        explorer_path: where the explorer page goes locally (default ``<out_dir>/explorer.html``;
            train.py puts it beside the PNG folder, ``plots/<model>/explorer.html``, which
            ``dvc plots`` does not try to draw).
    """

    def __init__(
        self,
        sentences: Sequence[str],
        kinds: Sequence[str],
        out_dir: Path | None,
        logger=None,
        explorer_path: Path | None = None,
    ):
        self.sentences, self.kinds = list(sentences), list(kinds)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.explorer_path = Path(explorer_path) if explorer_path is not None else None
        self.logger = logger
        self._epochs: list[dict] = []  # the explorer's data, one dict per validation epoch

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (
            trainer.sanity_checking
            or not trainer.is_global_zero
            or not self.sentences
            or not self.kinds
            or pl_module.tokenizer is None
        ):
            return
        epoch = trainer.current_epoch + 1
        sub = epoch_dir(epoch)
        collected = collect_translation_maps(
            pl_module.net, pl_module.tokenizer, self.sentences, device=pl_module.device
        )
        if not any(s.kinds for s in collected):  # a model without attention (seq2seq): nothing to show
            return
        with tempfile.TemporaryDirectory() as tmp:
            root = self.out_dir if self.out_dir is not None else Path(tmp)
            pngs = draw_translation_maps(collected, root / sub, self.kinds, title_prefix=f"epoch {epoch}, ")
            if pngs and self.logger is not None:
                self.logger.log_artifacts(str(root / sub), f"attention/{sub}")
            now = explorer.translation_epoch(collected, epoch)
            path = self.explorer_path or root / EXPLORER
            self._epochs = self._earlier(path, now) + [now]
            page = explorer.translation_explorer(
                self._epochs,
                f"{type(pl_module.net).__name__}: attention of "
                f"{len(self.sentences)} validation sentence(s), epoch by epoch",
            )
            explorer.write_explorer(path, page)
            if self.logger is not None:
                self.logger.log_artifact(str(path), "attention")

    def _earlier(self, page: Path, now: dict) -> list[dict]:
        """The explorer data of the epochs before ``now``
        (:func:`attnlab.analysis.explorer.translation_epoch`): from this process, else (a resumed
        run) from the page the killed run left; only epochs with the same sentences and kinds as
        ``now``."""
        kept = self._epochs
        if not kept and page.is_file():
            try:
                kept = explorer.read_data(page.read_text(encoding="utf-8"))["epochs"]
            except (ValueError, KeyError) as e:
                log.warning(
                    "could not read the earlier epochs from %s (%s); the explorer starts at epoch %d",
                    page,
                    e,
                    now["epoch"],
                )
                kept = []
        shape = lambda e: [(s["source"], list(s["kinds"])) for s in e["sentences"]]
        return [e for e in kept if e["epoch"] < now["epoch"] and shape(e) == shape(now)]
