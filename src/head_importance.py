"""DVC stage `head_importance`: how much each attention head of the trained Transformer matters.

Michel et al. 2019 ("Are Sixteen Heads Really Better than One?"): validation BLEU (greedy,
sacreBLEU with the tokenizer of data.tgt_lang or data.bleu_tokenize, the first
`head_importance.sentences` val sentences) with each head masked alone at
inference, and as heads are pruned one by one, least important first (attnlab.analysis.pruning). Writes
metrics/<model>.heads.json (BLEU unmasked and with half the heads pruned),
plots/heads/<model>/ (importance.json, the whole result; importance.csv and pruning.csv for
`dvc plots`; the two figures), and logs the figures, the table and `heads_pruned_half_bleu` to the
model's MLflow run.
    python src/head_importance.py model=transformer
"""

import csv
import io
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.analysis.head_figures import importance_map, pruning_curve
from attnlab.analysis.pruning import head_importance, importance_grid
from attnlab.checkpoint import load_net
from attnlab.console import logs
from attnlab.console.errors import user_errors
from attnlab.data.corpora import read_lines
from attnlab.data.tokenizer import load_sentencepiece
from attnlab.files import write_json_atomic, write_text_atomic
from attnlab.inference.decoding import translate_text
from attnlab.metrics import bleu_tokenizer, corpus_scores
from attnlab.tracking.store import log_to_run, prepare_store, read_run_record

BATCH_SIZE = 128


def _csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@user_errors("head_importance")
def main(cfg: DictConfig) -> None:
    logs.setup()
    name = cfg.model.name
    tokenize = bleu_tokenizer(cfg.data.tgt_lang, cfg.data.get("bleu_tokenize"))
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    prepare_store(record["tracking_uri"], cfg.mlflow.artifact_location)
    net = load_net(record["checkpoint"], expected_kind=name).eval()
    tok_dir, n = Path(cfg.paths.tokenized), cfg.head_importance.sentences
    tokenizer = load_sentencepiece(tok_dir / "spm.model")
    sources, references = read_lines(tok_dir / "val.src.txt")[:n], read_lines(tok_dir / "val.tgt.txt")[:n]

    def bleu() -> float:
        hyps = translate_text(net.init_state, net.step, tokenizer, sources, batch_size=BATCH_SIZE)
        return corpus_scores(hyps, references, tokenize)["bleu"]

    result = head_importance(net, bleu)
    half = result["pruning"][len(result["pruning"]) // 2]
    result |= {"score_name": f"val BLEU (greedy, sacreBLEU, tok:{tokenize})", "num_sentences": len(sources)}
    out = Path(cfg.paths.root) / "plots" / "heads" / name
    write_json_atomic(out / "importance.json", result)
    write_json_atomic(
        Path(cfg.paths.metrics) / f"{name}.heads.json",
        {
            "val_bleu": result["score"],
            "heads": len(result["heads"]),
            "pruned": half["pruned"],
            "pruned_half_bleu": half["score"],
            "num_sentences": len(sources),
        },
    )
    write_text_atomic(out / "importance.csv", _csv(result["heads"]))
    write_text_atomic(out / "pruning.csv", _csv([{**p, "head": p["head"] or ""} for p in result["pruning"]]))
    figures = [
        importance_map(importance_grid(result, list(net.attention_layers())), out / "importance.png"),
        pruning_curve(result["pruning"], out / "pruning.png"),
    ]
    log_to_run(
        record["run_id"],
        record["tracking_uri"],
        {"heads_val_bleu": result["score"], "heads_pruned_half_bleu": half["score"]},
        [(f, "heads") for f in figures] + [(out / "importance.csv", "heads")],
    )
    ranked = sorted(result["heads"], key=lambda h: h["importance"], reverse=True)
    label = lambda h: f"{h['kind']} layer {h['layer']} head {h['head']} ({h['importance']:+.2f})"
    print(
        f"{name}: head importance on {len(sources)} val sentences (greedy BLEU {result['score']:.2f})\n"
        f"  most important : {'; '.join(label(h) for h in ranked[:3])}\n"
        f"  least important: {'; '.join(label(h) for h in ranked[-3:])}\n"
        f"  {half['pruned']} of {len(result['heads'])} heads pruned: BLEU {half['score']:.2f}\n"
        f"  figures        : {figures[0]}, {figures[1]}"
    )


if __name__ == "__main__":
    main()
