#!/usr/bin/env bash
# Create .venv and install attnlab with everything it needs (CPU PyTorch first).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test]"
echo "attnlab installed in .venv (activate with: source .venv/bin/activate)"
