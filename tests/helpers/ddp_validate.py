"""What the validation helper scripts share: the config, and ``Trainer.validate`` on N CPU ranks.

The scripts (``val_scorer.py``, ``task_val_scorer.py``) import it from their own folder, which
Python puts first on ``sys.path`` when it runs a script, and Lightning's DDP ranks run them again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[2]


def config(config_json: str) -> DictConfig:
    """The composed config of the JSON list of Hydra overrides in ``config_json``, seeded."""
    torch.set_num_threads(1)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=json.loads(Path(config_json).read_text()))
    pl.seed_everything(cfg.seed)
    return cfg


def validate(
    module: pl.LightningModule, devices: str, callback: pl.Callback, record: dict, out: str, **data
) -> None:
    """``Trainer.validate`` of ``module`` on ``devices`` CPU processes (DDP over gloo when more than
    one), ``data`` its ``dataloaders=`` or ``datamodule=``; writes ``record`` with the returned
    ``metrics``, ``world_size`` and ``rank`` to ``out/rank<r>.json``."""
    n = int(devices)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=n,
        strategy="ddp" if n > 1 else "auto",
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    (metrics,) = trainer.validate(module, verbose=False, **data)
    record.update(metrics=metrics, world_size=trainer.world_size, rank=trainer.global_rank)
    Path(out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
