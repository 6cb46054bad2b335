#!/usr/bin/env bash
# On a machine with a CUDA GPU, from a fresh clone: set up, tokenize the corpus if needed, train
# the full profile for a fixed number of steps in bf16 on CUDA, and print target tokens/s, model
# FLOP utilization and the validation BLEU reached (scripts/gpu_check.py; under 10 minutes).
#   scripts/gpu_check.sh                 # 1,500 steps
#   scripts/gpu_check.sh --steps 600     # any option of scripts/gpu_check.py
# The corpus comes from the canonical addresses, or from $ATTNLAB_DATA_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || ./scripts/setup.sh
.venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
  "no CUDA device visible to torch (pip may have installed a CPU build; see docs/how-to/gpu.md)")'
PATH="$PWD/.venv/bin:$PATH" .venv/bin/python scripts/gpu_check.py "$@"
