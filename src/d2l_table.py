"""D2L's translation table for a model trained on data=fra_eng_d2l (D2L 11.4.3 (zh 10.4.3),
11.7.6 (zh 10.7.6)).

    python src/tokenize_data.py data=fra_eng_d2l
    python src/train.py data=fra_eng_d2l model=bahdanau
    python src/d2l_table.py data=fra_eng_d2l model=bahdanau

Translates D2L's four sentences as the book does (fixed-length source of
num_steps tokens, greedy decoding of num_steps tokens, cut at <eos>) and prints
one line per sentence in the book's format, with D2L's sentence BLEU (k=2):
    go . => ['va', '!'], bleu,1.000
Writes d2l/metrics/d2l_<model>.json and logs the table to the model's MLflow run.
"""

from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from attnlab.checkpoint import load_net
from attnlab.console.errors import user_errors
from attnlab.data.tokenizer import EOS_ID, load_tokenizer
from attnlab.errors import ConfigError
from attnlab.files import write_json_atomic
from attnlab.inference.decoding import greedy_decode
from attnlab.metrics import d2l_bleu
from attnlab.tracking.store import log_to_run, prepare_store, read_run_record

# The book's examples and references (D2L 10.7.8 (zh 9.7.6), 11.4.3 (zh 10.4.3), 11.7.6 (zh 10.7.6)).
ENGLISH = ["go .", "i lost .", "he's calm .", "i'm home ."]
FRENCH = ["va !", "j'ai perdu .", "il est calme .", "je suis chez moi ."]


def d2l_table(net, tokenizer) -> list[dict]:
    """One row per D2L sentence: source, translation tokens, reference, ``bleu`` (k=2)."""
    src, valid = tokenizer.encode_sources(ENGLISH)
    ys = greedy_decode(net.init_state, net.step, src, valid, max_len=tokenizer.num_steps)
    rows = []
    for en, fr, out in zip(ENGLISH, FRENCH, ys.tolist()):
        out = out[: out.index(EOS_ID)] if EOS_ID in out else out  # D2L keeps all tokens before <eos>
        tokens = [tokenizer.id_to_piece(i) for i in out]
        rows.append(
            {
                "source": en,
                "translation": tokens,
                "reference": fr,
                "bleu": d2l_bleu(" ".join(tokens), fr, k=2),
            }
        )
    return rows


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@user_errors("d2l_table")
def main(cfg: DictConfig) -> None:
    if cfg.data.name != "fra_eng_d2l":
        raise ConfigError(
            f"D2L's table needs data=fra_eng_d2l (got data={cfg.data.name}); "
            "add data=fra_eng_d2l to the command"
        )
    name = cfg.model.name
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    prepare_store(record["tracking_uri"], cfg.mlflow.artifact_location)
    net = load_net(record["checkpoint"], expected_kind=name)
    with torch.no_grad():
        rows = d2l_table(net, load_tokenizer(cfg.paths.tokenized))
    lines = [f"{r['source']} => {r['translation']}, bleu,{r['bleu']:.3f}" for r in rows]
    print("\n".join(lines))
    perfect = sum(r["bleu"] == 1.0 for r in rows)
    print(f"{name}: BLEU 1.000 on {perfect} of {len(rows)} sentences")
    out = write_json_atomic(
        Path(cfg.paths.metrics) / f"d2l_{name}.json", {"rows": rows, "num_perfect": perfect}
    )
    log_to_run(
        record["run_id"],
        record["tracking_uri"],
        {f"d2l_bleu_{i}": r["bleu"] for i, r in enumerate(rows)} | {"d2l_num_perfect": perfect},
        [(out, "evaluation")],
    )
    print(f"→ {out}")


if __name__ == "__main__":
    main()
