"""Run ``src/train.py`` on the tiny corpus of :mod:`corpus_fixture` (a real Hydra app in a subprocess).

``make_project(root)`` writes the corpus under ``root/data/raw`` and runs the real
tokenize stage; ``train_cmd(root, ...)`` is the command line of a tiny Transformer
(d_model 32, 8 batches of at most 40 tokens per epoch) that trains in seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.corpus_fixture import write_mirror

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model=transformer",
    "device=cpu",
    "model.net.d_model=32",
    "model.net.ffn_hidden=64",
    "model.max_tokens=40",
    "model.warmup_steps=5",
    "data.vocab_size=150",
    "data.val_bleu_sentences=4",
    "trainer.enable_progress_bar=false",
    "trainer.deterministic=true",
    # matplotlib takes about a second per heatmap: one sentence, none per epoch (tests that
    # check the per-epoch maps ask for them)
    "heatmaps.sentences=[0]",
    "heatmaps.epoch_kinds=[]",
]
STEPS_PER_EPOCH = 8  # the 40 training pairs in batches of at most 40 padded tokens


def make_project(root: Path) -> Path:
    """Tiny corpus under ``root/data/raw`` and its tokenized folder (real tokenize stage)."""
    write_mirror(root / "data/raw")
    subprocess.run(
        [
            sys.executable,
            "src/tokenize_data.py",
            f"paths.root={root}",
            "data.vocab_size=150",
            f"hydra.run.dir={root}/outputs/tokenize",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env=env(),
    )
    return root


def copy_project(src: Path, dst: Path) -> Path:
    """A second project with the same tokenized data (no checkpoints, no MLflow store)."""
    shutil.copytree(src / "data", dst / "data")
    return dst


def env(**extra: str) -> dict:
    out = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out.update(extra)
    return out


def train_cmd(root: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "src/train.py",
        *TINY,
        f"paths.root={root}",
        f"hydra.run.dir={root}/outputs/run",
        *overrides,
    ]


def train(root: Path, *overrides: str, timeout: int = 300, **extra_env: str) -> subprocess.CompletedProcess:
    """Run the tiny training to the end; returns the finished process (output captured)."""
    return subprocess.run(
        train_cmd(root, *overrides),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(**extra_env),
    )


def mlflow_client(root: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")


def runs(client, experiment: str = "attnlab") -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a metric, in logging order."""
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


# A training process that kills itself at a chosen point: ``python -c KILL_HOOK <point> src/train.py ...``.
# No sleeps, no races: the hook runs inside the process, at the exact point.
# Points: ``step:N`` SIGKILL right after last.ckpt at global step N is written (mid-epoch);
# ``epoch:E`` SIGTERM right after epoch E's last.ckpt, written after its validation (Lightning
# stops at the end of the epoch, exit status 1 from train.py); ``validating:E`` SIGKILL at epoch E's first
# validation batch.
KILL_HOOK = r"""
import os, runpy, signal, sys
import pytorch_lightning as pl

kind, n = sys.argv[1].split(":")
n = int(n)
sys.argv = sys.argv[2:]
save = pl.Trainer.save_checkpoint


def save_checkpoint(self, filepath, *args, **kwargs):
    save(self, filepath, *args, **kwargs)
    if os.path.basename(str(filepath)) != "last.ckpt":
        return
    if kind == "step" and self.global_step == n:
        os.kill(os.getpid(), signal.SIGKILL)
    # Lightning writes the epoch's checkpoints at on_train_epoch_end (after the epoch's
    # validation, once the epoch counts as processed).
    if kind == "epoch" and self.fit_loop.epoch_progress.current.processed == n:
        os.kill(os.getpid(), signal.SIGTERM)


class KillWhileValidating(pl.Callback):
    def on_validation_batch_start(self, trainer, *args, **kwargs):
        if kind == "validating" and not trainer.sanity_checking and trainer.current_epoch == n - 1:
            os.kill(os.getpid(), signal.SIGKILL)


init = pl.Trainer.__init__


def __init__(self, *args, callbacks=None, **kwargs):
    init(self, *args, callbacks=[*(callbacks or []), KillWhileValidating()], **kwargs)


pl.Trainer.save_checkpoint, pl.Trainer.__init__ = save_checkpoint, __init__
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def train_killed(root: Path, point: str, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the tiny training until it kills itself at ``point`` (see ``KILL_HOOK``)."""
    cmd = train_cmd(root, *overrides)
    return subprocess.run(
        [cmd[0], "-c", KILL_HOOK, point, *cmd[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )
