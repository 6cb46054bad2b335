"""DVC stage `train@<model>`: fit one model, track it in MLflow.

    python src/train.py model=transformer optimizer=adamw device=cpu trainer.max_epochs=1

Writes checkpoints/<model>/best.ckpt and runs/<model>.json (the MLflow run id
that evaluate and export add to); logs the resolved config, per-epoch metrics,
the checkpoint and attention heatmaps (attention/*.png) to MLflow.
"""
import tempfile
from pathlib import Path

import hydra
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import DictConfig, OmegaConf

from attnlab.checkpoint import load_net
from attnlab.lit.setup import build_task, heatmaps
from attnlab.files import write_json_atomic


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    pl.seed_everything(cfg.seed, workers=True)
    module, loaders = build_task(cfg)
    local_store = cfg.mlflow.tracking_uri.startswith("sqlite:")
    logger = MLFlowLogger(experiment_name=cfg.mlflow.experiment, tracking_uri=cfg.mlflow.tracking_uri,
                          tags={"model": cfg.model.name, "data": cfg.data.name}, log_model=True,
                          artifact_location=cfg.mlflow.artifact_location if local_store else None)
    checkpoint = ModelCheckpoint(dirpath=cfg.paths.checkpoints, filename=cfg.checkpoint.filename,
                                 monitor=cfg.checkpoint.monitor, mode=cfg.checkpoint.mode,
                                 save_top_k=1, enable_version_counter=False)
    trainer = pl.Trainer(**cfg.trainer, **cfg.device, logger=logger, callbacks=[checkpoint])
    if trainer.is_global_zero:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        logger.experiment.log_text(logger.run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
    trainer.fit(module, *loaders)
    best_path = checkpoint.best_model_path
    if not best_path:  # stopped (max_steps) before any validation: keep the final weights
        best_path = str(Path(cfg.paths.checkpoints) / f"{cfg.checkpoint.filename}.ckpt")
        trainer.save_checkpoint(best_path)
    if not trainer.is_global_zero:
        return
    with tempfile.TemporaryDirectory() as tmp:
        heatmaps(cfg, load_net(best_path, expected_kind=cfg.model.name), module, Path(tmp))
        logger.experiment.log_artifacts(logger.run_id, tmp, "attention")
    write_json_atomic(Path(cfg.paths.runs) / f"{cfg.model.name}.json", {
        "run_id": logger.run_id, "tracking_uri": cfg.mlflow.tracking_uri,
        "experiment": cfg.mlflow.experiment, "checkpoint": best_path})
    print(f"{cfg.model.name}: checkpoint {best_path}; MLflow run {logger.run_id} in "
          f"{cfg.mlflow.tracking_uri} (the default store: run `mlflow ui` from the project root)")


if __name__ == "__main__":
    main()
