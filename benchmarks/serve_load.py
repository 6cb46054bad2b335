"""Load test of a served translation model: `mlflow models serve` on loopback, concurrent clients.

The load of ``tests/test_serving_load.py`` at a larger size (the same code,
``tests/serve_harness.py``): ``--clients`` threads send ``--requests`` requests
each at once, 1–32 sentences (seeded) or, every ``--invalid-every``-th, one of
the invalid requests (bad JSON, wrong schema, non-strings, an empty list, over
each limit), and check every answer: 200 with the translations
:class:`attnlab.serving.translator.Translator` gives, or a 4xx whose message names the problem.
The server's process tree RSS is sampled throughout. That closed loop is the saturation load:
its sentences/s are the server's throughput.

In the same run, the served model is then measured against its own engine and at lower loads:

- ``offline_sentences_per_s``: the same export (the registered model, loaded in this process)
  translates every sentence the valid requests held, in one call (batches of 128 sorted by
  length, torch's threads on all the cores), after the server has stopped;
  ``served_vs_offline`` is the served sentences/s at saturation over it;
- ``by_load``: open-loop loads (:func:`helpers.serve_harness.run_open_load`: valid requests
  at Poisson arrival times, whatever the answers) at ``--fractions`` (¼, ½, 1) of the
  saturation rate of requests, ``--open-requests`` each: latency p50/p95/p99 from each
  request's own send time, and sentences/s.

The last line of output is one JSON object: the saturation load's latency p50/p95/p99 (ms,
valid requests), sentences/s, requests by HTTP status, wrong answers, RSS of the first and last
quarter of the run and its growth; then ``offline_sentences_per_s``, ``served_vs_offline`` and
``by_load``. ``--record results/serve_load.csv --machine <id>`` appends it to the results data
(one row per load), which the docs' results page shows.

    python benchmarks/serve_load.py                      # the tiny test model, in a temp store
    MLFLOW_TRACKING_URI=sqlite:////abs/attnlab/mlflow.db \\
      python benchmarks/serve_load.py --model models:/attnlab-transformer@champion --requests 10

Sentences: the tiny model's 48 training sentences, or for ``--model`` the first
``--pool`` English sentences of Multi30k test_2016_flickr (``$ATTNLAB_DATA_MIRROR``
or ../shared/data), translated once up front as the reference (``--no-check``: only
count them). ``--engine ctranslate2`` (or another engine the export holds) sends it as each
valid request's ``engine`` param and decodes the reference and the offline run with it too.
Exits 1 when an answer was wrong or a 5xx came back.
"""

import argparse
import datetime
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import torch

from attnlab.analysis.provenance import append_rows, git_commit
from attnlab.serving.registry import log_served_model
from attnlab.serving.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # helpers.serve_harness, helpers.corpus_fixture

from helpers.serve_harness import (  # noqa: E402 - tests/ is put on sys.path just above
    PAIRS,
    invalid_requests,
    run_load,
    run_open_load,
    start_server,
    stop_server,
    summarize,
    tiny_export,
)

# the columns of results/serve_load.csv (scripts/results_tables.py's SERVE_COLUMNS)
RECORD_COLUMNS = [
    "run", "commit", "date", "machine", "cores", "concurrent", "model", "served_code", "engine", "beam_size",
    "workers", "threads_per_worker", "load", "requests_per_s", "sentences_per_s", "p50_ms", "p95_ms",
    "p99_ms", "offline_sentences_per_s", "served_vs_offline", "wrong_answers", "status_5xx", "rss_growth",
    "source",
]  # fmt: skip


def tiny_model(tmp: Path) -> tuple[str, str]:
    """Export + log + register the tests' tiny Transformer; (model URI, tracking URI)."""
    torch.set_num_threads(1)
    export_dir = tiny_export(tmp, {"beam_size": 3, "alpha": 1.0}, 80)
    uri = f"sqlite:///{tmp}/mlflow.db"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("attnlab", artifact_location=str(tmp / "mlruns"))
    run_id = client.create_run(experiment).info.run_id
    client.set_terminated(run_id)
    name, version = log_served_model(export_dir, "transformer", run_id, uri)
    return f"models:/{name}/{version}", uri


def multi30k_sources(n: int) -> list[str]:
    """The first ``n`` English sentences of Multi30k test_2016_flickr from the corpus mirror."""
    mirror = Path(os.environ.get("ATTNLAB_DATA_MIRROR") or ROOT.parent / "shared" / "data")
    path = mirror / "multi30k" / "test_2016_flickr.en.gz"
    if not path.is_file():
        raise SystemExit(f"no {path}; set ATTNLAB_DATA_MIRROR to the corpus mirror")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line, _ in zip(f, range(n))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        help="models:/… URI of a served model (MLFLOW_TRACKING_URI set); "
        "default: the tests' tiny model in a temporary store",
    )
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=100, help="requests per client")
    p.add_argument("--invalid-every", type=int, default=4)
    p.add_argument("--warmup", type=int, default=4, help="unmeasured valid requests per client first")
    p.add_argument("--max-sentences", type=int, default=32, help="most sentences per valid request")
    p.add_argument("--pool", type=int, default=64, help="Multi30k sentences drawn from (--model)")
    p.add_argument("--workers", type=int, help="uvicorn workers (default: MLflow's, 1)")
    p.add_argument(
        "--engine",
        help="decode with this engine of the export (each request's params; default: the export's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, default=1800, help="stop sending after this many s")
    p.add_argument("--no-check", action="store_true", help="do not compare translations")
    p.add_argument(
        "--fractions",
        type=float,
        nargs="*",
        default=[0.25, 0.5, 1.0],
        help="open-loop loads, as fractions of the saturation rate of requests",
    )
    p.add_argument("--open-requests", type=int, default=40, help="requests per open-loop load")
    p.add_argument("--record", type=Path, help="append the result to this CSV (results/serve_load.csv)")
    p.add_argument("--machine", help="--record: the machine's id in results/machines.csv")
    p.add_argument("--concurrent", default="nothing", help="--record: what else ran on the machine")
    p.add_argument("--served-code", default="", help="--record: what the model version runs, e.g. its commit")
    a = p.parse_args()
    if a.record and not a.machine:
        p.error("--record needs --machine <id of results/machines.csv>")

    with tempfile.TemporaryDirectory(prefix="serve_load_") as tmp:
        tmp = Path(tmp)
        if a.model:
            model_uri, tracking_uri = a.model, os.environ.get("MLFLOW_TRACKING_URI", "")
            pool = multi30k_sources(a.pool)
        else:
            model_uri, tracking_uri = tiny_model(tmp)
            pool = [en for en, _ in PAIRS]
        translator: Translator = mlflow.pyfunc.load_model(model_uri).unwrap_python_model().translator
        # all the cores for this process's decoding (the reference, the offline run), before an
        # engine is first used: CTranslate2's takes torch's thread count then
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        params = None
        if a.engine:  # the offline decode and the expected answers use it too
            translator.engine = translator.check_engine(a.engine)
            params = {"engine": a.engine}
        t0 = time.perf_counter()
        expected = None if a.no_check else dict(zip(pool, translator(pool)))
        reference_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        server, base = start_server(model_uri, tracking_uri, tmp / "serve.log", workers=a.workers)
        up_s = time.perf_counter() - t0
        try:
            # Warm-up, not measured: the first decodes allocate torch's buffers and each
            # server thread its malloc arena.
            run_load(
                base,
                server.pid,
                pool,
                None,
                [],
                clients=a.clients,
                requests_per_client=a.warmup,
                max_sentences=a.max_sentences,
                seed=a.seed + 1000,
                deadline_s=a.deadline,
                translator=translator,
                params=params,
            )
            load = run_load(
                base,
                server.pid,
                pool,
                expected,
                invalid_requests(translator),
                clients=a.clients,
                requests_per_client=a.requests,
                max_sentences=a.max_sentences,
                invalid_every=a.invalid_every,
                seed=a.seed,
                deadline_s=a.deadline,
                translator=translator,
                params=params,
            )
            valid = [r for r in load.results if r.kind == "valid" and r.status == 200]
            saturation_rps = len(valid) / load.wall_s
            open_loads = [
                (
                    fraction,
                    fraction * saturation_rps,
                    run_open_load(
                        base,
                        server.pid,
                        pool,
                        expected,
                        fraction * saturation_rps,
                        a.open_requests,
                        max_sentences=a.max_sentences,
                        seed=a.seed + 2000 + i,
                        translator=translator,
                        params=params,
                    ),
                )
                for i, fraction in enumerate(a.fractions)
            ]
        finally:
            stop_server(server)
    # the engine alone, on the same sentences, with the server stopped: all the cores (set above)
    sentences = [s for r in valid for s in r.inputs]
    t0 = time.perf_counter()
    translator(sentences)
    offline = len(sentences) / (time.perf_counter() - t0)
    stats = summarize(load)
    by_load = []
    for fraction, rate, open_load in open_loads:
        s = summarize(open_load)
        by_load.append({
            "fraction": fraction, "requests_per_s": round(rate, 3), "sentences_per_s": s["sentences_per_s"],
            "p50_ms": s["p50_ms"], "p95_ms": s["p95_ms"], "p99_ms": s["p99_ms"],
            "wrong_answers": s["wrong_answers"], "by_status": s["by_status"],
        })  # fmt: skip
    loads = [load] + [open_load for _, _, open_load in open_loads]
    problems = [r.problem for one in loads for r in one.results if r.problem]
    for problem in problems[:10]:
        print("wrong answer:", problem, file=sys.stderr)
    result = {
        "model": model_uri,
        "clients": a.clients,
        "requests_per_client": a.requests,
        "invalid_every": a.invalid_every,
        "workers": a.workers or 1,
        "threads_per_worker": (  # the served model's rule (attnlab.serving.threads); the user's setting wins
            int(os.environ["OMP_NUM_THREADS"])
            if os.environ.get("OMP_NUM_THREADS", "").isdigit()
            else max(1, len(os.sched_getaffinity(0)) // (a.workers or 1))
        ),
        "beam_size": translator.beam_size,
        "engine": translator.engine,
        "server_up_s": round(up_s, 1),
        "reference_s": round(reference_s, 1),
        **stats,
        "saturation_requests_per_s": round(saturation_rps, 3),
        "offline_sentences_per_s": round(offline, 2),
        "served_vs_offline": round(stats["sentences_per_s"] / offline, 3),
        "by_load": by_load,
    }
    print(json.dumps(result))
    if a.record:
        record(result, a.record, a.machine, a.concurrent, a.served_code)
    bad = [r for one in loads for r in one.results if r.status >= 500 or r.status == 0]
    sys.exit(1 if problems or bad else 0)


def record(result: dict, path: Path, machine: str, concurrent: str, served_code: str = "") -> None:
    """Append one row per load of ``result`` (the saturation load, then each open-loop one) to the
    results file ``path``, with the commit of the working tree and today's date.

    Raises:
        ValueError: the file's header is not :data:`RECORD_COLUMNS`.
    """
    commit = git_commit(ROOT)
    run = f"{commit.split()[0]}-{machine}-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M}"
    fives = sum(n for k, n in result["by_status"].items() if int(k) >= 500)
    common = {
        "run": run, "commit": commit, "date": f"{datetime.date.today():%Y-%m-%d}", "machine": machine,
        "cores": len(os.sched_getaffinity(0)), "concurrent": concurrent, "model": result["model"],
        "served_code": served_code,
        "engine": result["engine"], "beam_size": result["beam_size"], "workers": result["workers"],
        "threads_per_worker": result["threads_per_worker"],
        "offline_sentences_per_s": result["offline_sentences_per_s"],
        "source": "benchmarks/serve_load.py --record",
    }  # fmt: skip
    rows = [{
        **common, "load": f"saturation ({result['clients']} closed-loop clients)",
        "requests_per_s": result["saturation_requests_per_s"], "sentences_per_s": result["sentences_per_s"],
        "p50_ms": result["p50_ms"], "p95_ms": result["p95_ms"], "p99_ms": result["p99_ms"],
        "served_vs_offline": result["served_vs_offline"], "wrong_answers": result["wrong_answers"],
        "status_5xx": fives, "rss_growth": result["rss_growth"],
    }]  # fmt: skip
    for level in result["by_load"]:
        rows.append({
            **common, "load": f"{level['fraction']:g} of saturation (open loop)",
            "requests_per_s": level["requests_per_s"], "sentences_per_s": level["sentences_per_s"],
            "p50_ms": level["p50_ms"], "p95_ms": level["p95_ms"], "p99_ms": level["p99_ms"],
            "served_vs_offline": "", "wrong_answers": level["wrong_answers"],
            "status_5xx": sum(n for k, n in level["by_status"].items() if int(k) >= 500), "rss_growth": "",
        })  # fmt: skip
    append_rows(path, RECORD_COLUMNS, rows)


if __name__ == "__main__":
    main()
