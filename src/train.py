"""DVC stage `train@<model>`: fit one model, track it in MLflow, resume it after a kill.

    python src/train.py model=transformer optimizer=adamw device=cpu trainer.max_epochs=1

Writes checkpoints/<model>/best.ckpt (best by val_loss, or with
`checkpoint.average_last=N` the average of the last N epochs' weights) and runs/<model>.json (the MLflow run id
that evaluate and export add to); logs the resolved config, per-epoch metrics,
the checkpoint and attention heatmaps (attention/*.png) to MLflow. For `dvc plots`
it writes plots/<model>/history.csv (one row per epoch) and the same heatmaps under
plots/<model>/attention/; maps drawn after every validation epoch go to
attention/epochs/epochNN/ in both places.

While it trains it keeps checkpoints/<model>/last.ckpt (every epoch and every
`checkpoint.every_n_train_steps` steps). Killed, it resumes from there when the
same command (or `dvc repro`) runs again with the same config, in the same
MLflow run (attnlab.lit.resume); a finished run deletes last.ckpt.
"""
import logging
import shutil
from pathlib import Path

import hydra
import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_only
from pytorch_lightning.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from attnlab.console import logs, summaries
from attnlab.checkpoint import load_net
from attnlab.files import ensure_writable
from attnlab.lit.averaging import WeightAveraging
from attnlab.lit.logger import ResilientMLFlowLogger
from attnlab.lit.progress import train_callbacks
from attnlab.lit.resume import LAST, ResumableCheckpoint, ResumeState, config_fingerprint, find_resume_point
from attnlab.lit.heatmaps import EpochHeatmaps
from attnlab.lit.history import EpochHistoryLogger
from attnlab.lit.setup import build_task, heatmap_sources, heatmaps
from attnlab.lit.translation import NonFiniteLossError
from attnlab.sweep import sweep_job
from attnlab.tracking import prepare_store, write_run_record

log = logging.getLogger("train")


def checkpoint_callbacks(cfg: DictConfig) -> tuple[ResumableCheckpoint | None, list[ResumableCheckpoint]]:
    """The kept checkpoint (best by ``checkpoint.monitor``; ``None`` with no monitor or with
    ``checkpoint.average_last`` > 0, where ``main`` saves the final or the averaged model)
    and the resume checkpoints that overwrite ``last.ckpt`` after every validation and
    every N steps. All are :class:`ResumableCheckpoint`: a moved or cloned project keeps its best
    score and path.

    Raises:
        ValueError: ``checkpoint.filename`` is ``last``, the resume checkpoint's name;
            ``checkpoint.average_last`` < 0.
    """
    d = cfg.paths.checkpoints
    if cfg.checkpoint.filename == LAST:
        raise ValueError(f"checkpoint.filename={LAST} is reserved for the resume checkpoint; "
                         "choose another name, e.g. checkpoint.filename=final")
    if cfg.checkpoint.average_last < 0:
        raise ValueError(f"checkpoint.average_last={cfg.checkpoint.average_last}: give the number of "
                         "last epochs to average (≥ 1), or 0 to keep the best checkpoint by monitor")
    kept = None
    if cfg.checkpoint.monitor and not cfg.checkpoint.average_last:
        kept = ResumableCheckpoint(dirpath=d, filename=cfg.checkpoint.filename,
                                   monitor=cfg.checkpoint.monitor, mode=cfg.checkpoint.mode,
                                   save_top_k=1, enable_version_counter=False)
    resume = [ResumableCheckpoint(dirpath=d, filename=LAST, every_n_epochs=1, enable_version_counter=False)]
    if cfg.checkpoint.every_n_train_steps:
        resume.append(ResumableCheckpoint(dirpath=d, filename=LAST, enable_version_counter=False,
                                          every_n_train_steps=cfg.checkpoint.every_n_train_steps))
    return kept, resume


def run_name(cfg: DictConfig) -> str:
    """The MLflow run name, e.g. ``transformer-multi30k-en-fr-seed0`` (``nw-synthetic-seed0``).

    MLflow's generated names would repeat from run to run: ``seed`` fixes Python's RNG first.
    """
    pair = f"-{cfg.data.src_lang}-{cfg.data.tgt_lang}" if cfg.model.task == "translation" else ""
    return f"{cfg.model.name}-{cfg.data.name}{pair}-seed{cfg.seed}"


def run_tags(cfg: DictConfig) -> dict[str, str]:
    """The MLflow run's tags: ``model``, ``data``, and for translation what it translates:
    ``corpus``, ``src_lang``, ``tgt_lang`` (MLflow's search and compare views filter on them)."""
    tags = {"model": cfg.model.name, "data": cfg.data.name}
    if cfg.model.task == "translation":
        tags |= {"corpus": cfg.data.name, "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang}
    return tags


@rank_zero_only
def clear_plots(folder: Path) -> None:
    """Empty ``folder`` (plots/<model>: history.csv, attention/) before a fresh, non-resumed run."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    logs.setup()  # quiet logs under `dvc repro`; ATTNLAB_VERBOSE=1 shows everything
    sweep = sweep_job(cfg)  # multirun (-m): outputs in the job's dir, run nested in the sweep's
    ensure_writable(cfg.paths.checkpoints, cfg.paths.runs, cfg.paths.plots)
    prepare_store(cfg.mlflow.tracking_uri, cfg.mlflow.artifact_location)
    pl.seed_everything(cfg.seed, workers=True)
    module, loaders = build_task(cfg)
    fingerprint = config_fingerprint(cfg)
    resume, why = find_resume_point(Path(cfg.paths.checkpoints), fingerprint)
    if why:
        log.info(why)
    local_store = cfg.mlflow.tracking_uri.startswith("sqlite:")
    logger = ResilientMLFlowLogger(
        experiment_name=cfg.mlflow.experiment, tracking_uri=cfg.mlflow.tracking_uri,
        tags={**run_tags(cfg), **sweep.tags}, run_id=resume.run_id if resume else None,
        run_name=sweep.run_name(run_name(cfg)),
        artifact_location=cfg.mlflow.artifact_location if local_store else None)
    plots = Path(cfg.paths.plots)
    if resume is None:
        clear_plots(plots)  # a persistent DVC output: a fresh run starts it anew
    history = EpochHistoryLogger(plots / "history.csv", resume=resume is not None)
    kept, resume_checkpoints = checkpoint_callbacks(cfg)
    averaging = WeightAveraging(cfg.checkpoint.average_last) if cfg.checkpoint.average_last else None
    callbacks = [*([kept] if kept else []), *resume_checkpoints, ResumeState(fingerprint, logger),
                 *([averaging] if averaging else []), *train_callbacks(cfg)]
    if cfg.model.task == "translation":
        callbacks.append(EpochHeatmaps(heatmap_sources(cfg), cfg.heatmaps.epoch_kinds,
                                       plots / "attention", logger))
    trainer = pl.Trainer(**cfg.trainer, **cfg.device, logger=[logger, history], callbacks=callbacks)
    if trainer.is_global_zero and resume is None:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        logger.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
    try:
        trainer.fit(module, *loaders, ckpt_path=resume.path if resume else None)
    except SIGTERMException:  # Lightning stops at the next batch and exits with status 0: not done
        raise SystemExit(f"{cfg.model.name}: stopped by SIGTERM at step {trainer.global_step}; run the "
                         "same command (or `dvc repro`) again to resume from "
                         f"{Path(cfg.paths.checkpoints) / f'{LAST}.ckpt'}") from None
    except NonFiniteLossError as e:
        last = Path(cfg.paths.checkpoints) / f"{LAST}.ckpt"
        kept_note = (f"the last good checkpoint is {last} (the weights of the step before; resuming "
                     "them unchanged meets the same loss)") if last.exists() else "no checkpoint was written yet"
        raise NonFiniteLossError(f"{e}; training stopped, {kept_note}") from None
    best_path, averaged = (kept.best_model_path if kept else ""), []
    if averaging and not averaging.snapshots:
        log.warning("checkpoint.average_last=%d but no epoch ended (max_steps?): keeping the "
                    "final weights", averaging.n)
    elif averaging:  # the mean of the last epochs' weights (Vaswani et al. 6.1)
        averaged = averaging.apply(module)
        log.info("kept checkpoint: the mean of the weights after epochs %s", averaged)
        if len(averaged) < averaging.n:
            log.warning("checkpoint.average_last=%d but only %d epoch(s) ended: averaged those",
                        averaging.n, len(averaged))
    if not best_path:  # no monitor, averaged, or stopped before any validation: the final weights
        best_path = str(Path(cfg.paths.checkpoints) / f"{cfg.checkpoint.filename}.ckpt")
        trainer.save_checkpoint(best_path)
    log.info("rank %d: checkpoint %s (exists: %s)", trainer.global_rank, best_path, Path(best_path).exists())
    if not trainer.is_global_zero:
        return
    logger.log_artifact(best_path, "checkpoint")
    for png in heatmaps(cfg, load_net(best_path, expected_kind=cfg.model.name), module, plots / "attention"):
        logger.log_artifact(str(png), "attention")
    write_run_record(Path(cfg.paths.runs) / f"{cfg.model.name}.json", logger.run_id,
                     cfg.mlflow.tracking_uri, cfg.mlflow.experiment, best_path, root=cfg.paths.root)
    (Path(cfg.paths.checkpoints) / f"{LAST}.ckpt").unlink(missing_ok=True)  # finished: nothing to resume
    print(summaries.train_summary(cfg, trainer, logger, best_path, averaged=averaged))


if __name__ == "__main__":
    main()
