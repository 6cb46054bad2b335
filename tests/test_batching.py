"""Batching across concurrent requests of the served model (attnlab.serving.batching).

The batcher with a decode function whose answers are known by hand (the order it saw, the
batches it made), then with the tests' tiny exported Transformer: requests merged into one
batch get exactly what each gets alone.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from attnlab.serving import threads as served_threads
from attnlab.serving.batching import DeadlineExceededError, RequestBatcher
from attnlab.serving.translator import RequestTooLargeError, Translator
from helpers.serve_harness import PAIRS, tiny_export


def _concurrently(calls):
    """Run each zero-argument call in its own thread at once; (results, errors) in call order."""
    results, errors = [None] * len(calls), [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i):
        start.wait()
        try:
            results[i] = calls[i]()
        except Exception as e:  # noqa: BLE001 - the test looks at each outcome
            errors[i] = e

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    return results, errors


class Recorder:
    """decode(key, items): each request's items upper-cased; records every batch it was given.
    A request whose items include "bad" makes the whole batch fail; ``hold`` blocks it."""

    def __init__(self):
        self.batches, self.hold = [], threading.Event()
        self.hold.set()

    def __call__(self, key, requests):
        self.batches.append((key, [list(items) for items in requests]))
        self.hold.wait(timeout=30)
        if any("bad" in items for items in requests):
            raise ValueError("cannot decode 'bad'")
        return [[f"{key}:{x.upper()}" for x in items] for items in requests]


def test_concurrent_requests_share_a_batch_and_each_gets_its_own_answer():
    decode = Recorder()
    batcher = RequestBatcher(decode, window_s=0.5, max_tokens=100)
    requests = [["a", "b"], ["c"], ["d", "e", "f"]]
    results, errors = _concurrently([lambda r=r: batcher.submit("k", r, len(r), 30) for r in requests])
    assert errors == [None, None, None]
    assert results == [["k:A", "k:B"], ["k:C"], ["k:D", "k:E", "k:F"]]
    # all three arrived within the window: one batch, in arrival order
    assert len(decode.batches) == 1 and sorted(decode.batches[0][1]) == sorted(requests)
    assert batcher.batches == [3]


def test_the_token_budget_and_the_settings_split_batches():
    decode = Recorder()
    batcher = RequestBatcher(decode, window_s=0.5, max_tokens=6)
    decode.hold.clear()  # the first batch blocks, so the rest queue up behind it
    first = threading.Thread(target=batcher.submit, args=("k", ["x"], 1, 30))
    first.start()
    while not decode.batches:
        time.sleep(0.01)
    calls = [
        lambda: batcher.submit("k", ["a", "a", "a"], 3, 30),
        lambda: batcher.submit("k", ["b", "b", "b"], 3, 30),
        lambda: batcher.submit("k", ["c", "c", "c"], 3, 30),
        lambda: batcher.submit("other", ["d"], 1, 30),
    ]
    done = threading.Thread(target=lambda: results.extend(_concurrently(calls)))
    results = []
    done.start()
    time.sleep(0.3)  # all four queued behind the held batch
    decode.hold.set()
    done.join(timeout=60)
    first.join(timeout=60)
    answers, errors = results
    assert errors == [None] * 4
    assert answers == [["k:A"] * 3, ["k:B"] * 3, ["k:C"] * 3, ["other:D"]]
    sizes = [(key, sum(len(items) for items in batch)) for key, batch in decode.batches[1:]]
    # at most 6 tokens a batch, one key a batch: 3 + 3, then 3, and the other key alone
    assert sorted(sizes) == sorted([("k", 6), ("k", 3), ("other", 1)])


def test_a_failing_request_never_fails_its_batch_mates():
    decode = Recorder()
    batcher = RequestBatcher(decode, window_s=0.5, max_tokens=100)
    requests = [["a"], ["bad"], ["c", "d"]]
    results, errors = _concurrently([lambda r=r: batcher.submit("k", r, len(r), 30) for r in requests])
    assert results[0] == ["k:A"] and results[2] == ["k:C", "k:D"]
    assert results[1] is None and isinstance(errors[1], ValueError)
    assert str(errors[1]) == "cannot decode 'bad'"
    # the merged batch failed, then each request was decoded alone
    assert [len(batch) for _, batch in decode.batches] == [3, 1, 1, 1]


def test_a_request_past_its_deadline_is_answered_and_not_decoded():
    decode = Recorder()
    batcher = RequestBatcher(decode, window_s=0.0, max_tokens=100)
    decode.hold.clear()
    slow = threading.Thread(target=batcher.submit, args=("k", ["first"], 1, 30))
    slow.start()
    while not decode.batches:
        time.sleep(0.01)
    outcome = {}

    def late():
        try:
            outcome["result"] = batcher.submit("k", ["late"], 1, 0.1)
        except DeadlineExceededError as e:
            outcome["error"] = e

    waiting = threading.Thread(target=late)
    waiting.start()
    time.sleep(0.5)  # past its 0.1 s deadline while the first batch decodes
    decode.hold.set()
    waiting.join(timeout=30)
    slow.join(timeout=30)
    assert "result" not in outcome
    assert "waited past its deadline" in str(outcome["error"])
    assert [batch for _, batch in decode.batches] == [[["first"]]]  # "late" never decoded
    assert batcher.submit("k", ["next"], 1, 30) == ["k:NEXT"]  # and the batcher goes on


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="window_s must be ≥ 0 seconds, got -1"):
        RequestBatcher(Recorder(), window_s=-1)
    with pytest.raises(ValueError, match="max_tokens must be ≥ 1, got 0"):
        RequestBatcher(Recorder(), max_tokens=0)


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    torch.set_num_threads(1)
    return Translator(
        tiny_export(Path(tmp_path_factory.mktemp("batching")), {"beam_size": 3, "alpha": 1.0}, 80)
    )


def test_merged_requests_translate_as_each_alone(translator):
    sources = [en for en, _ in PAIRS]
    requests = [sources[i : i + 1 + i % 4] for i in range(0, 40, 5)]  # 1 to 4 sentences each
    requests[3] = [f"{requests[3][0]}\n{requests[3][-1]}", ""]  # line breaks, an empty input
    alone = [translator.serve(r, details=True) for r in requests]
    translator.batcher = RequestBatcher(translator.decode_batch, window_s=0.5)
    try:
        merged, errors = _concurrently([lambda r=r: translator.serve(r, details=True) for r in requests])
        refused = _concurrently(
            [lambda: translator.serve(["a dog ."] * (translator.max_request_sentences + 1))]
            + [lambda r=r: translator.serve(r) for r in requests[:2]]
        )
    finally:
        batches, translator.batcher = translator.batcher.batches, None
    assert errors == [None] * len(requests)
    assert merged == alone
    assert max(batches) > 1  # they did share batches
    # an invalid request is refused before it reaches a batch; its neighbours are answered
    assert isinstance(refused[1][0], RequestTooLargeError)
    assert refused[0][1:] == [[a["translation"] for a in alone[0]], [a["translation"] for a in alone[1]]]


def test_threads_match_cores_over_workers_and_the_users_setting_wins(monkeypatch):
    assert (
        served_threads._WORKERS.search("uvicorn --host 127.0.0.1 --workers 3 mlflow.pyfunc.app:app")[1] == "3"
    )
    assert served_threads._WORKERS.search("uvicorn mlflow.pyfunc.scoring_server.app:app") is None
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        cores = served_threads.usable_cores()
        got = served_threads.match_threads(workers=2)
        assert got == {"cores": cores, "workers": 2, "threads": max(1, cores // 2), "set_by": "attnlab"}
        assert torch.get_num_threads() == max(1, cores // 2)
        assert served_threads.match_threads(workers=cores + 5)["threads"] == 1  # never 0
        torch.set_num_threads(1)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert served_threads.match_threads(workers=1)["set_by"] == "OMP_NUM_THREADS"
        assert torch.get_num_threads() == 1  # left as the user set it
    finally:
        torch.set_num_threads(before)


LOAD_MODEL = r"""
import json, os, sys
from types import SimpleNamespace
from attnlab.serving.model import TranslationModel
import torch
torch.set_num_threads(int(sys.argv[2]))  # what the caller had
model = TranslationModel()
model.load_context(SimpleNamespace(artifacts={"export": sys.argv[1]}))
print(json.dumps({"threads": torch.get_num_threads(), "batched": model.translator.batcher is not None,
                  "wait_policy": os.environ.get("OMP_WAIT_POLICY")}))
"""
# uvicorn's parent process, as `mlflow models serve -w 2` starts it: its workers' parent has
# "uvicorn ... --workers 2" on its command line
AS_UVICORN = r"""
import subprocess, sys
sys.exit(subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:4]]).returncode)
"""


@pytest.mark.parametrize("as_server", [False, True])
def test_only_the_scoring_server_batches_and_sets_threads(translator, as_server):
    """A script that loads the served model keeps its threads and decodes at once; a worker of
    MLflow's scoring server (its environment variable set, its parent "uvicorn --workers 2")
    gets cores // 2 threads, passive OpenMP waits and the batcher."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env.pop(served_threads.SCORING_SERVER_ENV, None)
    matched = max(1, served_threads.usable_cores() // 2)
    before = str(matched + 1)  # never what the server's rule gives
    argv = [sys.executable, "-c", LOAD_MODEL, str(translator.export_dir), before]
    if as_server:
        env[served_threads.SCORING_SERVER_ENV] = str(translator.export_dir)
        argv = [sys.executable, "-c", AS_UVICORN, LOAD_MODEL, str(translator.export_dir), before]
        argv += ["uvicorn", "--workers", "2", "mlflow.pyfunc.scoring_server.app:app"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if as_server:
        assert got == {"threads": matched, "batched": True, "wait_policy": "PASSIVE"}
    else:
        assert got == {"threads": matched + 1, "batched": False, "wait_policy": None}


def test_the_scoring_server_variable_is_mlflows():
    from mlflow.pyfunc import scoring_server

    assert served_threads.SCORING_SERVER_ENV == scoring_server._SERVER_MODEL_PATH
