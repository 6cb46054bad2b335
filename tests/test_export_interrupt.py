"""An export stopped while it logs the served model leaves no PENDING model in the run.

``mlflow.pyfunc.log_model`` creates the run's logged model PENDING and marks it READY at the
end (FAILED on an exception, but not on Ctrl-C, SIGTERM or SIGKILL). The real export stage of a
tiny trained model runs in a subprocess; the test watches the real store until the model is
PENDING, then signals the process, and reads the store. Ctrl-C and SIGTERM: the export stops
at the end of the MLflow step under way, its model FAILED, the training run as it was, nothing
registered, the export folder whole. SIGKILL leaves the model PENDING; the next export marks it
FAILED, says so, and registers version 1.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from attnlab.export.integrity import CHECKSUMS, sha256
from helpers.tiny_train import ROOT, TINY, env, make_project, mlflow_client, train

EXPORT = ["export.compile=false", "export.ctranslate2=[]"]  # the part that matters: logging


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("interrupt"))
    done = train(root, "trainer.max_epochs=1")
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def export_cmd(root):
    return [
        sys.executable,
        "src/export.py",
        *TINY,
        *EXPORT,
        f"paths.root={root}",
        f"hydra.run.dir={root}/out",
    ]


def stop_while_pending(root, signum: int) -> tuple[subprocess.CompletedProcess, str]:
    """Run the export and send it ``signum`` once, when its logged model is PENDING; (the ended
    process, the id of that model)."""
    client = mlflow_client(root)
    experiment = client.get_experiment_by_name("attnlab").experiment_id
    process = subprocess.Popen(
        export_cmd(root), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    pending = None
    while pending is None and process.poll() is None:
        models = client.search_logged_models([experiment])
        pending = next((m.model_id for m in models if str(m.status) == "PENDING"), None)
        time.sleep(0.05)
    assert pending is not None, "the export ended before its model was PENDING"
    process.send_signal(signum)
    out, err = process.communicate(timeout=600)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), pending


def statuses(root) -> dict[str, str]:
    client = mlflow_client(root)
    experiment = client.get_experiment_by_name("attnlab").experiment_id
    return {m.model_id: str(m.status) for m in client.search_logged_models([experiment])}


def run_status(root) -> str:
    run_id = json.loads((root / "runs/transformer.json").read_text())["run_id"]
    return mlflow_client(root).get_run(run_id).info.status


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_export_leaves_its_model_failed_and_the_run_as_it_was(trained, signum):
    assert run_status(trained) == "FINISHED"
    result, model_id = stop_while_pending(trained, signum)
    # Ctrl-C: 130 and one line (attnlab.console.errors); SIGTERM: 143, the status SIGTERM gives
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    said = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert (
        "export of transformer: stopping once the step under way ends, so that the MLflow store is "
        f"left whole ({said} again stops at once)"
    ) in result.stdout + result.stderr
    models = statuses(trained)
    assert models[model_id] == "FAILED" and "PENDING" not in models.values(), models
    assert run_status(trained) == "FINISHED"  # the training run as it was
    assert mlflow_client(trained).search_model_versions("name='attnlab-transformer'") == []
    folder = trained / "models/transformer"  # written (and renamed into place) before logging
    for line in (folder / CHECKSUMS).read_text().splitlines():
        digest, name = line.split("  ", 1)
        assert sha256(folder / name) == digest, name


def test_the_next_export_fails_what_a_killed_one_left_pending(trained):
    result, model_id = stop_while_pending(trained, signal.SIGKILL)
    assert result.returncode == -signal.SIGKILL
    assert statuses(trained)[model_id] == "PENDING"  # nothing runs after SIGKILL
    done = subprocess.run(
        export_cmd(trained), cwd=ROOT, capture_output=True, text=True, timeout=600, env=env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        f"marked FAILED the served model {model_id} an earlier, stopped export left PENDING"
        in done.stdout + done.stderr
    )
    models = statuses(trained)
    assert models[model_id] == "FAILED" and "PENDING" not in models.values(), models
    client = mlflow_client(trained)
    [version] = client.search_model_versions("name='attnlab-transformer'")
    assert int(version.version) == 1
    assert models[version.source.removeprefix("models:/")] == "READY"
    assert run_status(trained) == "FINISHED"
