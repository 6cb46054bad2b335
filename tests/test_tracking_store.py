"""A moved or copied project keeps its MLflow store usable (:mod:`attnlab.tracking.store`).

MLflow stores absolute artifact locations; after ``mv`` (or ``cp -r``) of the project, its
runs, logged models and registered model versions must point into the project's own
``mlruns/``, the run record (``runs/<model>.json``) must name the project's own store, and
nothing else may be touched: a shared store, another project's folders, a location the
user changed.
"""

import contextlib
import json
import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor

import pytest
from mlflow.tracking import MlflowClient

from attnlab.tracking.store import prepare_store, read_run_record, rebase_moved_store, write_run_record


def _store(root, artifacts=None):
    """A store like train's at ``root/mlflow.db``: experiment ``attnlab`` at ``artifacts``
    (default ``root/mlruns``), one run with an artifact, a logged model, a registered version,
    and two experiments elsewhere (one at a folder named ``mlruns`` that exists on its own)."""
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("attnlab", artifact_location=artifacts or f"{root}/mlruns")
    foreign = root.parent / "foreign/mlruns"
    foreign.mkdir(parents=True, exist_ok=True)
    others = [
        client.create_experiment(name, artifact_location=str(location))
        for name, location in (("elsewhere", f"{root.parent}/elsewhere/artifacts"), ("foreign", foreign))
    ]
    run = client.create_run(experiment)
    client.log_text(run.info.run_id, "weights", "model/weights.txt")
    logged = client.create_logged_model(experiment, name="translator", source_run_id=run.info.run_id)
    client.create_registered_model("attnlab-transformer")
    client.create_model_version("attnlab-transformer", f"{run.info.artifact_uri}/model", run.info.run_id)
    return run.info.run_id, logged.model_id, others


def _in_another_process(root, artifacts=None):
    """:func:`_store` as a stage before the move would make it (MLflow caches each run's folder)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_store, root, artifacts).result()


def _locations(uri):
    client = MlflowClient(uri)
    return sorted(e.artifact_location for e in client.search_experiments())


def test_a_moved_store_is_rebased_onto_its_new_folder(tmp_path):
    old = tmp_path / "project"
    old.mkdir()
    (tmp_path / "download").mkdir()
    run_id, model_id, (elsewhere, foreign) = _in_another_process(old)
    new = shutil.move(old, tmp_path / "moved")
    uri = f"sqlite:///{new}/mlflow.db"

    assert rebase_moved_store(uri, f"{new}/mlruns") == {f"{old}/mlruns": f"{new}/mlruns"}
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("attnlab").artifact_location == f"{new}/mlruns"
    assert client.get_experiment(elsewhere).artifact_location == f"{tmp_path}/elsewhere/artifacts"
    assert (
        client.get_experiment(foreign).artifact_location == f"{tmp_path}/foreign/mlruns"
    )  # exists: not ours
    run = client.get_run(run_id)
    assert run.info.artifact_uri == f"{new}/mlruns/{run_id}/artifacts"
    downloaded = client.download_artifacts(run_id, "model/weights.txt", str(tmp_path / "download"))
    with open(downloaded) as f:
        assert f.read() == "weights"
    assert client.get_logged_model(model_id).artifact_location.startswith(f"{new}/mlruns/")
    version = client.get_model_version("attnlab-transformer", "1")
    assert version.source == f"{new}/mlruns/{run_id}/artifacts/model"
    assert client.get_model_version_download_uri("attnlab-transformer", "1") == version.source
    client.log_text(run_id, "more", "later.txt")  # a resumed run logs into the moved folder
    assert (new / f"mlruns/{run_id}/artifacts/later.txt").read_text() == "more"
    assert not old.exists()
    assert rebase_moved_store(uri, f"{new}/mlruns") == {}  # nothing moved since


def test_a_copied_project_points_at_its_copy_and_the_original_is_untouched(tmp_path):
    original = tmp_path / "project"
    original.mkdir()
    _in_another_process(original)
    copy = shutil.copytree(original, tmp_path / "copy")
    before = _locations(f"sqlite:///{original}/mlflow.db")

    assert rebase_moved_store(f"sqlite:///{copy}/mlflow.db", f"{copy}/mlruns") == {
        f"{original}/mlruns": f"{copy}/mlruns"
    }
    assert rebase_moved_store(f"sqlite:///{original}/mlflow.db", f"{original}/mlruns") == {}
    assert _locations(f"sqlite:///{original}/mlflow.db") == before


def test_other_stores_and_locations_are_left_alone(tmp_path):
    assert rebase_moved_store("http://127.0.0.1:5000", f"{tmp_path}/mlruns") == {}
    assert rebase_moved_store(f"sqlite:///{tmp_path}/absent.db", f"{tmp_path}/mlruns") == {}
    assert not (tmp_path / "absent.db").exists()
    # A store shared by projects (MLFLOW_TRACKING_URI): project B must not take A's runs.
    shared = tmp_path / "shared"
    shared.mkdir()
    _in_another_process(shared, artifacts=f"{tmp_path}/a/mlruns")
    before = _locations(f"sqlite:///{shared}/mlflow.db")
    assert rebase_moved_store(f"sqlite:///{shared}/mlflow.db", f"{tmp_path}/b/mlruns") == {}
    # mlflow.artifact_location changed on the command line: existing runs stay where they are.
    project = tmp_path / "project"
    project.mkdir()
    _in_another_process(project)
    assert rebase_moved_store(f"sqlite:///{project}/mlflow.db", f"{tmp_path}/big/mlruns") == {}
    assert _locations(f"sqlite:///{shared}/mlflow.db") == before


def test_only_rank_zero_rebases(tmp_path, monkeypatch):
    old = tmp_path / "project"
    old.mkdir()
    _in_another_process(old)
    new = shutil.move(old, tmp_path / "moved")
    uri, before = f"sqlite:///{new}/mlflow.db", _locations(f"sqlite:///{new}/mlflow.db")
    monkeypatch.setenv("LOCAL_RANK", "1")
    prepare_store(uri, f"{new}/mlruns")
    assert _locations(uri) == before
    monkeypatch.setenv("LOCAL_RANK", "0")
    prepare_store(uri, f"{new}/mlruns")
    assert f"{new}/mlruns" in _locations(uri) and f"{old}/mlruns" not in _locations(uri)


def test_the_run_record_names_the_project_store_relative_to_itself(tmp_path):
    root = tmp_path / "project"
    ckpt = root / "checkpoints/transformer/best.ckpt"
    ckpt.parent.mkdir(parents=True)
    own = f"sqlite:///{root}/mlflow.db"
    record = write_run_record(root / "runs/transformer.json", "abc", own, "attnlab", ckpt, root=root)
    assert json.loads(record.read_text()) == {
        "run_id": "abc",
        "tracking_db": "../mlflow.db",
        "experiment": "attnlab",
        "checkpoint": "../checkpoints/transformer/best.ckpt",
    }
    write_run_record(
        root / "d2l/runs/transformer.json", "abc", own, "attnlab", ckpt, root=root
    )  # D2L profile
    moved = shutil.move(root, tmp_path / "moved")
    for record in ("runs/transformer.json", "d2l/runs/transformer.json"):
        got = read_run_record(moved / record, "transformer")
        assert (got["tracking_uri"], got["checkpoint"]) == (
            f"sqlite:///{moved}/mlflow.db",
            f"{moved}/checkpoints/transformer/best.ckpt",
        )
    # A store outside the project, a server, or the main project's store seen from a DVC
    # experiment's temporary copy (root = the copy) keep their URI.
    exp_copy = moved / ".dvc/tmp/exps/tmpab12cd"
    for uri, at in (
        (f"sqlite:///{tmp_path}/elsewhere.db", moved),
        ("http://127.0.0.1:5000", moved),
        (f"sqlite:///{moved}/mlflow.db", exp_copy),
    ):
        write_run_record(at / "runs/transformer.json", "abc", uri, "attnlab", ckpt, root=at)
        assert read_run_record(at / "runs/transformer.json", "transformer")["tracking_uri"] == uri


def test_a_damaged_store_file_is_named_with_the_fix_before_mlflow_opens_it(tmp_path):
    """Random bytes, or a database cut short, in place of mlflow.db: one error naming the file
    (not SQLAlchemy's "file is not a database" traceback); a store MLflow wrote, an empty file
    and no file pass."""
    import os
    import sqlite3

    from mlflow.tracking import MlflowClient

    from attnlab.tracking.store import TrackingStoreError, check_store_file

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    check_store_file(uri)  # none yet: MLflow creates it
    db.write_bytes(b"")
    check_store_file(uri)
    db.unlink()
    MlflowClient(tracking_uri=uri).search_experiments()  # a real store
    check_store_file(uri)
    whole = db.read_bytes()
    fix = f"restore it from a copy, or move it aside (`mv {db} {db}.damaged`) to start an empty store"
    db.write_bytes(os.urandom(4096))
    with pytest.raises(TrackingStoreError) as e:
        check_store_file(uri)
    assert str(e.value).startswith(
        f"the MLflow store {db} is damaged or not a database (its first bytes are not SQLite's header): {fix}"
    )
    db.write_bytes(whole[:16] + os.urandom(4080))  # the header, then garbage
    with pytest.raises(TrackingStoreError, match=r"is damaged or not a database \(SQLite: "):
        check_store_file(uri)
    with pytest.raises(sqlite3.DatabaseError):  # what MLflow would have met
        sqlite3.connect(db).execute("select * from experiments").fetchall()


KILLED_COMMIT = """
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=1")  # the cache spills: changed pages reach the file before the commit
con.execute("BEGIN")
con.execute("UPDATE t SET v = 'changed'")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_store_with_a_damaged_page_is_named_and_a_killed_commit_is_rolled_back(tmp_path):
    """A page in the middle of the file overwritten: SQLite's quick_check names it. A writer
    killed mid-commit leaves a hot journal: not damage; the check rolls it back, as MLflow's
    next write would, and the rows are as before the commit."""
    import os
    import sqlite3
    import subprocess
    import sys

    from attnlab.tracking.store import TrackingStoreError, check_store_file

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        con.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"row {i} " + "x" * 200) for i in range(2000)])
    con.close()
    whole = db.read_bytes()
    assert len(whole) > 40 * 4096

    subprocess.run([sys.executable, "-c", KILLED_COMMIT, str(db)], check=False)
    journal = tmp_path / "mlflow.db-journal"
    assert journal.stat().st_size > 0 and db.read_bytes() != whole  # pages changed, not committed
    check_store_file(uri)
    assert not journal.exists() or journal.stat().st_size == 0
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM t WHERE v = 'changed'").fetchone() == (0,)
    con.close()

    page = 20 * 4096  # a leaf page of t, far from the header and the schema
    db.write_bytes(whole[:page] + os.urandom(4096) + whole[page + 4096 :])
    with pytest.raises(TrackingStoreError, match=r"is damaged or not a database \(SQLite"):
        check_store_file(uri)


def test_a_new_store_is_built_aside_and_appears_whole(tmp_path, monkeypatch):
    """MLflow builds a new mlflow.db in a dozen migrations; built in a temp file and linked
    into place, a failure on the way (here: the disk full at the first write) leaves no file."""
    import sqlite3

    from attnlab.tracking.store import TrackingStoreError, check_store_file, create_store_file

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    from mlflow.store.db import utils

    def full(engine):  # the initial tables are there: the disk fills in the first migration
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(utils, "_upgrade_db", full)
    with pytest.raises(TrackingStoreError) as e:
        create_store_file(uri)
    assert str(e.value).startswith(f"could not create the MLflow store {db} (")
    assert "database or disk is full" in str(e.value) and "nothing was left there" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.undo()

    assert create_store_file(uri) is True
    assert create_store_file(uri) is False  # there already
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
    with contextlib.closing(sqlite3.connect(db)) as con:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"experiments", "runs", "metrics", "params", "alembic_version"} <= tables
        assert con.execute("SELECT name FROM experiments").fetchall() == [("Default",)]
    check_store_file(uri)
