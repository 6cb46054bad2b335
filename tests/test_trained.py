"""attnlab.analysis.trained: which trained model a tutorial reads.

The short training run itself is exercised for real by the two tutorials that read a model
(tests/test_tutorials.py runs them in fast mode); here: the pipeline's missing model is an error
naming the fix, the run's key follows everything the run depends on, and reading a run's commit
never creates an MLflow store.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnlab.analysis.trained import _commit, _key, trained_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of what a short run depends on: params.yaml, conf/ and src/."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    shutil.copytree(
        ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    return tmp_path


def test_without_the_pipelines_model_the_error_names_the_stage_to_run(project):
    with pytest.raises(FileNotFoundError, match=r"runs/bahdanau\.json not found.*`dvc repro train@bahdanau`"):
        trained_model("bahdanau", project)


def test_the_runs_key_changes_with_the_code_the_configs_the_params_and_the_epochs(project):
    key = _key(project, "transformer", 2)
    assert key == _key(project, "transformer", 2) and len(key) == 12
    assert _key(project, "transformer", 1) != key
    assert _key(project, "bahdanau", 2) != key
    for path in ("params.yaml", "conf/model/transformer.yaml", "src/attnlab/models/attention.py"):
        original = (project / path).read_bytes()
        (project / path).write_bytes(original + b"\n# edited\n")
        assert _key(project, "transformer", 2) != key, f"editing {path} keeps the old run"
        (project / path).write_bytes(original)
    assert _key(project, "transformer", 2) == key
    (project / "src" / "attnlab" / "new_module.py").write_text("X = 1\n")
    assert _key(project, "transformer", 2) != key  # a new file counts too


def test_a_runs_commit_is_none_where_its_store_is_not_here_and_no_store_is_created(tmp_path):
    missing = tmp_path / "mlflow.db"
    assert _commit({"tracking_uri": f"sqlite:///{missing}", "run_id": "0" * 32}) is None
    assert not missing.exists()
    assert _commit({"run_id": "0" * 32}) is None  # a record without a store
