"""A moved or copied project keeps its MLflow store usable (:mod:`attnlab.tracking`).

MLflow stores absolute artifact locations; after ``mv`` of the project, its runs, logged
models and registered model versions must point into the moved ``mlruns/``, and the run
record (``runs/<model>.json``) must name the moved store.
"""
import json
import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor

from mlflow.tracking import MlflowClient

from attnlab.tracking import read_run_record, rebase_moved_store, write_run_record


def _store(root):
    """A store like train's: experiment ``attnlab`` at ``root/mlruns``, one run with an artifact,
    a registered version of it, and an unrelated experiment elsewhere."""
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("attnlab", artifact_location=f"{root}/mlruns")
    other = client.create_experiment("elsewhere", artifact_location=f"{root.parent}/elsewhere/artifacts")
    run = client.create_run(experiment)
    client.log_text(run.info.run_id, "weights", "model/weights.txt")
    client.create_registered_model("attnlab-transformer")
    client.create_model_version("attnlab-transformer", f"{run.info.artifact_uri}/model", run.info.run_id)
    return run.info.run_id, other


def test_a_moved_store_is_rebased_onto_its_new_folder(tmp_path):
    old = tmp_path / "project"
    old.mkdir()
    # Another process, as a stage before the move (MLflow caches each run's artifact folder).
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        run_id, other = pool.submit(_store, old).result()
    (tmp_path / "download").mkdir()
    new = shutil.move(old, tmp_path / "moved")
    uri = f"sqlite:///{new}/mlflow.db"

    assert rebase_moved_store(uri, f"{new}/mlruns") == {f"{old}/mlruns": f"{new}/mlruns"}
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("attnlab").artifact_location == f"{new}/mlruns"
    assert client.get_experiment(other).artifact_location == f"{tmp_path}/elsewhere/artifacts"  # untouched
    run = client.get_run(run_id)
    assert run.info.artifact_uri == f"{new}/mlruns/{run_id}/artifacts"
    downloaded = client.download_artifacts(run_id, "model/weights.txt", str(tmp_path / "download"))
    assert open(downloaded).read() == "weights"
    version = client.get_model_version("attnlab-transformer", "1")
    assert version.source == f"{new}/mlruns/{run_id}/artifacts/model"
    assert client.get_model_version_download_uri("attnlab-transformer", "1") == version.source
    client.log_text(run_id, "more", "later.txt")  # a resumed run logs into the moved folder
    assert (new / f"mlruns/{run_id}/artifacts/later.txt").read_text() == "more"
    assert not old.exists()
    assert rebase_moved_store(uri, f"{new}/mlruns") == {}  # nothing moved since


def test_other_stores_are_left_alone(tmp_path):
    assert rebase_moved_store("http://127.0.0.1:5000", f"{tmp_path}/mlruns") == {}
    assert rebase_moved_store(f"sqlite:///{tmp_path}/absent.db", f"{tmp_path}/mlruns") == {}
    assert not (tmp_path / "absent.db").exists()


def test_the_run_record_names_the_project_store_relative_to_itself(tmp_path):
    ckpt = tmp_path / "project/checkpoints/transformer/best.ckpt"
    ckpt.parent.mkdir(parents=True)
    record = write_run_record(tmp_path / "project/runs/transformer.json", "abc",
                              f"sqlite:///{tmp_path}/project/mlflow.db", "attnlab", ckpt)
    assert json.loads(record.read_text()) == {"run_id": "abc", "tracking_db": "../mlflow.db",
                                              "experiment": "attnlab",
                                              "checkpoint": "../checkpoints/transformer/best.ckpt"}
    moved = shutil.move(tmp_path / "project", tmp_path / "moved")
    got = read_run_record(moved / "runs/transformer.json", "transformer")
    assert (got["tracking_uri"], got["checkpoint"]) == (f"sqlite:///{moved}/mlflow.db",
                                                       f"{moved}/checkpoints/transformer/best.ckpt")
    # A store outside the project, or a server, keeps its URI.
    for uri in (f"sqlite:///{tmp_path}/elsewhere.db", "http://127.0.0.1:5000"):
        write_run_record(moved / "runs/transformer.json", "abc", uri, "attnlab", ckpt)
        assert read_run_record(moved / "runs/transformer.json", "transformer")["tracking_uri"] == uri
