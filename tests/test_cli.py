"""The ``attnlab-*`` commands run the project's Hydra apps exactly as ``python src/<script>.py``,
and those apps answer a user's error with its message alone (``attnlab.console.errors``)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import SCRIPTS, NotInProjectError, project_root
from helpers.refusal import refusal

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_every_script_exists_and_has_an_entry_point():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {f"attnlab-{name}" for name in SCRIPTS}
    for name, file in SCRIPTS.items():
        assert (ROOT / "src" / file).is_file(), file
        assert scripts[f"attnlab-{name}"] == f"attnlab.cli:{name.replace('-', '_')}"


def test_the_project_is_found_from_any_folder_inside_it(tmp_path):
    assert project_root(ROOT / "conf" / "model") == ROOT
    assert project_root(ROOT) == ROOT
    with pytest.raises(NotInProjectError, match=r"cd into the project"):
        project_root(tmp_path)


def test_an_entry_point_prints_what_the_script_prints():
    """`attnlab-train --help` from a subfolder == `python src/train.py --help` from the root
    (Hydra's help lists the config groups read from conf/)."""
    direct = subprocess.run(
        [sys.executable, "src/train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    entry = subprocess.run(
        [str(BIN / "attnlab-train"), "--help"], cwd=ROOT / "conf", capture_output=True, text=True, timeout=120
    )
    assert direct.returncode == entry.returncode == 0, entry.stderr[-2000:]
    models = ", ".join(sorted(f.stem for f in (ROOT / "conf" / "model").glob("*.yaml")))
    assert "seq2seq" in models and f"model: {models}" in direct.stdout
    assert entry.stdout == direct.stdout


def test_outside_a_project_the_command_says_where_to_go(tmp_path):
    out = subprocess.run(
        [str(BIN / "attnlab-translate"), "model=transformer"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"attnlab-translate: {tmp_path.resolve()} is not inside an attnlab project (no folder at or "
        "above it holds conf/config.yaml and src/train.py): cd into the project you cloned, then "
        "run the command again"
    )


# --- errors for a person: a user's error as its message alone, a bug with its traceback ----------

TOY_CONFIG = "action: ok\n"
TOY_APP = """
import hydra

from attnlab.console.errors import user_errors
from attnlab.errors import ConfigError


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
@user_errors("toy")
def main(cfg):
    if cfg.action == "refuse":
        raise ConfigError("action=refuse cannot work here; set action=ok")
    if cfg.action == "bug":
        {}["a key no one set"]
    if cfg.action == "full":  # a library meets a full disk (MLflow's SQLite, say), wrapped
        try:
            raise OSError(28, "No space left on device", "mlflow.db")
        except OSError as e:
            raise RuntimeError("(raised as a result of Query-invoked autoflush)") from e
    if cfg.action == "mlflow-full":  # MLflow logs the SQLite error, traceback and all, then re-raises
        import logging

        import mlflow  # noqa: F401 - its own console handler, as in the stages

        from attnlab.console import logs

        logs.setup()
        try:
            raise OSError(28, "No space left on device", "mlflow.db")
        except OSError:
            logging.getLogger("mlflow.store.db.utils").exception("SQLAlchemy database error.")
            raise
    if cfg.action == "ctrl-c":
        import os, signal

        os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C
        signal.pause()
    print("done", cfg.action)


if __name__ == "__main__":
    main()
"""
REFUSED = "toy: action=refuse cannot work here; set action=ok"


def _toy(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """A Hydra app decorated as every app of src/ is, run as a user runs it, in ``folder``."""
    if not (folder / "app.py").exists():
        (folder / "conf").mkdir()
        (folder / "conf/config.yaml").write_text(TOY_CONFIG)
        (folder / "app.py").write_text(TOY_APP)
    return subprocess.run(
        [sys.executable, "app.py", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | env,
        # Ctrl-C's default action, as a shell gives a command: a child inherits an ignored SIGINT
        # (set by whatever ran before in this test process), and the ctrl-c app would never stop
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_a_users_error_is_one_line_and_its_traceback_goes_to_the_log(tmp_path):
    assert refusal(_toy(tmp_path, "action=refuse", "hydra.run.dir=run")) == REFUSED
    log = (tmp_path / "run/app.log").read_text()
    assert f"[ERROR] - {REFUSED}\nTraceback (most recent call last):" in log
    assert log.rstrip().endswith("attnlab.errors.ConfigError: action=refuse cannot work here; set action=ok")


def test_hydra_full_error_shows_a_users_error_with_its_traceback(tmp_path):
    done = _toy(tmp_path, "action=refuse", "hydra.run.dir=run", HYDRA_FULL_ERROR="1")
    assert done.returncode == 1
    assert "Traceback (most recent call last):" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "attnlab.errors.ConfigError: action=refuse cannot work here; set action=ok"
    )


def test_a_bug_keeps_its_traceback(tmp_path):
    done = _toy(tmp_path, "action=bug", "hydra.run.dir=run")
    assert done.returncode == 1
    assert "Traceback (most recent call last):" in done.stderr
    assert "KeyError: 'a key no one set'" in done.stderr


def test_ctrl_c_is_one_line_and_status_130(tmp_path):
    done = _toy(tmp_path, "action=ctrl-c", "hydra.run.dir=run")
    assert done.returncode == 130
    assert done.stderr.strip() == (
        "toy: stopped by Ctrl-C before it finished; every file it was writing is as it was. Run "
        "the same command (or `dvc repro`) again to finish"
    )
    assert "KeyboardInterrupt" in (tmp_path / "run/app.log").read_text()  # the trace, for a bug report


def test_a_full_disk_met_by_a_library_is_one_line(tmp_path):
    assert refusal(_toy(tmp_path, "action=full", "hydra.run.dir=run")) == (
        "toy: the disk is full (No space left on device: mlflow.db); what was being written is as "
        "it was. Free space on that disk (`df -h .`), then run the same command (or `dvc repro`) again"
    )


def test_mlflows_own_log_of_a_full_disk_goes_to_the_log_file_only(tmp_path):
    done = _toy(tmp_path, "action=mlflow-full", "hydra.run.dir=run")
    assert refusal(done).startswith("toy: the disk is full (No space left on device: mlflow.db)")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # MLflow's line and trace: not here
    log = (tmp_path / "run/app.log").read_text()
    assert "SQLAlchemy database error.\nTraceback (most recent call last):" in log


def test_a_ddp_rank_other_than_0_names_itself(tmp_path):
    """Lightning starts DDP rank 1 as a copy of the command with LOCAL_RANK=1 (and RANK, where
    a launcher sets it)."""
    assert refusal(_toy(tmp_path, "action=refuse", "hydra.run.dir=run", LOCAL_RANK="1")) == (
        "toy: rank 1: action=refuse cannot work here; set action=ok"
    )


def test_a_multirun_runs_every_job_and_ends_with_the_message(tmp_path):
    """Hydra records the failed job and runs the next one; the sweep then ends with the failed
    job's overrides and its message, without a traceback."""
    done = _toy(tmp_path, "-m", "action=refuse,ok", "hydra.sweep.dir=sweep")
    assert done.returncode == 1
    assert "done ok" in done.stdout  # job 1 ran after job 0 failed
    assert "Traceback" not in done.stderr, done.stderr
    assert "Error executing job with overrides: ['action=refuse']" in done.stderr
    assert REFUSED in done.stderr.splitlines()


# --- the stages' refusals, as a user meets them -------------------------------------------


def _stage(script: str, root: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, f"src/{script}.py", *overrides, f"paths.root={root}", f"hydra.run.dir={root}/out"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
        | env,
    )


def _run_record(root: Path, **fields: str) -> Path:
    """runs/transformer.json as train.py writes it (paths relative to runs/)."""
    record = root / "runs/transformer.json"
    record.parent.mkdir(parents=True)
    base = {"run_id": "0" * 32, "tracking_db": "../mlflow.db", "experiment": "attnlab"}
    record.write_text(json.dumps(base | {"checkpoint": "../checkpoints/transformer/best.ckpt"} | fields))
    return record


@pytest.mark.parametrize("script", ["evaluate", "export"])
def test_evaluate_and_export_before_training_name_the_command(tmp_path, script):
    assert refusal(_stage(script, tmp_path, "model=transformer")) == (
        f"{script}: {tmp_path}/runs/transformer.json not found: train first with "
        "`python src/train.py model=transformer` or `dvc repro train@transformer`"
    )


def test_export_of_a_missing_checkpoint_names_it(tmp_path):
    _run_record(tmp_path)
    assert refusal(_stage("export", tmp_path, "model=transformer")) == (
        f"export: {tmp_path}/checkpoints/transformer/best.ckpt not found; train first "
        "(`dvc repro` or `python src/train.py`)"
    )


def test_a_damaged_run_record_is_named(tmp_path):
    record = _run_record(tmp_path)
    record.write_text('{"run_id": "0000')  # cut short
    line = refusal(_stage("evaluate", tmp_path, "model=transformer"))
    assert line.startswith(
        f"evaluate: {record} is damaged or not a run record of src/train.py (JSONDecodeError: "
    )
    assert line.endswith(
        "restore it from a copy, or train again with `python src/train.py model=transformer` or "
        "`dvc repro train@transformer`"
    )


def test_evaluate_with_a_damaged_store_names_it(tmp_path):
    _run_record(tmp_path)
    db = tmp_path / "mlflow.db"
    db.write_bytes(os.urandom(4096))
    assert refusal(_stage("evaluate", tmp_path, "model=transformer")).startswith(
        f"evaluate: the MLflow store {db} is damaged or not a database (its first bytes are not "
        "SQLite's header)"
    )


def test_tokenize_and_download_refuse_in_one_line(tmp_path):
    assert refusal(_stage("tokenize_data", tmp_path, "data=synthetic")) == (
        "tokenize: data=synthetic needs no tokenizer; choose data=multi30k, data=fra_eng or data=parallel"
    )
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    assert refusal(_stage("download", tmp_path, ATTNLAB_DATA_MIRROR=str(mirror))) == (
        f"download: {mirror}/multi30k/train.en.gz not found in the mirror ATTNLAB_DATA_MIRROR={mirror}; "
        "the mirror must be laid out like ../shared/data"
    )


def test_a_librarys_error_quoted_in_ours_is_its_first_line():
    """SQLAlchemy's message goes on with the SQL, its parameters and a link: quoted, one line."""
    import sqlalchemy

    from attnlab.errors import brief

    engine = sqlalchemy.create_engine("sqlite://")
    with pytest.raises(sqlalchemy.exc.OperationalError) as caught, engine.connect() as con:
        con.execute(sqlalchemy.text("SELECT x FROM runs WHERE y = :y"), {"y": 1})
    assert "[SQL: SELECT x FROM runs WHERE y = ?]" in str(caught.value)
    assert brief(caught.value) == "OperationalError: (sqlite3.OperationalError) no such table: runs"
    assert brief(KeyError()) == "KeyError"
