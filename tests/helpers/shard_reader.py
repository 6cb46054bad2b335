"""One node of a two-node DDP run that records which training pairs it reads.

Started once per node, as docs/how-to/resume-ddp.md starts `src/train.py` on several machines:

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 NODE_RANK=0 WORLD_SIZE=2 \
        python tests/helpers/shard_reader.py TOKENIZED_DIR OUT_DIR EPOCHS MAX_TOKENS

It runs Lightning's Trainer with the project's DDP device config (``conf/device/ddp.yaml``
with ``num_nodes=2``, ``devices=1``) and the project's :class:`TranslationDataModule` on the
memory-mapped tokenized corpus. The model has one weight, so each step is an all-reduce and
nothing else. The dataset's ``__getitems__`` (what the DataLoader calls for each batch) notes
the pair indices that this rank reads; ``training_step`` notes the row sums of the source batch
the model received. Both go to ``OUT_DIR/rank<global rank>.json``, in the order read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir

from attnlab.data.datamodule import TranslationDataModule

ROOT = Path(__file__).resolve().parents[2]


class _OneWeight(pl.LightningModule):
    def __init__(self, log: dict):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.record = log

    def training_step(self, batch, batch_idx):
        self.record["received"].append(batch["src"].sum(dim=1).tolist())
        return (self.w - batch["src_valid_lens"].float().mean()) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class _Recorder(pl.Callback):
    """Wraps the training set's ``__getitems__`` before the first loader is built (the data
    module keeps the dataset it builds, so every epoch's loader reads through the wrapper)."""

    def __init__(self, log: dict):
        self.record = log

    def on_fit_start(self, trainer, pl_module):
        ds = trainer.datamodule.dataset("train")
        read = ds.__getitems__

        def recording(indices):
            self.record["read"].append([int(i) for i in indices])
            return read(indices)

        ds.__getitems__ = recording
        self.record["memory_mapped"] = isinstance(ds.src.ids, np.memmap) and isinstance(ds.tgt.ids, np.memmap)


def main(tokenized: str, out: str, epochs: str, max_tokens: str) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=["device=ddp", "device.num_nodes=2", "device.devices=1"]
        )
    log: dict = {"read": [], "received": []}
    trainer = pl.Trainer(
        **cfg.device,
        max_epochs=int(epochs),
        use_distributed_sampler=False,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_Recorder(log)],
    )
    data = TranslationDataModule(tokenized, max_tokens=int(max_tokens), seed=cfg.seed)
    trainer.fit(_OneWeight(log), datamodule=data)
    log.update(world_size=trainer.world_size, global_rank=trainer.global_rank, node_rank=trainer.node_rank)
    Path(out, f"rank{trainer.global_rank}.json").write_text(json.dumps(log))


if __name__ == "__main__":
    main(*sys.argv[1:])
