"""Additive against dot-product scoring, timed side by side in one run (D2L 11.3 (zh 10.3)).

The chapter says dot-product scoring is cheaper than additive scoring. This measures by how
much, twice:

1. **The layer**: :class:`attnlab.models.attention.AdditiveAttention` (w_vᵀ tanh(W_q q + W_k k))
   against :class:`attnlab.models.attention.DotProductAttention` (qᵀk/√d), forward + backward,
   on the same queries (B, Q, d), keys and values (B, K, d) and valid lengths: for Q = 1 (one
   decoder step, Bahdanau's case, the keys projected once per sentence as its decoder does) and
   for Q = K (every position a query, self-attention's).
2. **The model**: a training step (teacher-forced forward, attnlab's loss, backward, Adam) of
   :class:`attnlab.models.bahdanau.Bahdanau` with ``scoring="additive"`` against
   ``scoring="dot"``, at conf/model/bahdanau.yaml's sizes, on the same batch: ``--batch``
   sentences of ``--len`` tokens (2,400 tokens by default, the training token budget), valid
   lengths between half and all of it. The ratio is what a training epoch of the two costs on an
   equally loaded machine (the ablation runs' own epoch times ran beside other work).

Each pair is timed in alternating rounds (A B, then B A, ...), so that machine noise hits both
alike; each figure is the median over ``--rounds`` of the mean of ``--steps`` calls. Also
printed: the multiply-adds of each layer counted by hand, and the size of the (B, Q, K, h)
tensor that additive scoring materialises and dot scoring does not. The last line is one JSON
object. ``--record results/scoring_speed.csv --machine <id of results/machines.csv>`` also appends
one row per case to that results file (``scripts/results_tables.py`` renders it).

    python benchmarks/scoring_throughput.py [--batch 96 --len 25 --rounds 5 --steps 5]
    OMP_NUM_THREADS=1 python benchmarks/scoring_throughput.py --record results/scoring_speed.csv \
        --machine xeon-amx --concurrent nothing
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import OmegaConf

from attnlab.analysis.provenance import append_rows
from attnlab.data.special_tokens import BOS_ID, PAD_ID
from attnlab.loss import sequence_loss
from attnlab.models.attention import AdditiveAttention, DotProductAttention
from attnlab.models.bahdanau import Bahdanau

ROOT = Path(__file__).resolve().parents[1]


def alternating_medians(fns: dict[str, Callable[[], object]], rounds: int, steps: int) -> dict[str, float]:
    """Seconds per call of each function: the median over ``rounds`` of the mean of ``steps``
    calls, the functions taking turns (their order reversed every round). One untimed call each
    first."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            for _ in range(steps):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def layer_macs(B: int, Q: int, K: int, d: int, h: int, keys_projected: bool) -> dict[str, int]:
    """Multiply-adds of one forward pass, by hand (values d wide). Additive: W_q q (B·Q·d·h),
    W_k k (B·K·d·h, none when the keys come projected), w_vᵀ tanh(·) (B·Q·K·h, plus as many
    additions and tanh), weights × values (B·Q·K·d). Dot: QKᵀ (B·Q·K·d) and weights × values
    (B·Q·K·d)."""
    return {
        "additive": B * Q * d * h + (0 if keys_projected else B * K * d * h) + B * Q * K * h + B * Q * K * d,
        "dot": 2 * B * Q * K * d,
    }


def bench_layer(B: int, Q: int, K: int, d: int, rounds: int, steps: int) -> dict[str, float]:
    """Forward + backward of both scorings on the same inputs (additive with h = d, as Bahdanau).
    With one query (a decoder step) the additive layer gets its keys projected, W_k k, as
    Bahdanau's decoder computes them once per sentence (``projected_keys``)."""
    g = torch.Generator().manual_seed(0)
    queries = torch.randn(B, Q, d, generator=g, requires_grad=True)
    keys = torch.randn(B, K, d, generator=g, requires_grad=True)
    valid_lens = torch.randint(K // 2, K + 1, (B,), generator=g)
    additive, dot = AdditiveAttention(d, d, d), DotProductAttention()
    projected = additive.project_keys(keys).detach().requires_grad_() if Q == 1 else None

    def run_additive() -> None:
        additive(queries, keys, keys, valid_lens, projected_keys=projected).sum().backward()

    def run_dot() -> None:
        dot(queries, keys, keys, valid_lens).sum().backward()

    t = alternating_medians({"additive": run_additive, "dot": run_dot}, rounds, steps)
    macs = layer_macs(B, Q, K, d, d, keys_projected=projected is not None)
    return {
        "additive_ms": 1e3 * t["additive"],
        "dot_ms": 1e3 * t["dot"],
        "time_ratio": t["additive"] / t["dot"],
        "macs_ratio": macs["additive"] / macs["dot"],
        "additive_features_mib": B * Q * K * d * 4 / 2**20,  # the (B, Q, K, h) float32 tensor
    }


def bench_model(B: int, L: int, vocab: int, rounds: int, steps: int) -> dict[str, float]:
    """One Adam training step of Bahdanau with each scoring, on the same batch and the same
    initial weights of every shared layer."""
    sizes = OmegaConf.load(ROOT / "conf" / "model" / "bahdanau.yaml").net
    kwargs = {k: sizes[k] for k in ("embed_size", "num_hiddens", "num_layers", "dropout")}
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (B, L), generator=g)
    src_valid_lens = torch.randint(L // 2, L + 1, (B,), generator=g)
    src[torch.arange(L)[None, :] >= src_valid_lens[:, None]] = PAD_ID
    tgt = torch.randint(4, vocab, (B, L), generator=g)
    tgt[torch.arange(L)[None, :] >= torch.randint(L // 2, L + 1, (B,), generator=g)[:, None]] = PAD_ID
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt[:, :-1]], dim=1)
    batch = {"src": src, "src_valid_lens": src_valid_lens, "tgt_in": tgt_in, "tgt_out": tgt}

    def trainer(scoring: str) -> tuple[Callable[[], None], int]:
        torch.manual_seed(0)
        net = Bahdanau(vocab, pad_id=PAD_ID, scoring=scoring, **kwargs).train()
        opt = torch.optim.Adam(net.parameters(), lr=1e-4)

        def step() -> None:
            loss = sequence_loss(net, batch, 0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step, sum(p.numel() for p in net.parameters())

    (step_add, params_add), (step_dot, params_dot) = trainer("additive"), trainer("dot")
    t = alternating_medians({"additive": step_add, "dot": step_dot}, rounds, steps)
    return {
        "additive_ms": 1e3 * t["additive"],
        "dot_ms": 1e3 * t["dot"],
        "time_ratio": t["additive"] / t["dot"],
        "additive_params": params_add,
        "dot_params": params_dot,
        "target_tokens": int((tgt != PAD_ID).sum()),
    }


CASES = ("layer_one_query", "layer_all_queries", "bahdanau_train_step")
# the columns of results/scoring_speed.csv (scripts/results_tables.py's SPEED_COLUMNS)
RECORD_COLUMNS = [
    "run", "commit", "date", "machine", "threads", "concurrent", "case", "batch", "len", "d",
    "additive_ms", "dot_ms", "time_ratio", "macs_ratio", "source",
]  # fmt: skip


def record(result: dict, path: Path, machine: str, concurrent: str) -> None:
    """Append one row per case of ``result`` to the results file ``path`` (its header first when
    it is new), with the commit of the working tree and today's date.

    Raises:
        ValueError: the file's header is not :data:`RECORD_COLUMNS`.
    """
    commit = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "benchmarks"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    run = f"{commit}-{machine}-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M}"
    append_rows(path, RECORD_COLUMNS, ({
        "run": run, "commit": commit, "date": f"{datetime.date.today():%Y-%m-%d}",
        "machine": machine, "threads": result["threads"], "concurrent": concurrent, "case": case,
        "batch": result["batch"], "len": result["len"], "d": result["d"],
        "additive_ms": f"{result[case]['additive_ms']:.4f}", "dot_ms": f"{result[case]['dot_ms']:.4f}",
        "time_ratio": f"{result[case]['time_ratio']:.4f}",
        "macs_ratio": f"{result[case]['macs_ratio']:.4f}" if "macs_ratio" in result[case] else "",
        "source": "benchmarks/scoring_throughput.py --record"
        + (" (src/ or benchmarks/ had uncommitted changes)" if dirty else ""),
    } for case in CASES))  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=96, help="sentences per batch")
    p.add_argument("--len", type=int, default=25, help="padded source and target length (tokens)")
    p.add_argument("--d", type=int, default=256, help="the layers' width d (Bahdanau's h)")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary size V of the model")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--record", type=Path, help="append the result to this CSV (results/scoring_speed.csv)")
    p.add_argument("--machine", help="--record: the machine's id in results/machines.csv")
    p.add_argument("--concurrent", default="nothing", help="--record: what else ran on the machine")
    a = p.parse_args(argv)
    if a.record and not a.machine:
        p.error("--record needs --machine <id of results/machines.csv>")
    B, L = a.batch, a.len
    result: dict = {
        "layer_one_query": bench_layer(B, 1, L, a.d, a.rounds, 4 * a.steps),
        "layer_all_queries": bench_layer(B, L, L, a.d, a.rounds, a.steps),
        "bahdanau_train_step": bench_model(B, L, a.vocab, a.rounds, a.steps),
        "threads": torch.get_num_threads(),
        **vars(a),
    }
    for name, value in result.items():
        if isinstance(value, dict):
            print(
                f"{name}: "
                + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
            )
        else:
            print(f"{name}: {value}")
    print(json.dumps(result, default=str))
    if a.record:
        record(result, a.record, a.machine, a.concurrent)
    return result


if __name__ == "__main__":
    main()
