"""DVC stage `evaluate@<model>`: score the best checkpoint on the test splits.

What is measured is the model's task's (conf/model/<model>.yaml `task.evaluate`, in
attnlab.inference.evaluation). Seq2seq models: beam search (model.decoding: beam_size, alpha) over the
test split on the device that `device` names (conf/device/*.yaml, one process), detokenized, scored with
sacreBLEU (corpus BLEU cased, lowercased BLEU, chrF; BLEU's tokenizer follows data.tgt_lang:
zh, ja-mecab, ko-mecab, else 13a, or data.bleu_tokenize); the translations go to
metrics/<model>.hyp.txt. metrics/<model>.json also says what was measured, as MT papers
report it: corpus, src_lang, tgt_lang, test_set, the decoding settings and the sacreBLEU
signatures. The further test splits of data.more_test_splits (Multi30k: test_2017_flickr) are
scored the same way, into metrics/<model>.json → more_test_sets and MLflow test_bleu/<name>,
...; their translations go to the MLflow run (evaluation/<name>.hyp.txt). NW: test MSE
against D2L's average-pooling and non-parametric baselines.
Writes metrics/<model>.json and logs test_* metrics (and, for translation, the test set,
decoding and signatures as tags) to the model's MLflow run.
    python src/evaluate.py model=transformer
"""

import tempfile
from pathlib import Path

import hydra
from hydra.utils import get_method
from omegaconf import DictConfig

from attnlab.checkpoint import load_net
from attnlab.console import logs, summaries
from attnlab.console.errors import user_errors
from attnlab.files import write_json_atomic, write_lines_atomic
from attnlab.tracking.store import log_to_run, prepare_store, read_run_record


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@user_errors("evaluate")
def main(cfg: DictConfig) -> None:
    logs.setup()
    name = cfg.model.name
    evaluate = get_method(cfg.model.task.evaluate)  # the model's task: attnlab.inference.evaluation
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    prepare_store(record["tracking_uri"], cfg.mlflow.artifact_location)
    load = get_method(cfg.model.task.load) if cfg.model.task.get("load") else load_net  # image models
    # the test split must be the tokenized corpus the model trained on (checked as it loads)
    net = load(record["checkpoint"], expected_kind=name, tokenized_dir=cfg.paths.tokenized)
    metrics_path = Path(cfg.paths.metrics) / f"{name}.json"
    result = evaluate(cfg, net)
    hyp_path, artifacts = None, []
    if result.hypotheses is not None:
        hyp_path = write_lines_atomic(metrics_path.with_suffix(".hyp.txt"), result.hypotheses)
        artifacts = [(hyp_path, "evaluation")]
    write_json_atomic(metrics_path, result.scores)
    with tempfile.TemporaryDirectory() as tmp:  # further test sets' translations: MLflow only
        for test_set, lines in result.more_hypotheses.items():
            artifacts.append((write_lines_atomic(Path(tmp) / f"{test_set}.hyp.txt", lines), "evaluation"))
        log_to_run(record["run_id"], record["tracking_uri"], result.logged, artifacts, result.tags)
    summary = (
        get_method(cfg.model.task.summary) if cfg.model.task.get("summary") else summaries.evaluate_summary
    )
    print(summary(name, result.scores, metrics_path, record, hyp_path, result.logged))


if __name__ == "__main__":
    main()
