"""Validate a trained translation checkpoint on N CPU ranks and record what was scored.

    python tests/helpers/val_scorer.py CONFIG_JSON CHECKPOINT OUT_DIR DEVICES

``CONFIG_JSON`` is a JSON list of Hydra overrides (the ``train.py`` ones of the run that wrote
``CHECKPOINT``, ``paths.root`` included). The module and its data module are built by
:meth:`attnlab.lit.translation.TranslationModule.from_config`, as ``src/train.py`` builds them; the
net gets the checkpoint's weights; then Lightning's ``Trainer.validate`` runs them on ``DEVICES``
CPU processes (``strategy="ddp"`` over gloo when more than one; Lightning starts the other ranks
by running this script again). Each rank writes ``OUT_DIR/rank<r>.json``:

- ``read``: the val pair indices of every batch the rank's loader read (the dataset's
  ``__getitems__``), in order, padding batches included;
- ``pairs``: the synced ``val_pairs`` metric (val pairs that ``val_loss`` covers, all ranks);
- ``metrics``: what ``Trainer.validate`` returned (``val_loss``, ``val_bleu``, ``val_chrf``).
"""

from __future__ import annotations

import sys

import pytorch_lightning as pl
import torch
from ddp_validate import config, validate

from attnlab.lit.translation import TranslationModule


class _Recorder(pl.Callback):
    def __init__(self, record: dict):
        self.record = record

    def on_validation_start(self, trainer, pl_module):
        ds = trainer.datamodule.dataset("val")
        read = ds.__getitems__

        def recording(indices):
            self.record["read"].append([int(i) for i in indices])
            return read(indices)

        ds.__getitems__ = recording

    def on_validation_epoch_end(self, trainer, pl_module):
        self.record["pairs"] = int(pl_module.val_pairs.compute())  # a collective: every rank calls it


def main(config_json: str, checkpoint: str, out: str, devices: str) -> None:
    module, (datamodule,) = TranslationModule.from_config(config(config_json))
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    module.load_state_dict(state)
    record: dict = {"read": []}
    validate(module, devices, _Recorder(record), record, out, datamodule=datamodule)


if __name__ == "__main__":
    main(*sys.argv[1:])
