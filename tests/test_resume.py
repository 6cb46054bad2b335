"""Resume after a kill, and determinism: real `src/train.py` runs on the tiny corpus.

An uninterrupted run is the reference. A second run is killed (SIGTERM or SIGKILL)
right after its first mid-epoch `last.ckpt`; the same command then resumes it and
must end with the reference's final validation loss (to 1e-6) and weights, in the
same MLflow run. Two uninterrupted runs with the same seed give bit-identical metrics.
Which config changes stop a resume is checked on the real conf/, composed with Hydra.
"""

import csv
import signal
import subprocess
import time

import pytest
import torch
from hydra import compose, initialize_config_dir

from attnlab.lit.resume import config_fingerprint, find_resume_point
from helpers.tiny_train import (
    ROOT,
    STEPS_PER_EPOCH,
    copy_project,
    env,
    history,
    make_project,
    mlflow_client,
    runs,
    train,
    train_cmd,
)

ARGS = ("trainer.max_epochs=2", "checkpoint.every_n_train_steps=3")
METRICS = ("train_loss", "val_loss", "val_bleu")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("reference"))
    result = train(root, *ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def _final_weights(root):
    ckpt = torch.load(root / "checkpoints/transformer/best.ckpt", map_location="cpu", weights_only=True)
    return ckpt["state_dict"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_run_resumes_to_the_same_result(reference, tmp_path, sig):
    root = copy_project(reference, tmp_path / "project")
    last = root / "checkpoints/transformer/last.ckpt"
    proc = subprocess.Popen(
        train_cmd(root, *ARGS), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) != 0, "the run finished before it could be killed"
    killed = torch.load(last, map_location="cpu", weights_only=True)
    assert killed["global_step"] % STEPS_PER_EPOCH != 0, "the kill should land mid-epoch"
    killed_run = killed["callbacks"]["ResumeState"]["run_id"]
    assert not (root / "runs/transformer.json").exists()  # nothing claims the run is done

    resumed = train(root, *ARGS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    epoch = killed["epoch"] + 1  # Lightning counts from 0, the console from 1; a mid-epoch kill resumes in it
    assert (
        f"resuming from {last} (saved in epoch {epoch}, after step {killed['global_step']})" in resumed.stdout
    )
    assert f"resuming in epoch {epoch}" in resumed.stdout
    assert not last.exists()  # finished: nothing left to resume

    client, ref_client = mlflow_client(root), mlflow_client(reference)
    (run,) = runs(client)  # the same MLflow run, continued
    assert run.info.run_id == killed_run and run.info.status == "FINISHED"
    (ref_run,) = runs(ref_client)
    final = history(client, killed_run, "val_loss")[-1]
    ref_final = history(ref_client, ref_run.info.run_id, "val_loss")[-1]
    assert final[0] == ref_final[0] == 2 * STEPS_PER_EPOCH - 1
    assert final[1] == pytest.approx(ref_final[1], abs=1e-6)
    weights, ref_weights = _final_weights(root), _final_weights(reference)
    assert weights.keys() == ref_weights.keys()
    for k in weights:
        torch.testing.assert_close(weights[k], ref_weights[k], rtol=0, atol=1e-6, msg=k)
    # plots/transformer (a persistent DVC output) holds both epochs' rows, as if uninterrupted.
    # (train_loss of the interrupted epoch averages only the resumed batches.)
    got, want = (
        list(csv.DictReader((r / "plots/transformer/history.csv").open())) for r in (root, reference)
    )
    assert [r["epoch"] for r in got] == [r["epoch"] for r in want] == ["1", "2"]
    for key in ("val_loss", "val_bleu"):
        assert [float(r[key]) for r in got] == pytest.approx([float(r[key]) for r in want], abs=1e-6)


def test_same_seed_same_metrics_bit_for_bit(reference, tmp_path):
    root = copy_project(reference, tmp_path / "project")
    result = train(root, *ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,), (ref_run,) = runs(mlflow_client(root)), runs(mlflow_client(reference))
    assert run.data.params["seed"] == ref_run.data.params["seed"] == "0"
    for key in METRICS:
        got = history(mlflow_client(root), run.info.run_id, key)
        want = history(mlflow_client(reference), ref_run.info.run_id, key)
        assert len(got) == 2 and got == want, key  # exact floats, per epoch


def test_another_config_does_not_resume(reference, tmp_path):
    """A last.ckpt written with another config is ignored, not silently continued."""
    root = copy_project(reference, tmp_path / "project")
    proc = subprocess.Popen(
        train_cmd(root, *ARGS), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    last = root / "checkpoints/transformer/last.ckpt"
    while not last.exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    result = train(
        root, *ARGS[:1], "checkpoint.every_n_train_steps=3", "optimizer.lr=0.002", "trainer.max_steps=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"ignoring {last}: written with another config; starting afresh" in result.stdout
    assert len(runs(mlflow_client(root))) == 2  # a new MLflow run, the killed one left as it was


def _fingerprint(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return config_fingerprint(
            compose(config_name="config", overrides=["paths.root=/r", "model=transformer", *overrides])
        )


def test_fingerprint_ignores_heatmaps_but_not_what_is_trained():
    """heatmaps.* only picks the attention maps drawn: changing it between a kill and the
    re-run still resumes. The batch size in tokens and the learning rate change the training."""
    base = _fingerprint("heatmaps.sentences=[0,1,2]")
    assert _fingerprint("heatmaps.sentences=[5]") == base
    assert _fingerprint("heatmaps.sentences=[5]", "heatmaps.epoch_kinds=[alignment]") == base
    assert _fingerprint("heatmaps.sentences=[0,1,2]", "data.path=/elsewhere/data/raw") == base  # moved
    assert _fingerprint("model.max_tokens=1200") != base
    assert _fingerprint("optimizer.lr=0.002") != base


def test_a_checkpoint_of_another_tokenizer_is_not_resumed(tmp_path):
    """Another corpus of the same pair, tokenized into the same folder since the kill: the
    same config, but last.ckpt's embeddings index another vocabulary. Resuming would crash on
    the shapes, or (same size) go on with the wrong pieces: it starts afresh, saying why."""
    last = tmp_path / "last.ckpt"
    record = {"file": "spm.model", "sha256": "a" * 64, "folder": "/p/data/tokenized/parallel-zh-en"}
    torch.save(
        {
            "epoch": 0,
            "global_step": 3,
            "callbacks": {"ResumeState": {"fingerprint": "f", "run_id": "r1"}},
            "tokenizer": record,
        },
        last,
    )
    resume, why = find_resume_point(tmp_path, "f", {**record, "sha256": "b" * 64})
    assert resume is None
    assert why == (
        f"ignoring {last}: trained with another spm.model (sha256 aaaaaaaaaaaa…, now bbbbbbbbbbbb…): "
        "the corpus was tokenized anew since; starting afresh"
    )
    for same in (record, None):  # the same file, or a run without a corpus (NW)
        resume, why = find_resume_point(tmp_path, "f", same)
        assert (resume.path, resume.run_id) == (last, "r1") and why.startswith(f"resuming from {last}")
