"""DVC stage `tokenize`: corpus text → a tokenizer and token-id arrays.

Sentencepiece corpora (data=multi30k, data=fra_eng) write to
data/tokenized/<corpus>-<src>-<tgt>/: spm.model, spm.vocab, {train,val,test}.npz
(token ids) and {val,test}.{src,tgt}.txt (normalized text).
data=fra_eng_d2l writes D2L's fixed-length arrays instead (see attnlab.data.d2l):
vocab.json, {train,val}.npz and val.{src,tgt}.txt (D2L-preprocessed text).
    python src/tokenize_data.py data=multi30k data.tgt_lang=de
    python src/tokenize_data.py data=fra_eng_d2l
"""
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.data import d2l
from attnlab.data.corpora import CorpusError, load_splits
from attnlab.data.tokenizer import encode_split, train_sentencepiece
from attnlab.files import write_lines_atomic


def tokenize_d2l(cfg: DictConfig, out: Path) -> None:
    """D2L's MTFraEng arrays and vocabularies (data=fra_eng_d2l)."""
    zip_path = Path(cfg.paths.raw) / "fra-eng.zip"
    if not zip_path.exists():
        raise SystemExit(f"tokenize failed: {zip_path} does not exist; run `dvc repro download` "
                         "(or `python src/download.py`) first")
    c = cfg.data
    if (c.src_lang, c.tgt_lang) != ("en", "fr"):
        raise SystemExit(f"data=fra_eng_d2l is D2L's English→French setup; got "
                         f"{c.src_lang}→{c.tgt_lang} (drop the data.src_lang/data.tgt_lang overrides)")
    try:
        train, val, tokenizer, (src, tgt) = d2l.mt_fra_eng(
            d2l.read_fra_txt(zip_path), c.num_steps, c.num_train, c.num_val, c.min_freq)
    except (ValueError, KeyError, OSError) as e:
        raise SystemExit(f"tokenize failed: {zip_path}: {e}") from None
    tokenizer.save(out / d2l.VOCAB_FILE)
    d2l.save_arrays(train, out / "train.npz")
    d2l.save_arrays(val, out / "val.npz")
    # Val text in D2L's token space (the <eos> dropped), for val_bleu and heatmaps.
    write_lines_atomic(out / "val.src.txt", [" ".join(s[:-1]) for s in src[c.num_train:]])
    write_lines_atomic(out / "val.tgt.txt", [" ".join(t[:-1]) for t in tgt[c.num_train:]])
    print(f"train: {len(train['src'])} pairs\nval: {len(val['src'])} pairs")
    print(f"vocabulary: {tokenizer.source_vocab_size()} source words, "
          f"{tokenizer.get_piece_size()} target words → {out}")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if cfg.data.name == "synthetic":
        raise SystemExit("data=synthetic needs no tokenizer; choose data=multi30k or data=fra_eng")
    out = Path(cfg.paths.tokenized)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.data.get("tokenizer", "sentencepiece") == "d2l_words":
        return tokenize_d2l(cfg, out)
    try:
        splits = load_splits(cfg.data, Path(cfg.paths.raw))
    except CorpusError as e:
        raise SystemExit(f"tokenize failed: {e}") from None
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
