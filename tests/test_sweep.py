"""Hydra sweeps in MLflow (attnlab.sweep): real `src/train.py -m` runs on the tiny corpus.

`python src/train.py -m model.net.d_model=16,32` is one MLflow parent run with one child
run per job: each child carries the tag `mlflow.parentRunId` (MLflow's nesting), its own
swept value in its params and its own val_loss history, and writes its checkpoint in its
own job dir, never in the project's checkpoints/ or runs/ (the DVC outputs). The parent
ends FINISHED when every job succeeded, FAILED when one failed. A single run (no -m) is
not nested and writes where it always did.
"""
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from attnlab import sweep
from attnlab.sweep import (PARENT_TAG, MLflowSweepCallback, SweepConfigError, _create_once, _parent_name,
                           _refuse_subprocess_ddp, ensure_parent, read_parents, redirect_outputs,
                           swept_overrides)
from tiny_train import ROOT, copy_project, env, history, make_project, mlflow_client, runs, train_cmd

# One epoch, one heatmap sentence, no per-epoch heatmaps: the jobs train in seconds.
FAST = ("trainer.max_epochs=1", "heatmaps.sentences=[0]", "heatmaps.epoch_kinds=[]")


def sweep_cmd(root, sweep_dir, *overrides) -> list[str]:
    cmd = train_cmd(root, *FAST, *overrides, f"hydra.sweep.dir={sweep_dir}")
    cmd.insert(2, "-m")  # python src/train.py -m ...
    return cmd


def split(all_runs):
    """(the parent runs, the child runs sorted by job number)."""
    parents = [r for r in all_runs if PARENT_TAG not in r.data.tags]
    children = [r for r in all_runs if PARENT_TAG in r.data.tags]
    return parents, sorted(children, key=lambda r: int(r.data.tags["sweep.job"]))


@dataclass
class Done:
    root: Path
    returncode: int
    stderr: str


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> dict[str, Done]:
    """Three real runs, each in its own copy of a tiny project, started together (one torch
    thread each): ``good``, a sweep of 2 jobs (``model.net.d_model=16,32``, sweep dir
    ``multirun/d_model``); ``failing``, a sweep whose job 0 raises; ``single``, no -m."""
    base = tmp_path_factory.mktemp("sweep")
    project = make_project(base / "good")
    roots = {"good": project, "failing": copy_project(project, base / "failing"),
             "single": copy_project(project, base / "single")}
    cmds = {"good": sweep_cmd(project, project / "multirun/d_model", "model.net.d_model=16,32"),
            "failing": sweep_cmd(roots["failing"], roots["failing"] / "multirun/failing",
                                 "checkpoint.filename=last,best"),
            "single": train_cmd(roots["single"], *FAST)}
    procs = {}
    for name, cmd in cmds.items():
        with open(base / f"{name}.out", "w") as out, open(base / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, env=env(OMP_NUM_THREADS="1"))
    try:
        codes = {name: p.wait(timeout=300) for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    return {name: Done(roots[name], codes[name], (base / f"{name}.err").read_text()) for name in cmds}


@pytest.fixture(scope="module")
def good_sweep(done):
    good = done["good"]
    assert good.returncode == 0, good.stderr[-3000:]
    return good.root, good.root / "multirun/d_model"


def test_a_sweep_is_one_parent_run_with_one_child_run_per_job(good_sweep):
    root, sweep_dir = good_sweep
    parents, children = split(runs(mlflow_client(root)))
    assert len(parents) == 1 and len(children) == 2
    [parent] = parents
    assert parent.info.run_name == "sweep-d_model"
    assert "model.net.d_model=16,32" in parent.data.tags["sweep.overrides"].split()
    assert parent.data.tags["sweep.dir"] == str(sweep_dir)
    assert [c.data.tags[PARENT_TAG] for c in children] == [parent.info.run_id] * 2
    assert [c.info.run_name for c in children] == ["transformer-multi30k-en-fr-seed0-job0 model.net.d_model=16",
                                                   "transformer-multi30k-en-fr-seed0-job1 model.net.d_model=32"]
    assert [c.data.tags["model"] for c in children] == ["transformer"] * 2
    assert parent.data.tags["model"] == "transformer"  # not swept: the jobs' model
    [record] = read_parents(sweep_dir)  # the id every job read from the sweep dir
    assert record["run_id"] == parent.info.run_id


def test_every_job_succeeded_so_every_run_is_finished(good_sweep):
    root, _ = good_sweep
    parents, children = split(runs(mlflow_client(root)))
    assert [r.info.status for r in parents + children] == ["FINISHED"] * 3


def test_each_child_logs_its_own_swept_value_and_val_loss_history(good_sweep):
    root, _ = good_sweep
    client = mlflow_client(root)
    _, children = split(runs(client))
    # Lightning's MLFlowLogger flattens the resolved config with "/"
    assert [c.data.params["model/net/d_model"] for c in children] == ["16", "32"]
    histories = [history(client, c.info.run_id, "val_loss") for c in children]
    assert [len(h) for h in histories] == [1, 1]  # one epoch, one validation each
    assert histories[0] != histories[1]  # different models, different losses


def test_each_job_writes_in_its_own_dir_and_not_in_the_projects_outputs(good_sweep):
    root, sweep_dir = good_sweep
    _, children = split(runs(mlflow_client(root)))
    for job, child in enumerate(children):
        job_dir = sweep_dir / str(job)
        assert (job_dir / "checkpoints/transformer/best.ckpt").is_file()
        assert not (job_dir / "checkpoints/transformer/last.ckpt").exists()  # finished: deleted
        record = json.loads((job_dir / "runs/transformer.json").read_text())
        assert record["run_id"] == child.info.run_id
        best = (job_dir / "checkpoints/transformer/best.ckpt").resolve()
        assert (job_dir / "runs" / record["checkpoint"]).resolve() == best  # stored relative to runs/
        assert child.data.params["paths/checkpoints"] == str(job_dir / "checkpoints/transformer")
    for dvc_out in ("checkpoints", "runs", "plots"):
        assert not (root / dvc_out).exists(), dvc_out


def test_a_failed_job_leaves_the_parent_failed(done):
    """Job 0 raises (checkpoint.filename=last is reserved); job 1 still runs and succeeds;
    Hydra then exits with status 1 and the parent stays FAILED."""
    result = done["failing"]
    root = result.root
    assert result.returncode == 1
    assert "checkpoint.filename=last is reserved" in result.stderr
    parents, children = split(runs(mlflow_client(root)))
    [parent] = parents
    assert parent.info.status == "FAILED"
    failed = parent.data.tags["sweep.failed.0"]
    assert failed.endswith("checkpoint.filename=last: ValueError: checkpoint.filename=last is reserved "
                           "for the resume checkpoint; choose another name, e.g. checkpoint.filename=final")
    assert "sweep.failed.1" not in parent.data.tags
    # job 0 failed before its run was created; job 1's run is nested and finished
    assert [(c.data.tags["sweep.job"], c.info.status) for c in children] == [("1", "FINISHED")]
    assert children[0].data.tags[PARENT_TAG] == parent.info.run_id


def test_a_single_run_is_not_nested_and_writes_the_dvc_outputs(done):
    result = done["single"]
    root = result.root
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = runs(mlflow_client(root))
    assert PARENT_TAG not in run.data.tags
    assert not [k for k in run.data.tags if k.startswith("sweep.")]
    assert run.info.run_name == "transformer-multi30k-en-fr-seed0"
    assert (root / "checkpoints/transformer/best.ckpt").is_file()
    assert json.loads((root / "runs/transformer.json").read_text())["run_id"] == run.info.run_id
    assert not (root / "multirun").exists()


# Units: no training.

def test_outputs_move_under_the_job_dir_keeping_their_layout(tmp_path):
    cfg = OmegaConf.create({"paths": {"root": "/p", "checkpoints": "${paths.root}/checkpoints/transformer",
                                      "runs": "/mine", "plots": "/elsewhere/plots",
                                      "tokenized": "${paths.root}/data/tokenized"}})
    moved = redirect_outputs(cfg, tmp_path / "3", ["model=transformer", "paths.runs=/mine"])
    assert moved == ["checkpoints", "plots"]
    assert cfg.paths.checkpoints == str(tmp_path / "3/checkpoints/transformer")
    assert cfg.paths.plots == str(tmp_path / "3/plots")  # not under paths.root: <job dir>/<key>
    assert cfg.paths.runs == "/mine"  # set on the command line: kept
    assert cfg.paths.tokenized == "/p/data/tokenized"  # an input: untouched


def test_swept_overrides_are_the_jobs_values_of_the_swept_keys():
    info = {"swept": ["model.net.d_model", "trainer.deterministic"]}
    job = ["model=transformer", "model.net.d_model=16", "trainer.deterministic=False", "seed=0"]
    assert swept_overrides(job, info) == ["model.net.d_model=16", "trainer.deterministic=False"]
    assert swept_overrides(job, None) is None  # no sweep.json: unknown


@pytest.mark.parametrize("sweep_dir, name", [
    ("/p/multirun/2026-11-29/15-04-16", "sweep-2026-11-29_15-04-16"),  # Hydra's default: date and time
    ("/p/multirun/lr-search", "sweep-lr-search"),
])
def test_the_parent_is_named_after_the_sweep_dir(sweep_dir, name):
    assert _parent_name(Path(sweep_dir)) == name


def test_racing_jobs_all_read_the_first_record(tmp_path):
    path = tmp_path / "mlflow-parent-x.json"
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda n: _create_once(path, {"run_id": f"run{n}"})["run_id"], range(16)))
    assert len(set(ids)) == 1
    assert json.loads(path.read_text())["run_id"] == ids[0]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


@pytest.mark.parametrize("device, refused", [
    ({"strategy": "ddp", "devices": 2, "num_nodes": 1}, True),
    ({"strategy": "ddp", "devices": 1, "num_nodes": 2}, True),
    ({"strategy": "ddp", "devices": 1, "num_nodes": 1}, False),
    ({"strategy": "ddp_spawn", "devices": 2, "num_nodes": 1}, False),
    ({"strategy": "auto", "devices": "auto", "num_nodes": 1}, False),
])
def test_lightnings_ddp_launcher_is_refused_in_a_sweep(device, refused, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cfg = OmegaConf.create({"device": device})
    if refused:
        with pytest.raises(SweepConfigError, match="would start the whole sweep again in every rank"):
            _refuse_subprocess_ddp(cfg)
    else:
        _refuse_subprocess_ddp(cfg)


def test_callback_ends_the_parent_killed_failed_finished_and_reopens_it(tmp_path, monkeypatch):
    """The callback's hooks on a hand-made sweep config (no training): an exit before the
    sweep's end leaves KILLED; the same sweep dir again reopens the parent (RUNNING),
    a failed job makes it FAILED, and on_multirun_end does not turn FAILED into FINISHED."""
    exits = []
    monkeypatch.setattr(sweep.atexit, "register", exits.append)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = OmegaConf.create({
        "hydra": {"mode": RunMode.MULTIRUN, "runtime": {"cwd": str(tmp_path)},
                  "sweep": {"dir": "multirun/s"}, "sweeper": {"params": {"seed": "0,1"}},
                  "overrides": {"task": ["optimizer.lr=0.1,0.2"]}, "job": {"num": 1}},
        "mlflow": {"tracking_uri": uri, "experiment": "attnlab", "artifact_location": f"{tmp_path}/mlruns"}})
    sweep_dir = tmp_path / "multirun/s"
    sweep_dir.mkdir(parents=True)
    client = mlflow_client(tmp_path)
    status = lambda: client.get_run(parent).info.status  # noqa: E731

    first = MLflowSweepCallback()
    first.on_multirun_start(cfg)
    assert json.loads((sweep_dir / "sweep.json").read_text())["swept"] == ["optimizer.lr", "seed"]
    parent = ensure_parent(cfg, sweep_dir)
    assert ensure_parent(cfg, sweep_dir) == parent  # the record, not a second run
    assert client.get_run(parent).data.tags["sweep.params"] == "seed=0,1"
    exits.pop()()  # the sweeping process exits before on_multirun_end
    assert status() == "KILLED"

    again = MLflowSweepCallback()
    again.on_multirun_start(cfg)
    assert status() == "RUNNING"
    failed = JobReturn(status=JobStatus.FAILED, overrides=["optimizer.lr=0.2"])
    failed.return_value = RuntimeError("boom")
    job_cfg = OmegaConf.merge(cfg, {"hydra": {"overrides": {"task": ["optimizer.lr=0.2"]}}})
    again.on_job_end(job_cfg, failed)
    assert status() == "FAILED"
    assert client.get_run(parent).data.tags["sweep.failed.1"] == "optimizer.lr=0.2: RuntimeError: boom"
    again.on_multirun_end(cfg)
    assert status() == "FAILED"

    last = MLflowSweepCallback()
    last.on_multirun_start(cfg)  # reopened: the old failure tag goes
    assert "sweep.failed.1" not in client.get_run(parent).data.tags
    last.on_multirun_end(cfg)
    assert status() == "FINISHED"
    exits.pop()()  # on_multirun_end ran: nothing changes at exit
    assert status() == "FINISHED"
    assert [r.info.run_id for r in runs(client)] == [parent]


@pytest.mark.parametrize("overrides, first_job, tag", [
    (["model=bahdanau,transformer", "optimizer.lr=1e-3,3e-4"], "bahdanau", "bahdanau,transformer"),
    (["model=bahdanau", "optimizer.lr=1e-3,3e-4"], "bahdanau", "bahdanau"),
    (["optimizer.lr=1e-3,3e-4"], "transformer", "transformer"),
])
def test_the_parent_is_tagged_with_the_swept_models(overrides, first_job, tag):
    from attnlab.sweep import sweep_models

    assert sweep_models({"overrides": overrides}, first_job) == tag
