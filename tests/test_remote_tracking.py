"""Training against a remote MLflow tracking server: real `mlflow server`, real `src/train.py`.

The server (SQLite backend store, artifacts proxied into ``--artifacts-destination``)
listens on a free loopback port. With ``MLFLOW_TRACKING_URI`` pointing at it a run
logs its metrics, config, checkpoint and attention heatmaps there, and its artifact
files land in the server's folder, not in the project. A server that does not answer
at start stops the run in seconds with ``TrackingServerError`` naming the URI; a
server that dies mid-run costs the tracking, not the training.
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from helpers.refusal import refusal
from helpers.tiny_train import (
    ROOT,
    STEPS_PER_EPOCH,
    copy_project,
    env,
    history,
    make_project,
    runs,
    train,
    train_cmd,
)

VENV_BIN = Path(sys.executable).parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# tiny_train's heatmaps.sentences [0] × the 3 attention kinds × the tiny model's 2 layers
HEATMAPS = {
    f"attention/sent0_{kind}_layer{layer}.png"
    for kind in ("encoder_self", "decoder_self", "encoder_decoder")
    for layer in (1, 2)
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An ``mlflow server`` in its own process group: SQLite store, artifacts proxied to ``artifacts``."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.uri = f"http://127.0.0.1:{self.port}"
        self.artifacts = folder / "artifacts"
        self.log = folder / "server.log"
        cmd = [
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder}/server.db",
            "--artifacts-destination",
            str(self.artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        # The job runner (huey consumers, for MLflow's GenAI jobs) would add 7 processes and
        # ~8 s of start-up on a 2-core machine; nothing here uses it.
        server_env = env(
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        )
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=folder, env=server_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_healthy(self, timeout: float = 120) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"mlflow server exited:\n{self.log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(
            f"mlflow server at {self.uri} not healthy after {timeout} s:\n{self.log.read_text()[-3000:]}"
        )

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the whole group (the CLI and its uvicorn worker) and reap the CLI."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # the worker may outlive the CLI by a moment
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("project"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("server"))
    try:
        yield s.wait_healthy()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def remote_run(project, server, tmp_path_factory):
    """One tiny 2-epoch training tracked on ``server``: (project root, finished process)."""
    root = copy_project(project, tmp_path_factory.mktemp("remote"))
    result = train(root, "trainer.max_epochs=2", MLFLOW_TRACKING_URI=server.uri)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result


def _artifact_files(client, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for f in client.list_artifacts(run_id, path):
        out |= _artifact_files(client, run_id, f.path) if f.is_dir else {f.path}
    return out


def test_run_is_tracked_on_the_server(remote_run, server):
    root, result = remote_run
    client = server.client()
    (run,) = runs(client)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert f"  MLflow run : {run_id} (" in result.stdout
    assert f"  tracking   : {server.uri}\n" in result.stdout  # a server: its run page, no `mlflow ui` line
    assert (
        f"  run page   : {server.uri}/#/experiments/{run.info.experiment_id}/runs/{run_id}\n" in result.stdout
    )
    assert "mlflow ui" not in result.stdout
    # one value per epoch, logged at the last step of each epoch (8 steps per epoch)
    for key in ("val_loss", "val_bleu"):
        assert [step for step, _ in history(client, run_id, key)] == [
            STEPS_PER_EPOCH - 1,
            2 * STEPS_PER_EPOCH - 1,
        ], key
    assert run.data.params["seed"] == "0"
    assert run.data.params["mlflow/tracking_uri"] == server.uri
    assert run.data.params["trainer/max_epochs"] == "2"

    assert _artifact_files(client, run_id) == {"config.yaml", "checkpoint/best.ckpt", *HEATMAPS}
    png = Path(
        client.download_artifacts(
            run_id, "attention/sent0_encoder_decoder_layer1.png", str(root / "download")
        )
    )
    assert png.read_bytes()[:8] == PNG_MAGIC

    record = json.loads((root / "runs/transformer.json").read_text())
    assert (record["run_id"], record["tracking_uri"]) == (run_id, server.uri)


def test_artifacts_are_proxied_into_the_servers_folder(remote_run, server):
    """The client uploads through the server (``mlflow-artifacts:/…``); the files land in
    ``--artifacts-destination`` and the project gets no ``mlruns/`` nor ``mlflow.db``."""
    root, _ = remote_run
    (run,) = runs(server.client())
    prefix = "mlflow-artifacts:/"
    assert run.info.artifact_uri.startswith(prefix), run.info.artifact_uri
    stored = server.artifacts / run.info.artifact_uri[len(prefix) :]
    assert (stored / "checkpoint/best.ckpt").read_bytes() == (
        root / "checkpoints/transformer/best.ckpt"
    ).read_bytes()
    assert {str(p.relative_to(stored)) for p in stored.rglob("*.png")} == HEATMAPS
    assert not (root / "mlruns").exists()
    assert not (root / "mlflow.db").exists()


def test_unreachable_server_fails_fast(project, tmp_path):
    root = copy_project(project, tmp_path / "project")
    uri = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    start = time.monotonic()
    result = train(root, "trainer.max_epochs=2", timeout=120, MLFLOW_TRACKING_URI=uri)
    seconds = time.monotonic() - start
    line = refusal(result)  # one line, no traceback
    assert seconds < 30, f"took {seconds:.1f} s"  # ~10 s here, most of it importing torch
    assert line.startswith(f"train: MLflow tracking server {uri} is unreachable"), result.stderr[-3000:]
    assert line.endswith("or unset MLFLOW_TRACKING_URI to track in the project's mlflow.db")
    # checked before anything is written: the output folders exist (ensure_writable) but are empty
    assert [p for p in (root / "checkpoints").rglob("*") if not p.is_dir()] == []
    assert list((root / "runs").iterdir()) == []
    assert not (root / "mlflow.db").exists() and not (root / "mlruns").exists()


def test_server_lost_mid_run_training_finishes(project, tmp_path, monkeypatch):
    root = copy_project(project, tmp_path / "project")
    server = Server(tmp_path / "server")  # its own: this test kills it
    # MLflow's defaults (7 retries, backoff factor 2: ~4 minutes; 120 s per request) would hold
    # the first failing call for minutes; with these it fails in milliseconds (connection
    # refused) and the logger goes offline at once.
    fast_fail = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    for k, v in fast_fail.items():
        monkeypatch.setenv(k, v)  # for this test's own polling client too
    epochs = 20  # ~0.3 s per tiny epoch: the kill must land while training still runs
    out, proc = tmp_path / "train.out", None
    try:
        server.wait_healthy()
        client = server.client()
        with open(out, "w") as f:
            cmd = train_cmd(root, f"trainer.max_epochs={epochs}")
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env(MLFLOW_TRACKING_URI=server.uri, **fast_fail),
                stdout=f,
                stderr=subprocess.STDOUT,
                text=True,
            )
        run_id, deadline = None, time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            found = runs(client)
            if found and history(client, found[0].info.run_id, "val_loss"):
                run_id = found[0].info.run_id
                break
            time.sleep(0.1)
        assert run_id is not None, f"no val_loss reached the server:\n{out.read_text()[-3000:]}"
        assert proc.poll() is None, "training ended before the server could be killed"
        server.stop(signal.SIGKILL)
        assert proc.wait(timeout=240) == 0, out.read_text()[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop(signal.SIGKILL)
    output = out.read_text()

    assert f"`Trainer.fit` stopped: `max_epochs={epochs}` reached." in output  # trained to the end
    ckpt = torch.load(root / "checkpoints/transformer/best.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["state_dict"] and ckpt["global_step"] % STEPS_PER_EPOCH == 0
    assert not (root / "checkpoints/transformer/last.ckpt").exists()  # finished
    record = json.loads((root / "runs/transformer.json").read_text())
    assert (record["run_id"], record["tracking_uri"]) == (run_id, server.uri)
    # one warning, from the first metrics call after the kill; every later call was skipped
    warnings = re.findall(rf"MLflow tracking at {re.escape(server.uri)} failed \((\w+):", output)
    assert warnings == ["log_metrics"], output[-3000:]
    assert "transformer: MLflow tracking stopped during the run (log_metrics: " in output
    # the dead server's store: the run never finished, and its val_loss stops short of 20 epochs
    from mlflow.tracking import MlflowClient

    store = MlflowClient(tracking_uri=f"sqlite:///{server.folder}/server.db")
    run = store.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert 1 <= len(history(store, run_id, "val_loss")) < epochs
