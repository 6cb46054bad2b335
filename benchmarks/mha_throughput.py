"""Multi-head attention forward+backward throughput: attnlab vs torch.nn.MultiheadAttention.

Same size, same inputs, same run; prints queries/s for each and the ratios,
last line one JSON object. Speed is reported as ratios against the peer in the
same process, never as absolute pass/fail numbers.

    python benchmarks/mha_throughput.py [--batch 64 --len 32 --d-model 256 --heads 4 --steps 30]
"""

import argparse
import json
import time

import torch

from attnlab.models.attention import MultiHeadAttention


def bench(fn, steps: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--len", type=int, default=32)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    torch.manual_seed(0)
    X = torch.randn(a.batch, a.len, a.d_model, requires_grad=True)
    valid = torch.randint(a.len // 2, a.len + 1, (a.batch,))
    ours = MultiHeadAttention(a.d_model, a.heads, bias=True)
    peer = torch.nn.MultiheadAttention(a.d_model, a.heads, batch_first=True)
    pad_mask = torch.arange(a.len)[None, :] >= valid[:, None]  # True = ignore

    def run_ours(need_weights):
        return lambda: ours(X, X, X, valid, need_weights=need_weights).sum().backward()

    def run_peer():
        peer(X, X, X, key_padding_mask=pad_mask, need_weights=False)[0].sum().backward()

    t_fused, t_weights, t_peer = (
        bench(run_ours(False), a.steps),
        bench(run_ours(True), a.steps),
        bench(run_peer, a.steps),
    )
    q = a.batch * a.len
    result = {
        "attnlab_fused_qps": q / t_fused,
        "attnlab_weights_qps": q / t_weights,
        "peer_qps": q / t_peer,
        "fused_vs_peer": t_peer / t_fused,
        "weights_vs_peer": t_peer / t_weights,
        "threads": torch.get_num_threads(),
        **vars(a),
    }
    for k, v in result.items():
        print(f"{k:>22}: {v:.3f}" if isinstance(v, float) else f"{k:>22}: {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
