"""DVC stage `evaluate@<model>`: score the best checkpoint on the test split.

Seq2seq models: beam search (model.decoding: beam_size, alpha) over the test split on the
device that `device` names (conf/device/*.yaml, one process), detokenized, scored with
sacreBLEU (corpus BLEU cased 13a, lowercased BLEU, chrF); the translations go to
metrics/<model>.hyp.txt. metrics/<model>.json also says what was measured, as MT papers
report it: corpus, src_lang, tgt_lang, test_set, the decoding settings and the sacreBLEU
signatures. NW: test MSE against D2L's average-pooling and non-parametric baselines.
Writes metrics/<model>.json and logs test_* metrics (and, for translation, the test set,
decoding and signatures as tags) to the model's MLflow run.
    python src/evaluate.py model=transformer
"""
import json
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from attnlab.console import logs, summaries
from attnlab.checkpoint import load_net
from attnlab.data.corpora import read_lines
from attnlab.data.tokenizer import load_sentencepiece
from attnlab.decoding import LENGTH_PENALTY, MAX_OUTPUT_LEN, translate_text
from attnlab.lit.device import DeviceUnavailableError, single_device
from attnlab.metrics import corpus_scores, sacrebleu_signatures
from attnlab.models.nadaraya_watson import nw_evaluation, synthetic_from_config
from attnlab.files import write_json_atomic, write_lines_atomic
from attnlab.tracking import log_to_run, prepare_store, read_run_record

BATCH_SIZE = 128  # test sentences decoded together (sorted by length)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    logs.setup()
    name = cfg.model.name
    if cfg.data.get("tokenizer") == "d2l_words":
        raise SystemExit(f"data={cfg.data.name} has no test split; D2L scores its models with "
                         f"`python src/d2l_table.py data={cfg.data.name} model={name}`")
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    prepare_store(record["tracking_uri"], cfg.mlflow.artifact_location)
    net = load_net(record["checkpoint"], expected_kind=name)
    metrics_path = Path(cfg.paths.metrics) / f"{name}.json"
    if cfg.model.task == "regression":
        ev = nw_evaluation(synthetic_from_config(cfg.data, cfg.seed), float(net.w.detach()),
                           cfg.model.kernels, cfg.model.width)
        # mse, mse_nonparametric, mse_average_pooling, w, mse_<kernel> per kernel, kernel_width
        scores = ev["scores"]
        logged = {"test_mse": scores["mse"],
                  **{f"test_mse_{k}": scores[f"mse_{k}"] for k in cfg.model.kernels}}
        artifacts, hyp_path, tags = [], None, {}
    else:
        try:
            device = single_device(cfg.device)
        except DeviceUnavailableError as e:
            raise SystemExit(f"evaluate failed: {e}") from None
        tok_dir = Path(cfg.paths.tokenized)
        tokenizer = load_sentencepiece(tok_dir / "spm.model")
        sources, references = read_lines(tok_dir / "test.src.txt"), read_lines(tok_dir / "test.tgt.txt")
        decoding = {**OmegaConf.to_container(cfg.model.decoding, resolve=True), "batch_size": BATCH_SIZE,
                    "length_penalty": LENGTH_PENALTY, "max_len": MAX_OUTPUT_LEN}
        hypotheses = translate_text(net.to(device).init_state, net.step, tokenizer, sources,
                                    batch_size=BATCH_SIZE, device=device,
                                    beam_size=decoding["beam_size"], alpha=decoding["alpha"])
        measured = {"corpus": cfg.data.name, "src_lang": cfg.data.src_lang,
                    "tgt_lang": cfg.data.tgt_lang, "test_set": cfg.data.test_set}
        signatures = sacrebleu_signatures()
        scores = {**corpus_scores(hypotheses, references), "num_sentences": len(hypotheses),
                  **measured, "decoding": decoding, "signature": signatures}
        logged = {"test_bleu": scores["bleu"], "test_bleu_lc": scores["bleu_lc"],
                  "test_chrf": scores["chrf"]}
        tags = {**measured, "test_decoding": json.dumps(decoding, ensure_ascii=False),
                **{f"test_{k}_signature": v for k, v in signatures.items()}}
        hyp_path = write_lines_atomic(metrics_path.with_suffix(".hyp.txt"), hypotheses)
        artifacts = [(hyp_path, "evaluation")]
    write_json_atomic(metrics_path, scores)
    log_to_run(record["run_id"], record["tracking_uri"], logged, artifacts, tags)
    print(summaries.evaluate_summary(name, scores, metrics_path, record, hyp_path, logged))


if __name__ == "__main__":
    main()
