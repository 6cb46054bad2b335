"""A small real filesystem to fill: a tmpfs mounted for a test (root only), and a training
process that fills it itself at a chosen moment.

``tmpfs(path, size)`` mounts a tmpfs of ``size`` at ``path`` for the block and unmounts it
after; where mounting is not permitted (not root, no CAP_SYS_ADMIN) the test is skipped,
saying so. ``fill(folder, leave)`` writes a file that leaves ``leave`` bytes free.
``train_filling(root, epoch, keep, ...)`` runs the tiny training of :mod:`tiny_train` with
``FILL_HOOK``: when epoch ``epoch`` (0-based) starts, it copies ``best.ckpt`` to ``keep`` and
fills the checkpoint folder's disk, leaving half of ``best.ckpt``'s size free, so the next
checkpoint the run writes meets a full disk (a real ``ENOSPC``).
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.tiny_train import ROOT, env, train_cmd

FILLER = "filler"


@contextmanager
def tmpfs(path: Path, size: str = "8m"):
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mount.stderr.strip()}): run the test as root")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def fill(folder: Path, leave: int) -> Path:
    """Write ``folder/filler`` so that ``leave`` bytes stay free on its disk."""
    path = Path(folder) / FILLER
    with open(path, "wb") as f:
        f.write(b"\0" * (free_bytes(folder) - leave))
    return path


FILL_HOOK = r"""
import os, runpy, shutil, sys
import pytorch_lightning as pl

epoch, keep = int(sys.argv[1]), sys.argv[2]
sys.argv = sys.argv[3:]


class FillDisk(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch != epoch:
            return
        folder = trainer.checkpoint_callback.dirpath
        best = os.path.join(folder, "best.ckpt")
        shutil.copyfile(best, keep)
        st = os.statvfs(folder)
        with open(os.path.join(folder, "filler"), "wb") as f:
            f.write(b"\0" * (st.f_bavail * st.f_frsize - os.path.getsize(best) // 2))


init = pl.Trainer.__init__


def __init__(self, *args, callbacks=None, **kwargs):
    init(self, *args, callbacks=[*(callbacks or []), FillDisk()], **kwargs)


pl.Trainer.__init__ = __init__
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def train_filling(
    root: Path, epoch: int, keep: Path, *overrides: str, timeout: int = 300
) -> subprocess.CompletedProcess:
    """The tiny training, filling its checkpoint disk when epoch ``epoch`` (0-based) starts."""
    cmd = train_cmd(root, *overrides)
    return subprocess.run(
        [cmd[0], "-c", FILL_HOOK, str(epoch), str(keep), *cmd[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )
