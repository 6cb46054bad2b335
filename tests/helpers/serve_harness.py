"""A served translation model under load: the tiny model, a real `mlflow models serve`, clients.

Shared by ``tests/test_serving.py``, ``tests/test_serving_load.py`` (CI size) and
``benchmarks/serve_load.py`` (larger). Nothing here belongs to the package: it
drives the server the way a user's HTTP clients do, over loopback only.

- :func:`tiny_export`: a 1-layer d=32 Transformer that learns the 48 pairs of
  ``corpus_fixture`` (about 2 s on one thread), exported with :mod:`attnlab.export.trace`.
- :func:`start_server` / :func:`stop_server`: ``mlflow models serve`` in its own process
  group, waited for with ``GET /ping``, stopped with SIGTERM then SIGKILL.
- :func:`run_load`: N client threads, a fixed number of requests each (1–32 sentences,
  seeded), with :data:`INVALID_REQUESTS` mixed in; :class:`RssSampler` samples the
  server's process tree; :func:`summarize` gives latency percentiles, sentences/s,
  counts by status and the RSS growth.
Every loop here is bounded in count and in time.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # a dependency of dvc, so installed with attnlab
import torch
import torch.nn.functional as F

from attnlab.data.batching import collate
from attnlab.data.tokenizer import PAD_ID, train_sentencepiece
from attnlab.export.trace import export_translation
from attnlab.models.transformer import Transformer
from helpers.corpus_fixture import sentences

PAIRS = [(en, fr) for en, fr, _ in sentences()]


def learned_transformer(sp) -> Transformer:
    """A 1-layer d=32 Transformer trained 200 full-batch Adam steps on all 48 :data:`PAIRS`."""
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


def tiny_export(tmp: Path, decoding: dict, max_input_chars: int, **limits) -> Path:
    """Train the tokenizer (vocabulary ≤ 120) and :func:`learned_transformer`, export to ``tmp/export``.

    ``limits`` go to :func:`attnlab.export.trace.export_translation` (``max_request_sentences``, …).
    """
    sp = train_sentencepiece([s for pair in PAIRS for s in pair], tmp / "spm", vocab_size=120)
    return export_translation(
        learned_transformer(sp),
        tmp / "spm.model",
        tmp / "export",
        {"model": "transformer", "decoding": decoding},
        max_input_chars,
        **limits,
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(
    url: str, payload: dict | bytes | str, timeout: float = 90, content_type: str = "application/json"
) -> tuple[int, dict | str]:
    """POST JSON (a dict), or a body sent as it is (bytes, or str as UTF-8), with ``content_type``
    → (HTTP status, decoded JSON or text)."""
    if isinstance(payload, dict):
        data = json.dumps(payload).encode()
    else:
        data = payload.encode() if isinstance(payload, str) else payload
    req = urllib.request.Request(url, data, {"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def start_server(
    model_uri: str,
    tracking_uri: str,
    log_path: Path,
    env: dict | None = None,
    workers: int | None = None,
    up_timeout_s: float = 180,
) -> tuple[subprocess.Popen, str]:
    """Start ``mlflow models serve -m model_uri --env-manager local`` on a free loopback port.

    Returns (the server process, leader of its own process group; its base URL) once
    ``GET /ping`` answers 200.
    Raises:
        RuntimeError: the server exited or did not answer within ``up_timeout_s``
            (with the end of its log); it is stopped then.
    """
    port = free_port()
    # The server execs `uvicorn` from PATH: the venv's bin/, as in an activated venv.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    full_env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PATH": path, **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "models",
        "serve",
        "-m",
        model_uri,
        # `local`: this venv, no environment to build (tests/test_served_env.py builds the
        # model's own environment from its requirements.txt and translates in it).
        "--env-manager",
        "local",
        "-p",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    if workers:
        cmd += ["-w", str(workers)]
    with open(log_path, "w+") as log:
        server = subprocess.Popen(
            cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        base = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        try:
            while True:
                if server.poll() is not None or time.perf_counter() - t0 > up_timeout_s:
                    log.seek(0)
                    raise RuntimeError(
                        f"`{' '.join(cmd)}` not up after {time.perf_counter() - t0:.0f} s "
                        f"(exit code {server.returncode}):\n{log.read()[-3000:]}"
                    )
                try:
                    with urllib.request.urlopen(f"{base}/ping", timeout=2) as r:
                        if r.status == 200:
                            return server, base
                except OSError:
                    time.sleep(0.5)
        except BaseException:
            stop_server(server)
            raise


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM the server's process group (it and its uvicorn workers), SIGKILL after 15 s."""
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


def tree_rss(pid: int) -> int:
    """Resident set size in bytes of process ``pid`` and all its descendants (0 if gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


class RssSampler(threading.Thread):
    """Samples :func:`tree_rss` of ``pid`` every ``interval_s`` until :meth:`stop` (at most
    ``max_samples``)."""

    def __init__(self, pid: int, interval_s: float = 0.1, max_samples: int = 100_000):
        super().__init__(daemon=True)
        self.pid, self.interval_s, self.max_samples = pid, interval_s, max_samples
        self.samples: list[tuple[float, int]] = []  # (perf_counter s, bytes)
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set() and len(self.samples) < self.max_samples:
            self.samples.append((time.perf_counter(), tree_rss(self.pid)))
            self._done.wait(self.interval_s)

    def stop(self) -> list[tuple[float, int]]:
        """Stop sampling (waits for the thread) and return the samples."""
        self._done.set()
        self.join(timeout=10)
        return self.samples


def invalid_requests(translator) -> list[tuple[str, bytes, list[str]]]:
    """The invalid requests a load mixes in: (name, raw body, words its 4xx message must contain).

    Built from ``translator``'s limits (an :class:`attnlab.serving.translator.Translator` of the served
    export). The first three are answered by MLflow's scoring server itself (its messages);
    the others by the served model (:mod:`attnlab.serving.request_body`,
    :mod:`attnlab.serving.signature`, :meth:`attnlab.serving.translator.Translator.check_request`).
    """

    def body(obj) -> bytes:
        return json.dumps(obj).encode()

    chars, n_max = translator.max_input_chars, translator.max_request_sentences
    full = translator.max_request_chars // chars + 1  # this many full-length sentences: too many chars
    rng = random.Random(0)
    dense = [
        "".join(rng.choice("etaoinsrl") for _ in range(chars))
        for _ in range(translator.max_request_chars // chars)
    ]  # few characters per token
    cases = [
        ("bad_json", b'{"inputs": ["A dog runs.",', ["valid JSON"]),
        ("not_utf8", b'{"inputs": ["\xff\xfe"]}', ["valid JSON"]),
        ("no_inputs_key", body({"foo": ["A dog runs."]}), ["exactly one of the input fields", "inputs"]),
        ("inputs_is_string", body({"inputs": "A dog runs."}), ["expected a list of sentences", "got str"]),
        ("number_item", body({"inputs": ["A dog runs.", 7]}), ["input 1 is int, not a string"]),
        ("null_item", body({"inputs": [None]}), ["input 0 is null, not a string"]),
        ("nested_list", body({"inputs": [["A dog runs."]]}), ["input 0 is list, not a string"]),
        ("unknown_param", body({"inputs": ["A dog runs."], "params": {"beam": 1}}), ["unknown param 'beam'"]),
        ("empty_list", body({"inputs": []}), ["no sentences", "at least one"]),
        (
            "too_long",
            body({"inputs": ["A dog runs.", "x" * (chars + 1)]}),
            ["input 1", f"{chars + 1} characters", f"at most {chars}", "max_input_chars", "end it sooner"],
        ),
        (
            "too_many",
            body({"inputs": ["A dog runs."] * (n_max + 1)}),
            [f"{n_max + 1} sentences", f"at most {n_max}", "serving.max_request_sentences", "split"],
        ),
    ]
    if full <= n_max:
        cases.append(
            (
                "too_many_chars",
                body({"inputs": [("A dog runs. " * chars)[:chars]] * full}),
                [
                    f"{full * chars} characters",
                    f"at most {translator.max_request_chars}",
                    "serving.max_request_chars",
                    "split",
                ],
            )
        )
    tokens = sum(len(ids) for ids in translator.tokenizer.encode(dense))
    if tokens > translator.max_request_tokens and len(dense) <= n_max:
        cases.append(
            (
                "too_many_tokens",
                body({"inputs": dense}),
                [
                    f"{tokens} sentencepiece tokens",
                    f"at most {translator.max_request_tokens}",
                    "serving.max_request_tokens",
                    "split",
                ],
            )
        )
    return cases


@dataclass
class Result:
    """One request of a load: what was sent, what came back, how long it took."""

    kind: str  # "valid" or the name of an invalid request
    n_sentences: int
    status: int
    latency_s: float
    problem: str | None = None  # why the answer is wrong, None if it is right
    inputs: list[str] = field(default_factory=list)  # a valid request's sentences


@dataclass
class Load:
    """What :func:`run_load` did: the results in completion order, and its wall time."""

    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0
    rss: list[tuple[float, int]] = field(default_factory=list)


def run_load(
    base: str,
    server_pid: int,
    pool: list[str],
    expected: dict[str, str] | None,
    invalid: list[tuple[str, bytes, list[str]]],
    clients: int = 4,
    requests_per_client: int = 10,
    max_sentences: int = 32,
    invalid_every: int = 4,
    seed: int = 0,
    request_timeout_s: float = 120,
    deadline_s: float = 600,
    translator=None,
    params: dict | None = None,
) -> Load:
    """Send ``clients`` × ``requests_per_client`` requests from ``clients`` threads at once.

    Client c's requests come from ``random.Random(seed + c)``: every ``invalid_every``-th
    one is the next of ``invalid`` (round robin over all clients), the others
    1–``max_sentences`` sentences drawn from ``pool`` (with a ``translator``, the last ones
    dropped while the request is over that :class:`attnlab.serving.translator.Translator`'s
    per-request limits). A valid answer is right when it is HTTP 200 with one translation
    per sentence equal to ``expected[sentence]`` (any strings when ``expected`` is None);
    an invalid one when it is a 4xx whose message contains each of its words
    (case-insensitive). ``params`` go with every valid request (``{"engine": ...}``). The
    server's process tree RSS is sampled throughout. Stops sending after ``deadline_s`` seconds.
    Returns:
        :class:`Load`, one :class:`Result` per request sent.
    """
    out = Load()
    lock = threading.Lock()
    url = f"{base}/invocations"
    t_end = time.perf_counter() + deadline_s

    def client(c: int) -> None:
        rng = random.Random(seed + c)
        for r in range(requests_per_client):
            if time.perf_counter() > t_end:
                return
            if invalid and r % invalid_every == invalid_every - 1:
                k = r // invalid_every  # client c's k-th invalid request: all kinds get sent
                name, payload, words = invalid[(c + k * clients) % len(invalid)]
                n = 0
            else:
                name, words = "valid", []
                batch = valid_request(rng, pool, max_sentences, translator)
                payload, n = _body(batch, params), len(batch)
            t0 = time.perf_counter()
            try:
                status, body = post(url, payload, request_timeout_s)
            except OSError as e:  # connection refused/reset, client timeout: no HTTP answer
                status, body = 0, f"{type(e).__name__}: {e}"
            dt = time.perf_counter() - t0
            problem = _judge(name, batch if n else None, status, body, words, expected)
            with lock:
                out.results.append(Result(name, n, status, dt, problem, batch if n else []))

    sampler = RssSampler(server_pid)
    sampler.start()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, t_end - time.perf_counter() + request_timeout_s))
    out.wall_s = time.perf_counter() - t0
    out.rss = sampler.stop()
    return out


def valid_request(rng: random.Random, pool: list[str], max_sentences: int, translator=None) -> list[str]:
    """1–``max_sentences`` sentences drawn from ``pool``, the last dropped while over
    ``translator``'s per-request limits (as :func:`run_load`'s valid requests)."""
    batch = [rng.choice(pool) for _ in range(rng.randint(1, max_sentences))]
    while translator is not None and len(batch) > 1 and not _fits(translator, batch):
        batch.pop()
    return batch


def run_open_load(
    base: str,
    server_pid: int,
    pool: list[str],
    expected: dict[str, str] | None,
    rate_rps: float,
    requests: int,
    max_sentences: int = 32,
    seed: int = 0,
    request_timeout_s: float = 120,
    translator=None,
    params: dict | None = None,
) -> Load:
    """Open-loop load: ``requests`` valid requests (as :func:`run_load`'s) sent at Poisson
    arrival times of mean rate ``rate_rps`` (seeded), each from a thread of its own, whatever
    the answers to earlier ones; every answer judged as :func:`run_load` judges it. A request's
    latency counts from its own send time, so a queue in the server shows in the latency.
    ``params`` go with every request.
    Returns:
        :class:`Load`; ``wall_s`` from the first send to the last answer.
    """
    rng = random.Random(seed)
    out, lock, url = Load(), threading.Lock(), f"{base}/invocations"
    batches = [valid_request(rng, pool, max_sentences, translator) for _ in range(requests)]
    gaps = [rng.expovariate(rate_rps) for _ in range(requests)]

    def send(batch: list[str]) -> None:
        t0 = time.perf_counter()
        try:
            status, body = post(url, _body(batch, params), request_timeout_s)
        except OSError as e:
            status, body = 0, f"{type(e).__name__}: {e}"
        dt = time.perf_counter() - t0
        problem = _judge("valid", batch, status, body, [], expected)
        with lock:
            out.results.append(Result("valid", len(batch), status, dt, problem, batch))

    sampler = RssSampler(server_pid)
    sampler.start()
    t0 = time.perf_counter()
    due, threads = t0, []
    for batch, gap in zip(batches, gaps):
        due += gap
        time.sleep(max(0.0, due - time.perf_counter()))
        threads.append(threading.Thread(target=send, args=(batch,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(timeout=request_timeout_s + 5)
    out.wall_s = time.perf_counter() - t0
    out.rss = sampler.stop()
    return out


def _body(batch: list[str], params: dict | None) -> dict:
    """The JSON body of a valid request: its sentences, and ``params`` when given."""
    return {"inputs": batch, "params": params} if params else {"inputs": batch}


def _fits(translator, batch: list[str]) -> bool:
    """Whether ``batch`` is within ``translator``'s per-request limits."""
    from attnlab.serving.translator import RequestTooLargeError

    try:
        translator.check_request(batch)
        return True
    except RequestTooLargeError:
        return False


def _judge(
    name: str, batch: list[str] | None, status: int, body, words: list[str], expected: dict[str, str] | None
) -> str | None:
    """Why the answer to one request is wrong, or None."""
    if name == "valid":
        if status != 200:
            return f"HTTP {status} to a valid request of {len(batch)} sentences: {str(body)[:300]}"
        got = body.get("predictions") if isinstance(body, dict) else None
        if expected is None:
            ok = isinstance(got, list) and len(got) == len(batch) and all(isinstance(t, str) for t in got)
            return None if ok else f"predictions {str(got)[:300]} are not {len(batch)} strings"
        want = [expected[s] for s in batch]
        return None if got == want else f"predictions {got!r} != {want!r}"
    if not 400 <= status < 500:
        return f"{name}: HTTP {status}, expected a 4xx: {str(body)[:300]}"
    message = (body.get("message", "") if isinstance(body, dict) else str(body)).lower()
    missing = [w for w in words if w.lower() not in message]
    return f"{name}: HTTP {status} message lacks {missing}: {message[:400]}" if missing else None


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``, linear between order statistics."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(load: Load) -> dict:
    """Latency p50/p95/p99 (ms, valid requests), sentences/s, counts by status, RSS growth.

    ``rss_growth`` is mean RSS of the last quarter of the samples / mean of the first − 1.
    """
    valid = [r for r in load.results if r.kind == "valid" and r.status == 200]
    lat = [r.latency_s * 1000 for r in valid]
    by_status: dict[str, int] = {}
    for r in load.results:
        by_status[str(r.status)] = by_status.get(str(r.status), 0) + 1
    rss = [b for _, b in load.rss if b > 0]
    q = max(1, len(rss) // 4)
    first, last = sum(rss[:q]) / q if rss else 0, sum(rss[-q:]) / q if rss else 0
    return {
        "requests": len(load.results),
        "valid_ok": len(valid),
        "invalid": sum(r.kind != "valid" for r in load.results),
        "wrong_answers": sum(r.problem is not None for r in load.results),
        "by_status": dict(sorted(by_status.items())),
        "p50_ms": round(percentile(lat, 50), 1),
        "p95_ms": round(percentile(lat, 95), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "max_ms": round(max(lat, default=0), 1),
        "sentences": sum(r.n_sentences for r in valid),
        "sentences_per_s": round(sum(r.n_sentences for r in valid) / load.wall_s, 2) if load.wall_s else 0.0,
        "wall_s": round(load.wall_s, 1),
        "rss_samples": len(rss),
        "rss_first_quarter_mb": round(first / 2**20, 1),
        "rss_last_quarter_mb": round(last / 2**20, 1),
        "rss_growth": round(last / first - 1, 4) if first else None,
        "rss_mb_by_tenth": [
            round(sum(part) / len(part) / 2**20)
            for part in (rss[i * len(rss) // 10 : (i + 1) * len(rss) // 10] for i in range(10))
            if part
        ],
    }
