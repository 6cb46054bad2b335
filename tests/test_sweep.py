"""Hydra sweeps in MLflow (attnlab.tracking.sweep): real `src/train.py -m` runs on the tiny corpus.

`python src/train.py -m model.net.d_model=16,32` is one MLflow parent run with one child
run per job: each child carries the tag `mlflow.parentRunId` (MLflow's nesting), its own
swept value in its params and its own val_loss history, and writes its checkpoint in its
own job dir, never in the project's checkpoints/ or runs/ (the DVC outputs). The parent
ends FINISHED when every job succeeded, FAILED when one failed. A single run (no -m) is
not nested and writes where it always did.
"""

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID as PARENT_TAG
from omegaconf import OmegaConf

from attnlab.tracking.sweep import (
    SweepConfigError,
    _parent_name,
    _refuse_subprocess_ddp,
    ensure_parent,
    find_parents,
    redirect_outputs,
    sweep_models,
    sweep_overrides,
    swept_overrides,
)
from helpers.tiny_train import ROOT, copy_project, env, history, make_project, mlflow_client, runs, train_cmd

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
    roots = {
        "good": project,
        "failing": copy_project(project, base / "failing"),
        "single": copy_project(project, base / "single"),
    }
    cmds = {
        "good": sweep_cmd(project, project / "multirun/d_model", "model.net.d_model=16,32"),
        "failing": sweep_cmd(
            roots["failing"], roots["failing"] / "multirun/failing", "checkpoint.filename=last,best"
        ),
        "single": train_cmd(roots["single"], *FAST),
    }
    procs = {}
    for name, cmd in cmds.items():
        with open(base / f"{name}.out", "w") as out, open(base / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen(
                cmd, cwd=ROOT, stdout=out, stderr=err, env=env(OMP_NUM_THREADS="1")
            )
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
    assert [c.info.run_name for c in children] == [
        "transformer-multi30k-en-fr-seed0-job0 model.net.d_model=16",
        "transformer-multi30k-en-fr-seed0-job1 model.net.d_model=32",
    ]
    assert [c.data.tags["model"] for c in children] == ["transformer"] * 2
    assert parent.data.tags["model"] == "transformer"  # not swept: the jobs' model
    # what the jobs found: the parent by its tags, and the sweep's overrides in Hydra's multirun.yaml
    sweep_id = (sweep_dir / ".mlflow-sweep-id").read_text()
    assert parent.data.tags["sweep.id"] == sweep_id
    assert [r.info.run_id for r in find_parents(mlflow_client(root), sweep_id)] == [parent.info.run_id]
    assert "model.net.d_model=16,32" in sweep_overrides(sweep_dir)


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
    assert "Traceback" not in result.stderr, result.stderr[-3000:]  # a user's error: its line alone
    assert (
        "train: checkpoint.filename=last is reserved for the resume checkpoint; choose another "
        "name, e.g. checkpoint.filename=final"
    ) in result.stderr.splitlines()
    parents, children = split(runs(mlflow_client(root)))
    [parent] = parents
    assert parent.info.status == "FAILED"
    failed = parent.data.tags["sweep.failed.0"]
    assert failed.endswith(
        "checkpoint.filename=last: ConfigError: checkpoint.filename=last is reserved "
        "for the resume checkpoint; choose another name, e.g. checkpoint.filename=final"
    )
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
    cfg = OmegaConf.create(
        {
            "paths": {
                "root": "/p",
                "checkpoints": "${paths.root}/checkpoints/transformer",
                "runs": "/mine",
                "plots": "/elsewhere/plots",
                "tokenized": "${paths.root}/data/tokenized",
            }
        }
    )
    moved = redirect_outputs(cfg, tmp_path / "3", ["model=transformer", "paths.runs=/mine"])
    assert moved == ["checkpoints", "plots"]
    assert cfg.paths.checkpoints == str(tmp_path / "3/checkpoints/transformer")
    assert cfg.paths.plots == str(tmp_path / "3/plots")  # not under paths.root: <job dir>/<key>
    assert cfg.paths.runs == "/mine"  # set on the command line: kept
    assert cfg.paths.tokenized == "/p/data/tokenized"  # an input: untouched


def test_swept_overrides_are_the_jobs_values_of_the_swept_keys():
    sweep = ["seed=0", "model.net.d_model=16,32", "trainer.deterministic=True,False"]
    job = ["model=transformer", "model.net.d_model=16", "trainer.deterministic=False", "seed=0"]
    assert swept_overrides(job, sweep) == ["model.net.d_model=16", "trainer.deterministic=False"]
    assert swept_overrides(job, None) is None  # no multirun.yaml: unknown


@pytest.mark.parametrize(
    "sweep_dir, name",
    [
        ("/p/multirun/2026-11-29/15-04-16", "sweep-2026-11-29_15-04-16"),  # Hydra's default: date and time
        ("/p/multirun/lr-search", "sweep-lr-search"),
    ],
)
def test_the_parent_is_named_after_the_sweep_dir(sweep_dir, name):
    assert _parent_name(Path(sweep_dir)) == name


def test_racing_jobs_all_get_the_same_parent(tmp_path):
    """Jobs of a parallel launcher (or DDP ranks) asking at once: one creates, the others find it."""
    cfg = OmegaConf.create(
        {
            "mlflow": {
                "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "experiment": "attnlab",
                "artifact_location": f"{tmp_path}/mlruns",
            },
            "model": {"name": "transformer"},
        }
    )
    client = mlflow_client(tmp_path)
    client.search_experiments()  # the store's tables exist before the race
    sweep_dir = tmp_path / "multirun/race"
    sweep_dir.mkdir(parents=True)  # as Hydra's sweeper does before the jobs
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: ensure_parent(cfg, sweep_dir), range(16)))
    assert len(ids) == 1
    [parent] = runs(client)
    assert parent.info.run_id in ids and parent.info.run_name == "sweep-race"
    assert parent.info.status == "RUNNING"


def test_the_parent_follows_its_sweep_dir_and_a_new_sweep_in_a_reused_path_gets_its_own(tmp_path):
    """The sweep dir's id finds the parent: from a path with a quote in it, after the project
    moved, and not for a new sweep in the folder of a deleted one."""
    cfg = OmegaConf.create(
        {
            "mlflow": {
                "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "experiment": "attnlab",
                "artifact_location": f"{tmp_path}/mlruns",
            },
            "model": {"name": "transformer"},
        }
    )
    project = tmp_path / "O'Brien's project"
    sweep_dir = project / "multirun/lr"
    sweep_dir.mkdir(parents=True)
    first = ensure_parent(cfg, sweep_dir)
    assert ensure_parent(cfg, sweep_dir) == first
    moved = tmp_path / "moved"
    shutil.move(project, moved)
    assert ensure_parent(cfg, moved / "multirun/lr") == first
    shutil.rmtree(moved / "multirun/lr")
    (moved / "multirun/lr").mkdir()
    second = ensure_parent(cfg, moved / "multirun/lr")
    assert second != first
    assert {r.info.run_id for r in runs(mlflow_client(tmp_path))} == {first, second}


@pytest.mark.parametrize(
    "device, refused",
    [
        ({"strategy": "ddp", "devices": 2, "num_nodes": 1}, True),
        ({"strategy": "ddp", "devices": 1, "num_nodes": 2}, True),
        ({"strategy": "ddp", "devices": 1, "num_nodes": 1}, False),
        ({"strategy": "ddp_spawn", "devices": 2, "num_nodes": 1}, False),
        ({"strategy": "auto", "devices": "auto", "num_nodes": 1}, False),
    ],
)
def test_lightnings_ddp_launcher_is_refused_in_a_sweep(device, refused, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cfg = OmegaConf.create({"device": device})
    if refused:
        with pytest.raises(SweepConfigError, match="would start the whole sweep again in every rank"):
            _refuse_subprocess_ddp(cfg)
    else:
        _refuse_subprocess_ddp(cfg)


# A Hydra app with the project's callback and the keys sweep_job reads; `action` says what its job
# does after sweep_job: return, raise, or exit the sweeping process (as Ctrl-C does).
TOY_APP = """
import sys
import hydra
from mlflow import MlflowClient
from attnlab.console.errors import user_errors
from attnlab.errors import ConfigError
from attnlab.tracking.sweep import sweep_job

@hydra.main(version_base="1.3", config_path="conf", config_name="config")
@user_errors("toy")
def main(cfg):
    parent = sweep_job(cfg).tags["mlflow.parentRunId"]
    print("parent", MlflowClient(cfg.mlflow.tracking_uri).get_run(parent).info.status)
    if cfg.action == "fail":
        raise RuntimeError("boom")
    if cfg.action == "refuse":
        raise ConfigError("action=refuse cannot work; set action=ok")
    if cfg.action == "exit":
        sys.exit(3)

main()
"""
TOY_CONFIG = """
action: ok
seed: 0
model: {name: toy}
paths: {root: "${hydra:runtime.cwd}", checkpoints: "${paths.root}/checkpoints", runs: "${paths.root}/runs",
        plots: "${paths.root}/plots"}
mlflow: {tracking_uri: "sqlite:///${paths.root}/mlflow.db", experiment: attnlab,
         artifact_location: "${paths.root}/mlruns"}
hydra:
  job: {chdir: false}
  sweep: {dir: multirun/toy, subdir: "${hydra.job.num}"}
  sweeper: {params: {seed: "0"}}
  callbacks: {mlflow_sweep: {_target_: attnlab.tracking.sweep.MLflowSweepCallback}}
"""


def test_a_sweep_run_again_reopens_its_parent_which_ends_killed_failed_or_finished(tmp_path):
    """Three real multiruns into one sweep dir: the first exits mid-job (parent KILLED); the
    second reopens it (RUNNING in its jobs), and its failed job leaves it FAILED; the third
    reopens it, drops the old failure, and ends it FINISHED. One parent throughout."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/config.yaml").write_text(TOY_CONFIG)
    (tmp_path / "app.py").write_text(TOY_APP)
    client = mlflow_client(tmp_path)

    def multirun(*overrides):
        done = subprocess.run(
            [sys.executable, "app.py", "-m", *overrides],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env(),
        )
        [parent] = runs(client)
        return done, parent

    done, parent = multirun("action=exit")
    assert done.returncode == 3, done.stderr[-3000:]
    assert parent.info.status == "KILLED" and parent.info.run_name == "sweep-toy"
    assert parent.data.tags["sweep.overrides"] == "seed=0 action=exit"  # hydra.sweeper.params first
    assert parent.data.tags["sweep.dir"] == str(tmp_path / "multirun/toy")

    done, again = multirun("action=ok,fail")
    assert done.returncode == 1 and "RuntimeError: boom" in done.stderr
    assert re.findall(r"^parent (\w+)$", done.stdout, re.M) == ["RUNNING", "RUNNING"]  # reopened
    assert again.info.run_id == parent.info.run_id and again.info.status == "FAILED"
    assert (
        again.data.tags["sweep.failed.1"] == "seed=0 action=fail: RuntimeError: boom"
    )  # the job's overrides
    assert "sweep.failed.0" not in again.data.tags

    done, last = multirun("action=ok")
    assert done.returncode == 0, done.stderr[-3000:]
    assert last.info.run_id == parent.info.run_id and last.info.status == "FINISHED"
    assert not [k for k in last.data.tags if k.startswith("sweep.failed.")]


def test_a_users_error_in_a_job_is_one_line_and_tags_the_parent_with_its_own_class(tmp_path):
    """A job ended by a user's error (attnlab.console.errors.user_errors): the next job runs, the
    sweep ends with the job's overrides and its line (no traceback), and the parent's tag names
    the error's own class, as for any failed job."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/config.yaml").write_text(TOY_CONFIG)
    (tmp_path / "app.py").write_text(TOY_APP)
    done = subprocess.run(
        [sys.executable, "app.py", "-m", "action=refuse,ok"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "toy: action=refuse cannot work; set action=ok" in done.stderr.splitlines()
    # both jobs ran; the second sees the parent that the first left FAILED
    assert re.findall(r"^parent (\w+)$", done.stdout, re.M) == ["RUNNING", "FAILED"]
    [parent] = runs(mlflow_client(tmp_path))
    assert parent.info.status == "FAILED"
    assert parent.data.tags["sweep.failed.0"] == (
        "seed=0 action=refuse: ConfigError: action=refuse cannot work; set action=ok"
    )


@pytest.mark.parametrize(
    "overrides, first_job, tag",
    [
        (["model=bahdanau,transformer", "optimizer.lr=1e-3,3e-4"], "bahdanau", "bahdanau,transformer"),
        (["model=bahdanau", "optimizer.lr=1e-3,3e-4"], "bahdanau", "bahdanau"),
        (["optimizer.lr=1e-3,3e-4"], "transformer", "transformer"),
    ],
)
def test_the_parent_is_tagged_with_the_swept_models(overrides, first_job, tag):
    assert sweep_models(overrides, first_job) == tag
