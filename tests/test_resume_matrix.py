"""Exact resume from every kind of checkpoint, in the same folder and in a moved one.

One uninterrupted run is the reference. Each cell kills a second run at a fixed point,
inside the process (``tiny_train.KILL_HOOK``: no sleeps, no races), optionally moves the
whole project with ``shutil.move`` (a cloned or moved project: every absolute path
changes), and runs the same command again. The resumed run must log the reference's
per-epoch ``val_loss`` (MLflow, with the same steps, and plots/…/history.csv) to 1e-6,
keep the same epoch in ``best.ckpt`` with the same best score, and continue the same
MLflow run.

A learning rate of 0.1 makes epoch 3 worse than epoch 2, so a resumed run that forgot
the best score (Lightning drops it when the checkpoint folder moved) keeps epoch 3.
"""

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers.tiny_train import (
    STEPS_PER_EPOCH,
    copy_project,
    history,
    make_project,
    mlflow_client,
    runs,
    train,
    train_killed,
)

ARGS = ("trainer.max_epochs=3", "optimizer.lr=0.1", "model.net.num_layers=1", "heatmaps.sentences=[]")
STEPS = "checkpoint.every_n_train_steps=4"  # a step checkpoint mid-epoch and at each epoch's last batch
KEPT = (
    "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, "
    "'every_n_epochs': 1, 'train_time_interval': None}"
)
# kill point → (hook point, step checkpoints, (epoch, global step) of the last.ckpt resumed from)
KILLS = {
    "mid-epoch": ("step:20", STEPS, (2, 20)),
    # Lightning writes the epoch's checkpoint at on_train_epoch_end, after its validation.
    "after-validation": ("epoch:2", "checkpoint.every_n_train_steps=0", (1, 16)),
    # Step 24 is epoch 3's last batch: its step checkpoint is skipped (ResumableCheckpoint), so
    # the run resumes at step 20 and validates epoch 3 again.
    "during-validation": ("validating:3", STEPS, (2, 20)),
}


def _val_losses(root):
    client = mlflow_client(root)
    (run,) = runs(client)
    return run, history(client, run.info.run_id, "val_loss")


def _csv(root):
    return [
        (int(r["epoch"]), int(r["step"]), float(r["val_loss"]))
        for r in csv.DictReader((root / "plots/transformer/history.csv").open())
    ]


def _best(root):
    ckpt = torch.load(root / "checkpoints/transformer/best.ckpt", map_location="cpu", weights_only=True)
    return ckpt["epoch"], ckpt["global_step"], ckpt["callbacks"][KEPT]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("reference"))
    result = train(root, *ARGS, STEPS)
    assert result.returncode == 0, result.stderr[-3000:]
    _, losses = _val_losses(root)
    assert [s for s, _ in losses] == [STEPS_PER_EPOCH * e - 1 for e in (1, 2, 3)]
    epoch, _, _ = _best(root)
    assert epoch == 1 and losses[2][1] > losses[1][1], "the reference's epoch 3 should be worse than epoch 2"
    return root


@pytest.mark.parametrize("place", ["same-folder", "moved-folder"])
@pytest.mark.parametrize("kill", list(KILLS))
def test_resume_reproduces_the_uninterrupted_run(reference, tmp_path, kill, place):
    point, steps, (epoch, step) = KILLS[kill]
    root = copy_project(reference, tmp_path / "project")
    killed = train_killed(root, point, *ARGS, steps)
    assert killed.returncode != 0, f"the run was not stopped at {point}"
    last = torch.load(root / "checkpoints/transformer/last.ckpt", map_location="cpu", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (epoch, step)
    killed_run = last["callbacks"]["ResumeState"]["run_id"]
    if place == "moved-folder":
        root = shutil.move(root, tmp_path / "moved")

    resumed = train(root, *ARGS, steps)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = [line for line in resumed.stdout.splitlines() if "resuming from" in line or "ignoring" in line]
    # Lightning's checkpoint counts epochs from 0, the line from 1 (as the console's epoch lines)
    assert any(f"(saved in epoch {epoch + 1}, after step {step})" in line for line in said), said
    assert "dirpath has changed" not in resumed.stderr

    run, losses = _val_losses(root)
    ref_run, ref_losses = _val_losses(reference)
    assert run.info.run_id == killed_run and run.info.status == "FINISHED"
    assert [s for s, _ in losses] == [s for s, _ in ref_losses]
    assert [v for _, v in losses] == pytest.approx([v for _, v in ref_losses], abs=1e-6)
    got, want = _csv(root), _csv(reference)
    assert [r[:2] for r in got] == [r[:2] for r in want]
    assert [r[2] for r in got] == pytest.approx([r[2] for r in want], abs=1e-6)

    (best_epoch, best_step, state), (ref_epoch, ref_step, ref_state) = _best(root), _best(reference)
    assert (best_epoch, best_step) == (ref_epoch, ref_step)
    assert float(state["best_model_score"]) == pytest.approx(float(ref_state["best_model_score"]), abs=1e-6)
    # The run record points at this project's best.ckpt and store (paths relative to runs/).
    record = json.loads((root / "runs/transformer.json").read_text())
    assert (record["checkpoint"], record["tracking_db"]) == (
        "../checkpoints/transformer/best.ckpt",
        "../mlflow.db",
    )
    # The run's artifacts are in this project's mlruns/, even after a move; the old place is not recreated.
    assert run.info.artifact_uri.startswith(f"{root}/mlruns/"), run.info.artifact_uri
    assert [f.path for f in mlflow_client(root).list_artifacts(run.info.run_id, "checkpoint")] == [
        "checkpoint/best.ckpt"
    ]
    assert (Path(root) / "mlruns").is_dir()
    if place == "moved-folder":
        assert not (tmp_path / "project").exists(), "the old project folder was recreated"


def test_checkpoint_state_is_rebased_onto_a_moved_folder(tmp_path):
    """Unit check of ResumableCheckpoint: Lightning's key, and the paths re-based, not dropped."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    from attnlab.lit.resume import ResumableCheckpoint

    old, new = "/old/project/checkpoints/transformer", str(tmp_path / "checkpoints/transformer")
    kwargs = {"monitor": "val_loss", "mode": "min", "save_top_k": 1}
    cb = ResumableCheckpoint(dirpath=new, filename="best", **kwargs)
    assert cb.state_key == ModelCheckpoint(dirpath=new, filename="best", **kwargs).state_key == KEPT
    score = torch.tensor(2.9141)
    cb.load_state_dict(
        {
            "monitor": "val_loss",
            "best_model_score": score,
            "best_model_path": f"{old}/best.ckpt",
            "current_score": score,
            "dirpath": old,
            "best_k_models": {f"{old}/best.ckpt": score},
            "kth_best_model_path": f"{old}/best.ckpt",
            "kth_value": score,
            "last_model_path": "/elsewhere/last.ckpt",
        }
    )
    assert cb.best_model_score == score and cb.kth_value == score
    assert cb.best_model_path == cb.kth_best_model_path == f"{new}/best.ckpt"
    assert cb.best_k_models == {f"{new}/best.ckpt": score}
    assert cb.last_model_path == "/elsewhere/last.ckpt"  # not under the old folder: kept as it was
