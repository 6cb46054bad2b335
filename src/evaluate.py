"""DVC stage `evaluate@<model>`: score the best checkpoint on the test split.

Seq2seq models: greedy decoding of the configured test split, detokenized,
scored with sacreBLEU (corpus BLEU cased 13a, lowercased BLEU, chrF). NW: test MSE.
Writes metrics/<model>.json and logs test_* metrics to the model's MLflow run.
    python src/evaluate.py model=transformer
"""
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.lit.regression import RegressionModule, nw_evaluation
from attnlab.lit.setup import read_lines, regression_data
from attnlab.lit.translation import TranslationModule
from attnlab.data.tokenizer import load_sentencepiece
from attnlab.metrics import corpus_scores
from attnlab.tracking import log_to_run, read_run_record, write_json


def evaluate_translation(cfg: DictConfig, checkpoint: str) -> tuple[dict, list[str]]:
    module = TranslationModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    tok_dir = Path(cfg.paths.tokenized)
    module.tokenizer = load_sentencepiece(tok_dir / "spm.model")
    sources, references = read_lines(tok_dir / "test.src.txt"), read_lines(tok_dir / "test.tgt.txt")
    hypotheses = module.translate(sources)
    scores = corpus_scores(hypotheses, references)
    scores["num_sentences"] = len(hypotheses)
    return scores, hypotheses


def evaluate_regression(cfg: DictConfig, checkpoint: str) -> dict:
    module = RegressionModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    ev = nw_evaluation(regression_data(cfg), float(module.net.w.detach()))
    return {k: ev[k] for k in ("mse", "mse_nonparametric", "mse_average_pooling", "w")}


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    name = cfg.model.name
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    metrics_path = Path(cfg.paths.metrics) / f"{name}.json"
    if cfg.model.task == "regression":
        scores = evaluate_regression(cfg, record["checkpoint"])
        logged = {"test_mse": scores["mse"]}
        artifacts = []
    else:
        scores, hypotheses = evaluate_translation(cfg, record["checkpoint"])
        logged = {"test_bleu": scores["bleu"], "test_bleu_lc": scores["bleu_lc"],
                  "test_chrf": scores["chrf"]}
        hyp_path = metrics_path.with_suffix(".hyp.txt")
        hyp_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = hyp_path.with_name(hyp_path.name + ".tmp")
        tmp.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        os.replace(tmp, hyp_path)
        artifacts = [(hyp_path, "evaluation")]
    write_json(metrics_path, scores)
    log_to_run(record["run_id"], record["tracking_uri"], logged, artifacts)
    print(f"{name}: " + ", ".join(f"{k}={v:.4g}" for k, v in scores.items()) + f" → {metrics_path}")


if __name__ == "__main__":
    main()
