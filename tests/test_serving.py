"""The served model: export → MLflow pyfunc ("models from code") → registry → `mlflow models serve`.

A tiny Transformer learns the 48 sentence pairs of ``corpus_fixture`` (about
2 s on one thread), is exported with :mod:`attnlab.export` (input limit 80
characters, beam 3, α = 1) and logged + registered twice by
:func:`attnlab.export.log_served_model` in a real temporary SQLite store, as two
runs of the export stage would: versions 1 and 2, the alias ``champion`` on 2.
The reference for every prediction is the export decoded the way
``src/translate.py`` decodes it (:func:`attnlab.decoding.translate_text`).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import mlflow
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from mlflow.exceptions import MlflowException

from attnlab.data.batching import collate
from attnlab.data.tokenizer import PAD_ID, train_sentencepiece
from attnlab.decoding import translate_text
from attnlab.export import (CHAMPION, export_translation, load_translator, log_served_model,
                            serve_command)
from attnlab.models.transformer import Transformer
from corpus_fixture import sentences

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_CHARS = 80
DECODING = {"beam_size": 3, "alpha": 1.0}
PAIRS = [(en, fr) for en, fr, _ in sentences()]
SOURCES = [en for en, _ in PAIRS[:6]]
TOO_LONG = ("A dog watches the sea. " * 4)[: MAX_CHARS + 1]  # 81 characters


def _learned_transformer(sp) -> Transformer:
    """A 1-layer d=32 Transformer trained 200 full-batch Adam steps on all 48 pairs."""
    torch.manual_seed(0)
    net = Transformer(sp.get_piece_size(), 32, 2, 1, 64, 0.0)
    batch = collate([(sp.encode(en), sp.encode(fr)) for en, fr in PAIRS])
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(200):
        logits = net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Export, log and register the model; yield facts about the temporary store."""
    tmp = tmp_path_factory.mktemp("serving")
    sp = train_sentencepiece([s for pair in PAIRS for s in pair], tmp / "spm", vocab_size=120)
    export_dir = export_translation(_learned_transformer(sp), tmp / "spm.model", tmp / "export",
                                    {"model": "transformer", "decoding": DECODING}, MAX_CHARS)
    uri = f"sqlite:///{tmp}/mlflow.db"  # tmp is absolute: sqlite:////…
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)  # restored afterwards, whatever log_served_model sets
        client = mlflow.MlflowClient(uri)
        experiment = client.create_experiment("attnlab", artifact_location=str(tmp / "mlruns"))
        run_id = client.create_run(experiment, tags={"model": "transformer"}).info.run_id
        client.set_terminated(run_id)  # a finished training run, as train.py leaves it
        t0 = time.perf_counter()
        name, version = log_served_model(export_dir, "transformer", run_id, uri)
        log_s = time.perf_counter() - t0
        alias_after_first = client.get_model_version_by_alias(name, CHAMPION).version
        second = log_served_model(export_dir, "transformer", run_id, uri)  # the stage re-run
        init_state, step, tok, _ = load_translator(export_dir)
        expected = translate_text(init_state, step, tok, SOURCES, **DECODING)
        yield {"uri": uri, "run_id": run_id, "name": name, "version": version, "client": client,
               "second": second, "alias_after_first": alias_after_first,
               "expected": expected, "log_s": log_s, "tmp": tmp, "export_dir": export_dir}
        mlflow.set_tracking_uri(None)


def test_registered_once_per_architecture_in_the_training_run(store):
    assert (store["name"], store["version"]) == ("attnlab-transformer", 1)
    client = store["client"]
    mv = client.get_model_version("attnlab-transformer", "1")
    assert mv.run_id == store["run_id"]
    assert f"at most {MAX_CHARS} characters" in mv.description
    assert mv.description.endswith(f"Serve: MLFLOW_TRACKING_URI={store['uri']} mlflow models serve "
                                   "-m models:/attnlab-transformer/1")
    assert client.get_run(store["run_id"]).info.status == "FINISHED"  # resumed, not failed
    print(f"log + load-back check + register: {store['log_s']:.1f} s")


def test_champion_alias_follows_the_newest_version(store):
    client = store["client"]
    assert int(store["alias_after_first"]) == 1
    assert store["second"] == ("attnlab-transformer", 2)
    assert int(client.get_model_version_by_alias("attnlab-transformer", CHAMPION).version) == 2
    assert {k: int(v) for k, v in client.get_registered_model("attnlab-transformer").aliases.items()
            } == {CHAMPION: 2}
    model = mlflow.pyfunc.load_model(f"models:/attnlab-transformer@{CHAMPION}")
    assert model.predict(SOURCES) == store["expected"]
    # what the export stage prints: the champion, in the model's own environment
    assert serve_command("attnlab-transformer", store["uri"]) == (
        f"MLFLOW_TRACKING_URI={store['uri']} mlflow models serve "
        "-m models:/attnlab-transformer@champion")


def test_pyfunc_translates_like_translate_py(store):
    # The learned model reproduces its training targets, so the reference is real French.
    assert store["expected"] == [fr for _, fr in PAIRS[:6]]
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    assert model.predict(SOURCES) == store["expected"]
    assert model.predict(pd.DataFrame({"text": SOURCES})) == store["expected"]  # one column
    assert model.predict(["", SOURCES[0], "   "]) == ["", store["expected"][0], ""]
    assert model.metadata.metadata["max_input_chars"] == MAX_CHARS
    assert model.metadata.get_input_schema().input_types()[0].name == "string"


def test_pyfunc_refuses_input_over_the_limit(store):
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    assert len(model.predict([TOO_LONG[:MAX_CHARS]])) == 1  # exactly the limit is accepted
    with pytest.raises(MlflowException, match=f"input 1 has {MAX_CHARS + 1} characters.*"
                                              f"at most {MAX_CHARS} characters") as e:
        model.predict([SOURCES[0], TOO_LONG])
    assert e.value.error_code == "INVALID_PARAMETER_VALUE"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, payload: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(payload).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_mlflow_models_serve_answers_requests(store):
    port = _free_port()
    log = open(store["tmp"] / "serve.log", "w+")
    # The server execs `uvicorn` from PATH: the venv's bin/, as in an activated venv.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, "MLFLOW_TRACKING_URI": store["uri"], "PATH": path}
    t0 = time.perf_counter()
    server = subprocess.Popen(
        # `local`: this venv, no environment to build (tests/test_served_env.py builds the
        # model's own environment from its requirements.txt and translates in it).
        [sys.executable, "-m", "mlflow", "models", "serve", "-m",
         f"models:/attnlab-transformer@{CHAMPION}", "--env-manager", "local",
         "-p", str(port), "--host", "127.0.0.1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None or time.perf_counter() - t0 > 180:
                log.seek(0)
                pytest.fail(f"server not up (exit code {server.returncode}):\n{log.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/ping", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        up_s = time.perf_counter() - t0

        status, body = _post(f"{base}/invocations", {"inputs": SOURCES + [""]})
        assert status == 200, body
        assert body == {"predictions": store["expected"] + [""]}

        status, body = _post(f"{base}/invocations", {"inputs": [SOURCES[0], TOO_LONG]})
        assert status == 400
        assert body["error_code"] == "INVALID_PARAMETER_VALUE"
        assert f"at most {MAX_CHARS} characters" in body["message"]
        print(f"server up in {up_s:.1f} s")
    finally:
        _stop(server)
        log.close()


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM the server's process group (it and its uvicorn worker), SIGKILL after 15 s."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, None)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:  # the whole group has exited already
            break
        try:
            server.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
