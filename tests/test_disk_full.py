"""A disk that fills while training writes a checkpoint (attnlab.lit.checkpoints.AtomicCheckpointIO).

The checkpoint folder is a real 8 MB tmpfs; the training process fills it when epoch 2
starts, leaving half a checkpoint free, so the best checkpoint of epoch 2 meets a full disk.
The run stops with one line that names the file, the cause and the fix; epoch 1's
``best.ckpt`` keeps its bytes and loads; freeing the space and running the same command
resumes and finishes. (Lightning's own writer staged the file in the system's temporary
folder and copied it over ``best.ckpt``: a disk that filled during the copy left a truncated
``best.ckpt``.)
"""

from __future__ import annotations

import re

import pytest
import torch

from attnlab.files import FileWriteError
from attnlab.lit.checkpoints import AtomicCheckpointIO
from helpers.small_disk import FILLER, fill, tmpfs, train_filling
from helpers.tiny_train import STEPS_PER_EPOCH, make_project, mlflow_client, runs, train


def test_the_checkpoint_writer_keeps_the_old_file_when_the_new_one_does_not_fit(tmp_path):
    io = AtomicCheckpointIO()
    with tmpfs(tmp_path / "disk", "1m") as disk:
        path = disk / "best.ckpt"
        io.save_checkpoint({"epoch": 0, "w": torch.zeros(50_000)}, path)  # 200 kB
        io.save_checkpoint({"epoch": 1, "w": torch.ones(50_000)}, f"file://{path}")  # whole, replaced
        old = path.read_bytes()
        assert torch.load(path, weights_only=True)["epoch"] == 1
        fill(disk, 100_000)  # room for half a checkpoint beside the old one
        with pytest.raises(
            FileWriteError, match=re.escape(f"could not write {path} (No space left on device")
        ):
            io.save_checkpoint({"epoch": 2, "w": torch.ones(50_000)}, path)
        assert path.read_bytes() == old
        assert sorted(p.name for p in disk.iterdir()) == ["best.ckpt", FILLER]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("project"))


def test_a_full_disk_keeps_the_best_checkpoint_and_the_run_resumes(project, tmp_path):
    keep = tmp_path / "epoch1-best.ckpt"
    with tmpfs(tmp_path / "checkpoints", "8m") as folder:
        args = (f"paths.checkpoints={folder}", "trainer.max_epochs=2")
        result = train_filling(project, 1, keep, *args)

        assert result.returncode == 1
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        best, last = folder / "best.ckpt", folder / "last.ckpt"
        assert result.stderr.strip().splitlines()[-1] == (
            f"transformer: training stopped at step {2 * STEPS_PER_EPOCH}: could not write {best} "
            f"(No space left on device: the disk is full); it is as it was. To go on, free space on the "
            f"disk that holds {folder} (`df -h {folder}`); then run the same command (or `dvc repro`) "
            f"to resume from {last}"
        )
        assert best.read_bytes() == keep.read_bytes()  # epoch 1's, byte for byte
        assert torch.load(best, map_location="cpu", weights_only=True)["epoch"] == 0
        assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == STEPS_PER_EPOCH
        assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", FILLER, "last.ckpt"]  # no temp file
        assert not (project / "runs/transformer.json").exists()
        (run,) = runs(mlflow_client(project))
        assert run.info.status == "FAILED"

        (folder / FILLER).unlink()
        again = train(project, *args)
        assert again.returncode == 0, again.stderr[-3000:]
        assert torch.load(best, map_location="cpu", weights_only=True)["epoch"] == 1
        assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt"]  # finished: last.ckpt removed
        (resumed,) = runs(mlflow_client(project))  # the same MLflow run, finished
        assert (resumed.info.run_id, resumed.info.status) == (run.info.run_id, "FINISHED")
