#!/usr/bin/env bash
# D2L's English→French results on CPU (Bahdanau: D2L 11.4.3 (zh 10.4.3), Transformer: D2L 11.7.6 (zh 10.7.6)):
# D2L's exact data pipeline (data=fra_eng_d2l) and hyperparameters
# (conf/profile/fra_eng_d2l_<model>.yaml), then the book's four-sentence table.
# Needs data/raw/fra-eng.zip (`dvc repro download` or `python src/download.py`).
# Runs on the CPU (device=cpu) like the table of docs/how-to/reproduce-d2l.md; extra arguments are Hydra
# overrides for every step and win, e.g. seed=1 or device=auto.
# Outputs go to d2l/ (checkpoints, runs, metrics) and the MLflow store.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
$PY src/tokenize_data.py data=fra_eng_d2l device=cpu "$@"
for model in bahdanau transformer; do
  $PY src/train.py data=fra_eng_d2l model=$model device=cpu trainer.enable_progress_bar=false "$@"
  $PY src/d2l_table.py data=fra_eng_d2l model=$model device=cpu "$@"
done
