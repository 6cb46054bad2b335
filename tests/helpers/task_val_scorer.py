"""Validate a freshly built model of any task on N CPU ranks and record what was scored.

    python tests/helpers/task_val_scorer.py CONFIG_JSON OUT_DIR DEVICES

``CONFIG_JSON`` is a JSON list of Hydra overrides (``model=vit``, ``model=nw``, …). The module and
its loaders are built by the task's ``from_config``, as ``src/train.py`` builds them, with the
weights ``seed`` gives; then Lightning's ``Trainer.validate`` runs the val loader on ``DEVICES`` CPU
processes (``strategy="ddp"`` over gloo when more than one; Lightning starts the other ranks by
running this script again). Each rank writes ``OUT_DIR/rank<r>.json``: ``scored``, the number of
items its validation steps read; ``metrics``, what ``Trainer.validate`` returned.
"""

from __future__ import annotations

import sys

import pytorch_lightning as pl
from ddp_validate import config, validate
from hydra.utils import get_class


class _Counter(pl.Callback):
    def __init__(self, record: dict):
        self.record = record

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.record["scored"] += len(batch[-1])


def main(config_json: str, out: str, devices: str) -> None:
    cfg = config(config_json)
    module, (_, val) = get_class(cfg.model.task.module).from_config(cfg)
    record: dict = {"scored": 0}
    validate(module, devices, _Counter(record), record, out, dataloaders=val)


if __name__ == "__main__":
    main(*sys.argv[1:])
