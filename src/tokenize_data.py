"""DVC stage `tokenize`: sentencepiece on the training split, splits encoded to .npz.

Writes to data/tokenized/<corpus>-<src>-<tgt>/: spm.model, spm.vocab,
{train,val,test}.npz (token ids) and {val,test}.{src,tgt}.txt (normalized text).
    python src/tokenize_data.py data=multi30k data.tgt_lang=de
"""
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.data.corpora import CorpusError, load_splits
from attnlab.data.tokenizer import encode_split, train_sentencepiece
from attnlab.files import write_lines_atomic


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if cfg.data.name == "synthetic":
        raise SystemExit("data=synthetic needs no tokenizer; choose data=multi30k or data=fra_eng")
    try:
        splits = load_splits(cfg.data, Path(cfg.paths.raw))
    except CorpusError as e:
        raise SystemExit(f"tokenize failed: {e}") from None
    out = Path(cfg.paths.tokenized)
    out.mkdir(parents=True, exist_ok=True)
    train_text = [s for pair in splits["train"] for s in pair]  # joint vocabulary, train only
    sp = train_sentencepiece(train_text, out / "spm", cfg.data.vocab_size)
    for name, pairs in splits.items():
        encode_split(sp, pairs, out / f"{name}.npz")
        if name != "train":
            write_lines_atomic(out / f"{name}.src.txt", [s for s, _ in pairs])
            write_lines_atomic(out / f"{name}.tgt.txt", [t for _, t in pairs])
        print(f"{name}: {len(pairs)} pairs")
    print(f"vocabulary: {sp.get_piece_size()} pieces → {out}")


if __name__ == "__main__":
    main()
