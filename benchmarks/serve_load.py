"""Load test of a served translation model: `mlflow models serve` on loopback, concurrent clients.

The load of ``tests/test_serving_load.py`` at a larger size (the same code,
``tests/serve_harness.py``): ``--clients`` threads send ``--requests`` requests
each at once, 1–32 sentences (seeded) or, every ``--invalid-every``-th, one of
the invalid requests (bad JSON, wrong schema, non-strings, an empty list, over
each limit), and check every answer: 200 with the translations
:class:`attnlab.serving.translator.Translator` gives, or a 4xx whose message names the problem.
The server's process tree RSS is sampled throughout. The last line of output is one
JSON object: latency p50/p95/p99 (ms, valid requests), sentences/s, requests by
HTTP status, wrong answers, RSS of the first and last quarter of the run and its growth.

    python benchmarks/serve_load.py                      # the tiny test model, in a temp store
    MLFLOW_TRACKING_URI=sqlite:////abs/attnlab/mlflow.db \\
      python benchmarks/serve_load.py --model models:/attnlab-transformer@champion --requests 10

Sentences: the tiny model's 48 training sentences, or for ``--model`` the first
``--pool`` English sentences of Multi30k test_2016_flickr (``$ATTNLAB_DATA_MIRROR``
or ../shared/data), translated once up front as the reference (``--no-check``: only
count them). Exits 1 when an answer was wrong or a 5xx came back.
"""

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import torch

from attnlab.serving.registry import log_served_model
from attnlab.serving.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # helpers.serve_harness, helpers.corpus_fixture

from helpers.serve_harness import (  # noqa: E402 - tests/ is put on sys.path just above
    PAIRS,
    invalid_requests,
    run_load,
    start_server,
    stop_server,
    summarize,
    tiny_export,
)


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
    p.add_argument("--workers", type=int, help="uvicorn workers (default: MLflow's, the CPU count)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, default=1800, help="stop sending after this many s")
    p.add_argument("--no-check", action="store_true", help="do not compare translations")
    a = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="serve_load_") as tmp:
        tmp = Path(tmp)
        if a.model:
            model_uri, tracking_uri = a.model, os.environ.get("MLFLOW_TRACKING_URI", "")
            pool = multi30k_sources(a.pool)
        else:
            model_uri, tracking_uri = tiny_model(tmp)
            pool = [en for en, _ in PAIRS]
        translator: Translator = mlflow.pyfunc.load_model(model_uri).unwrap_python_model().translator
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
            )
        finally:
            stop_server(server)
    stats = summarize(load)
    problems = [r.problem for r in load.results if r.problem]
    for problem in problems[:10]:
        print("wrong answer:", problem, file=sys.stderr)
    print(
        json.dumps(
            {
                "model": model_uri,
                "clients": a.clients,
                "requests_per_client": a.requests,
                "invalid_every": a.invalid_every,
                "workers": a.workers or os.cpu_count(),
                "beam_size": translator.beam_size,
                "server_up_s": round(up_s, 1),
                "reference_s": round(reference_s, 1),
                **stats,
            }
        )
    )
    sys.exit(1 if problems or any(r.status >= 500 or r.status == 0 for r in load.results) else 0)


if __name__ == "__main__":
    main()
