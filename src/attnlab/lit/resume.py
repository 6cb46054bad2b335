"""Resuming an interrupted training run: the last checkpoint, its config fingerprint, RNG state.

``train.py`` keeps ``checkpoints/<model>/last.ckpt`` (every epoch and every
``checkpoint.every_n_train_steps`` steps; a DVC ``persist: true`` output, so
``dvc repro`` does not delete it). When the same command runs again, the
checkpoint resumes training only if it was written with the same config
(:func:`config_fingerprint`); it carries the MLflow run id, so the run
continues in the same MLflow run, and the RNG state, so dropout draws the
same masks as an uninterrupted run. The finished run deletes ``last.ckpt``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf

LAST = "last"

# Config keys that do not change what is trained: where files go, the tracking store,
# which attention maps are drawn, how often the resume checkpoint is written, console output.
_IGNORED = ("paths", "mlflow", "hydra", "heatmaps")
_IGNORED_NESTED = (("checkpoint", "every_n_train_steps"), ("trainer", "enable_progress_bar"))


def config_fingerprint(cfg: DictConfig) -> str:
    """SHA-256 (hex) of the resolved config minus keys that do not change the training."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in _IGNORED:
        plain.pop(key, None)
    for outer, inner in _IGNORED_NESTED:
        plain.get(outer, {}).pop(inner, None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()


class ResumeState(pl.Callback):
    """Saves, in every checkpoint, the config fingerprint, the MLflow run id and the RNG
    state (torch CPU, and CUDA when present) at the moment of saving; restores the RNG
    state when training resumes, so the resumed run draws what the uninterrupted run
    would have drawn.

    Args:
        fingerprint: :func:`config_fingerprint` of the run's config.
        logger: the run's MLflow logger (its ``run_id`` is read when a checkpoint is saved).
    """

    def __init__(self, fingerprint: str, logger):
        self.fingerprint, self.logger = fingerprint, logger
        self._rng: dict | None = None

    def state_dict(self) -> dict:
        state = {"fingerprint": self.fingerprint, "run_id": self.logger.run_id,
                 "torch_rng": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict) -> None:
        self._rng = state

    def on_train_start(self, trainer, pl_module) -> None:
        # After Lightning restored everything else, right before the first resumed batch.
        if self._rng is not None:
            torch.set_rng_state(self._rng["torch_rng"])
            if "cuda_rng" in self._rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(self._rng["cuda_rng"])
            self._rng = None


@dataclass
class ResumePoint:
    """A checkpoint to resume from (``path``) and the MLflow run to continue (``run_id``)."""
    path: Path
    run_id: str | None


def find_resume_point(checkpoint_dir: Path, fingerprint: str) -> tuple[ResumePoint | None, str]:
    """The resume point in ``checkpoint_dir`` for a run with ``fingerprint``, and why (one line).

    ``last.ckpt`` is used only when its :class:`ResumeState` fingerprint matches;
    a checkpoint of another config, an unreadable one or one without the state is
    ignored (training starts afresh and will overwrite it), and the reason says so.
    """
    path = Path(checkpoint_dir) / f"{LAST}.ckpt"
    if not path.exists():
        return None, ""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        state = ckpt["callbacks"][ResumeState.__qualname__]
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint means: start afresh
        return None, f"ignoring {path}: not a resumable checkpoint ({type(e).__name__}: {e}); starting afresh"
    if state.get("fingerprint") != fingerprint:
        return None, f"ignoring {path}: written with another config; starting afresh"
    return (ResumePoint(path, state.get("run_id")),
            f"resuming from {path} (epoch {ckpt.get('epoch')}, step {ckpt.get('global_step')}), "
            f"MLflow run {state.get('run_id')}")
