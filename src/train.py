"""DVC stage `train@<model>`: fit one model, track it in MLflow, resume it after a kill.

    python src/train.py model=transformer optimizer=adamw device=cpu trainer.max_epochs=1

Writes checkpoints/<model>/best.ckpt (best by val_loss, or with
`checkpoint.average_last=N` the average of the last N epochs' weights) and runs/<model>.json (the
MLflow run id that evaluate and export add to); logs the resolved config, per-epoch metrics,
the checkpoint and attention heatmaps (attention/*.png) to MLflow. For `dvc plots`
it writes plots/<model>/history.csv (one row per epoch) and the same heatmaps under
plots/<model>/attention/; maps drawn after every validation epoch go to
attention/epochs/epochNN/ in both places.

While it trains it keeps checkpoints/<model>/last.ckpt (every epoch and every
`checkpoint.every_n_train_steps` steps). Killed, it resumes from there when the
same command (or `dvc repro`) runs again with the same config, in the same
MLflow run (attnlab.lit.resume); a finished run deletes last.ckpt.

    python src/train.py model=transformer data=fra_eng +init_from=models:/attnlab-transformer@champion

`+init_from=` (a checkpoint file or a registered model) starts from a trained model's weights,
with a fresh optimizer, schedule, epoch counter and MLflow run (attnlab.lit.init_from: the corpus
must be tokenized with the parent's tokenizer and model.net must be the parent's).
"""

import logging
import shutil
from pathlib import Path

import hydra
import pytorch_lightning as pl
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities import rank_zero_only

from attnlab.checkpoint import load_net, tokenizer_record
from attnlab.config import check_precision
from attnlab.console import logs, summaries
from attnlab.console.errors import user_errors
from attnlab.data.tokenizer import corpus_path_tag
from attnlab.files import ensure_writable
from attnlab.lit.checkpoints import TrainingCheckpoints
from attnlab.lit.history import EpochHistoryLogger
from attnlab.lit.init_from import start_from_parent
from attnlab.lit.resume import ResumeState, config_fingerprint, find_resume_point
from attnlab.tracking.store import create_store_file, prepare_store, write_run_record
from attnlab.tracking.sweep import sweep_job

log = logging.getLogger("train")


@rank_zero_only
def clear_plots(folder: Path) -> None:
    """Empty ``folder`` (plots/<model>: history.csv, attention/) before a fresh, non-resumed run."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@user_errors("train")  # an error of the user's config or files: its message alone
def main(cfg: DictConfig) -> None:
    logs.setup()  # quiet logs under `dvc repro`; ATTNLAB_VERBOSE=1 shows everything
    check_precision(cfg.trainer.precision, cfg.device.accelerator)
    sweep = sweep_job(cfg)  # multirun (-m): outputs in the job's dir, run nested in the sweep's
    ensure_writable(cfg.paths.checkpoints, cfg.paths.runs, cfg.paths.plots)
    prepare_store(cfg.mlflow.tracking_uri, cfg.mlflow.artifact_location)
    checkpoints = TrainingCheckpoints(cfg.checkpoint, cfg.paths.checkpoints)
    pl.seed_everything(cfg.seed, workers=True)
    # The model's task (conf/model/<model>.yaml: task.module) builds its module and data.
    # every split fits the model before anything trains (attnlab.inference.lengths)
    module, loaders = get_class(cfg.model.task.module).from_config(cfg)
    fingerprint = config_fingerprint(cfg)
    # a checkpoint of this config on a corpus tokenized anew since (same folder) is not resumed
    resume, why = find_resume_point(checkpoints.folder, fingerprint, tokenizer_record(cfg.paths.tokenized))
    if why:
        log.info(why)
    # task.load: a task whose nets attnlab.checkpoint.load_net does not build (the image models)
    load = get_method(cfg.model.task.load) if cfg.model.task.get("load") else load_net
    parent_tags = {}
    if cfg.get("init_from") and resume is None:  # a resumed run has its weights: last.ckpt's
        parent_tags = start_from_parent(cfg, module, load).tags()
    elif cfg.get("init_from"):
        log.info("init_from=%s: resuming, so the parent's weights are not loaded again", cfg.init_from)
    # MLflow run tags (its search and compare views filter on them) and name, e.g.
    # transformer-multi30k-en-fr-seed0 or nw-synthetic-seed0 (fixed: MLflow's would vary).
    task_tags = module.run_tags(cfg)
    name = "-".join([cfg.model.name, *(task_tags.values() or [cfg.data.name]), f"seed{cfg.seed}"])
    # the first run of a project builds its MLflow store whole, aside; after every check above
    # (a fresh clone that must tokenize first, a parent of another tokenizer): a refused run
    # leaves no store
    create_store_file(cfg.mlflow.tracking_uri)
    logger = instantiate(cfg.mlflow.logger, _partial_=True)(  # call-time arguments stay plain strings
        tags={
            "model": cfg.model.name,
            "data": cfg.data.name,
            **task_tags,
            **corpus_path_tag(cfg),
            **parent_tags,
            **sweep.tags,
        },
        run_id=resume.run_id if resume else None,
        run_name=sweep.run_name(name),
    )
    plots = Path(cfg.paths.plots)
    if resume is None:
        clear_plots(plots)  # a persistent DVC output: a fresh run starts it anew
    configured = [instantiate(node) for node in cfg.callbacks.values() if node is not None]
    callbacks = [
        *checkpoints.callbacks(),
        ResumeState(fingerprint, logger),
        *(c for built in configured for c in (built if isinstance(built, list) else [built])),
        *module.epoch_callbacks(cfg, plots, logger),
    ]
    history = EpochHistoryLogger(plots / "history.csv", resume=resume is not None)
    trainer = pl.Trainer(
        **cfg.trainer,
        **cfg.device,
        logger=[logger, history],
        callbacks=callbacks,
        plugins=checkpoints.plugins(),
    )
    if trainer.is_global_zero and resume is None:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        logger.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
    checkpoints.fit(trainer, module, loaders, resume, cfg.model.name)
    best_path, averaged = checkpoints.finish(trainer, module)
    if not trainer.is_global_zero:
        return
    logger.log_artifact(best_path, "checkpoint")
    for figure in module.figures(load(best_path, expected_kind=cfg.model.name), plots):
        logger.log_artifact(str(figure), "attention")
    write_run_record(
        Path(cfg.paths.runs) / f"{cfg.model.name}.json",
        logger.run_id,
        cfg.mlflow.tracking_uri,
        cfg.mlflow.experiment,
        best_path,
        root=cfg.paths.root,
    )
    checkpoints.last.unlink(missing_ok=True)  # finished: nothing to resume
    print(summaries.train_summary(cfg, trainer, logger, best_path, averaged=averaged))


if __name__ == "__main__":
    main()
