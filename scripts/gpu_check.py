"""Train the full profile for a fixed number of steps and print target tokens/s, model FLOP
utilization and the validation BLEU reached (issue "Quality": the check for a GPU machine).

    scripts/gpu_check.sh                       # CUDA, bf16-mixed, 1,500 steps (under 10 minutes)
    python scripts/gpu_check.py --steps 3 --accelerator auto --precision bf16-mixed   # CPU smoke

It runs the project's own ``src/train.py model=transformer +experiment=full`` (the full profile,
``conf/experiment/full.yaml``) with ``trainer.max_steps``, validating once at the last step, in a
scratch root (``--root``, default a temporary folder whose ``data/`` links to the project's), so
the pipeline's checkpoints, runs and MLflow store are untouched. The corpus must be tokenized
(``dvc repro tokenize``; the script runs it when ``data/tokenized/<data>-<src>-<tgt>`` is
missing).

Printed: the run's last ``tokens_per_sec`` (target tokens per second of training, from
``plots/transformer/history.csv``), ``val_bleu`` (greedy, on the first ``data.val_bleu_sentences``
validation sentences), the device's measured matmul rate in the training precision, and
model FLOP utilization = 6 × parameters × target tokens/s ÷ that rate (Kaplan et al. 2020's
6N FLOPs per token; it leaves out attention's quadratic term and the encoder's work per
source token, so it is a lower bound). On a CPU without bf16 units the bf16 matmul rate is
far below what the mixed-precision step reaches (much of it runs in fp32), so MFU there is
not meaningful. The last line is JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def matmul_rate(device: str, dtype, n: int, reps: int = 20) -> float:
    """Measured FLOP/s of an n × n matmul on ``device`` in ``dtype``."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    parser.add_argument("--accelerator", default="gpu", help="Lightning accelerator: gpu, auto, cpu")
    parser.add_argument("--precision", default="bf16-mixed", help="Lightning precision")
    parser.add_argument(
        "--project", type=Path, default=ROOT, help="the attnlab project (its src/, conf/ and data/)"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="scratch root for checkpoints, runs and MLflow (default: a temporary folder)",
    )
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for src/train.py")
    args = parser.parse_args(argv)
    project = args.project.resolve()
    tokenized = project / "data" / "tokenized" / "multi30k-en-fr"
    if not tokenized.exists():
        subprocess.run(["dvc", "repro", "tokenize"], cwd=project, check=True)
    root = args.root or Path(tempfile.mkdtemp(prefix="attnlab-gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "data").exists():
        (root / "data").symlink_to(project / "data")
    device = "cuda" if args.accelerator in ("gpu", "cuda") else "cpu"
    cmd = [
        sys.executable,
        str(project / "src" / "train.py"),
        "model=transformer",
        "+experiment=full",
        f"device={'gpu' if device == 'cuda' else args.accelerator}",
        f"trainer.precision={args.precision}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=-1",
        "++trainer.check_val_every_n_epoch=null",
        f"trainer.val_check_interval={args.steps}",
        f"paths.root={root}",
        "heatmaps.epoch_kinds=[]",
        *args.overrides,
    ]
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db"}
    subprocess.run(cmd, cwd=project, check=True, env=env)
    wall = time.perf_counter() - t0
    with open(root / "plots" / "transformer" / "history.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val_bleu")]
    if not rows:
        raise SystemExit(f"no validation row in {root}/plots/transformer/history.csv")
    last = rows[-1]
    import torch

    from attnlab.checkpoint import load_net

    net = load_net(root / "checkpoints" / "transformer" / "best.ckpt")  # last.ckpt goes at the end
    params = sum(p.numel() for p in net.parameters())
    dtype = torch.bfloat16 if args.precision.startswith("bf16") else torch.float32
    rate = matmul_rate(device, dtype, 8192 if device == "cuda" else 1024)
    tokens_per_s = float(last["tokens_per_sec"])
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "precision": args.precision,
        "steps": args.steps,
        "wall_s": round(wall, 1),
        "parameters": params,
        "target_tokens_per_s": round(tokens_per_s, 1),
        "matmul_tflops": round(rate / 1e12, 3),
        "mfu": round(6 * params * tokens_per_s / rate, 4),
        "val_bleu": round(float(last["val_bleu"]), 2),
        "val_chrf": round(float(last["val_chrf"]), 2),
        "root": str(root),
    }
    print(
        f"{result['device']}, {args.precision}, {args.steps} steps in {wall:.0f} s: "
        f"{tokens_per_s:,.0f} target tokens/s, MFU {result['mfu']:.1%} of a measured "
        f"{result['matmul_tflops']} TFLOP/s matmul, val_bleu {result['val_bleu']}"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
