"""Resuming an interrupted training run: the last checkpoint, its config fingerprint, RNG state.

``train.py`` keeps ``checkpoints/<model>/last.ckpt`` (every epoch and every
``checkpoint.every_n_train_steps`` steps; a DVC ``persist: true`` output, so
``dvc repro`` does not delete it). When the same command runs again, the
checkpoint resumes training only if it was written with the same config
(:func:`config_fingerprint`); it carries the MLflow run id, so the run
continues in the same MLflow run, and the RNG state, so dropout draws the
same masks as an uninterrupted run. The finished run deletes ``last.ckpt``.
:class:`ResumableCheckpoint` keeps the best score and path across a moved or cloned
project and never writes a step checkpoint that would skip an epoch's validation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint

from attnlab.checkpoint import TOKENIZER_KEY, changed_record
from attnlab.errors import brief
from attnlab.files import rebase

LAST = "last"

# Config keys that do not change what is trained: where files go, the tracking store,
# which attention maps are drawn, how often the resume checkpoint is written, console output.
_IGNORED = ("paths", "mlflow", "hydra", "heatmaps")
_IGNORED_NESTED = (
    ("checkpoint", "every_n_train_steps"),
    ("trainer", "enable_progress_bar"),
    ("callbacks", "console"),
    # where the corpus lies (absolute: a moved project resumes); what it holds is checked by
    # find_resume_point against the tokenizer the checkpoint records
    ("data", "path"),
    ("data", "tokenizer_from"),
)


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
        state = {
            "fingerprint": self.fingerprint,
            "run_id": self.logger.run_id,
            "torch_rng": torch.get_rng_state(),
        }
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


def find_resume_point(
    checkpoint_dir: Path, fingerprint: str, tokenizer: dict | None = None
) -> tuple[ResumePoint | None, str]:
    """The resume point in ``checkpoint_dir`` for a run with ``fingerprint``, and why (one line).

    ``last.ckpt`` is used only when its :class:`ResumeState` fingerprint matches, and, when
    ``tokenizer`` (:func:`attnlab.checkpoint.tokenizer_record` of this run's corpus) and the
    checkpoint both record one, its tokenizer file is the same (sha256): a corpus tokenized
    anew into the same folder (another corpus of the same pair) starts afresh. A checkpoint
    of another config or tokenizer, an unreadable one or one without the state is ignored
    (training starts afresh and will overwrite it), and the reason says so.
    """
    path = Path(checkpoint_dir) / f"{LAST}.ckpt"
    if not path.exists():
        return None, ""
    try:
        if (record := changed_record(path)) is not None:
            raise ValueError(f"the bytes of its record {record} changed after it was written")
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        state = ckpt["callbacks"][ResumeState.__qualname__]
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint means: start afresh
        return None, f"ignoring {path}: not a resumable checkpoint ({brief(e)}); starting afresh"
    if state.get("fingerprint") != fingerprint:
        return None, f"ignoring {path}: written with another config; starting afresh"
    theirs = ckpt.get(TOKENIZER_KEY)
    if tokenizer and theirs and theirs.get("sha256") != tokenizer["sha256"]:
        return None, (
            f"ignoring {path}: trained with another {theirs.get('file')} (sha256 "
            f"{str(theirs.get('sha256'))[:12]}…, now {tokenizer['sha256'][:12]}…): the corpus was "
            "tokenized anew since; starting afresh"
        )
    epoch = ckpt["epoch"] + 1  # Lightning counts epochs from 0, the console's lines from 1
    return (
        ResumePoint(path, state.get("run_id")),
        f"resuming from {path} (saved in epoch {epoch}, after step {ckpt['global_step']}), "
        f"MLflow run {state.get('run_id')}",
    )


class ResumableCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` that resumes exactly, also in a moved or cloned project.

    Two differences, both from Lightning 2.6's behaviour:

    * **Moved folder.** ``ModelCheckpoint.load_state_dict`` drops ``best_model_score``,
      ``best_k_models``, ``kth_*`` and ``last_model_path`` when the checkpoint's ``dirpath``
      differs from the current one (it warns "The dirpath has changed"), and the next
      validation then replaces the best checkpoint with a worse one. Here every saved path
      under the old ``dirpath`` is re-based onto the current ``dirpath`` first, so the state
      is reloaded whole (paths elsewhere are kept as they are).
    * **Last batch.** A step checkpoint written at ``on_train_batch_end`` of an epoch's last
      batch resumes as a finished epoch: Lightning's fit loop then skips that epoch's
      validation (``FitLoop.reset``: ``restarted_on_train_batch_end`` and ``is_last_batch``),
      so its ``val_loss`` is never logged nor compared for the best checkpoint. Step
      checkpoints skip that batch; the epoch's own checkpoint follows its validation.

    The state key is Lightning's (``ModelCheckpoint{...}``), so checkpoints written with
    the plain class resume too; the state holds only strings, floats and tensors
    (``torch.load(weights_only=True)`` reads it).
    """

    @property
    def state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def load_state_dict(self, state_dict: dict) -> None:
        old, new = state_dict.get("dirpath"), self.dirpath
        if old and new and old != new:
            state_dict = {
                **state_dict,
                "dirpath": new,
                "best_k_models": {
                    rebase(k, old, new) or k: v for k, v in state_dict.get("best_k_models", {}).items()
                },
            }
            for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
                if key in state_dict:
                    state_dict[key] = rebase(state_dict[key], old, new) or state_dict[key]
        super().load_state_dict(state_dict)
