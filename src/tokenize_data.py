"""DVC stage `tokenize`: corpus text → a tokenizer and token-id arrays.

Sentencepiece corpora (data=multi30k, data=fra_eng) write to
data/tokenized/<corpus>-<src>-<tgt>/: spm.model, spm.vocab, {train,val,test}.npz
(token ids), {val,test}.{src,tgt}.txt (normalized text) and stats.json.
Training pairs with an empty side, or with data.max_len or more tokens on a
side, are dropped (attnlab.data.tokenizer.filter_pairs); val and test keep every
pair so they stay aligned with their references. stats.json and the printout
(one line per split, then a summary) give the counts.
data=fra_eng_d2l writes D2L's fixed-length arrays instead (see attnlab.data.d2l):
vocab.json, {train,val}.npz, val.{src,tgt}.txt (D2L-preprocessed text), stats.json.

The output folder is built beside the target and renamed into place at the
end (attnlab.files.staged_dir): a failed run leaves the previous output as it
was, and no partial one.
    python src/tokenize_data.py data=multi30k data.tgt_lang=de
    python src/tokenize_data.py data=fra_eng_d2l
"""
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.console import logs, summaries
from attnlab.data import d2l
from attnlab.data.corpora import CorpusError, load_splits
from attnlab.data.tokenizer import (VocabSizeError, encode_pairs, filter_pairs, train_sentencepiece,
                                    write_split)
from attnlab.files import staged_dir, write_json_atomic, write_lines_atomic

RULE = ("training pairs with an empty side (after normalization) or with max_len or more "
        "sentencepiece tokens on a side are dropped; val and test keep every pair")


def _empty_train_fix(cfg: DictConfig) -> str:
    """What to change when the training split has no usable pair."""
    c = cfg.data
    if c.name == "multi30k":
        return (f"Check {cfg.paths.raw}/multi30k/{c.splits.train}.{{{c.src_lang},{c.tgt_lang}}}.gz "
                "(delete them and re-run `dvc repro download`) and data.splits.train")
    return (f"Check {cfg.paths.raw}/fra-eng.zip (delete it and re-run `dvc repro download`) and "
            f"data.heldout (num_val={c.heldout.num_val} + num_test={c.heldout.num_test} pairs "
            "are held out before training gets any)")


def tokenize_d2l(cfg: DictConfig, out: Path) -> None:
    """D2L's MTFraEng arrays and vocabularies (data=fra_eng_d2l), no filtering (D2L trims/pads)."""
    zip_path = Path(cfg.paths.raw) / "fra-eng.zip"
    c = cfg.data
    if (c.src_lang, c.tgt_lang) != ("en", "fr"):
        raise SystemExit(f"data=fra_eng_d2l is D2L's English→French setup; got "
                         f"{c.src_lang}→{c.tgt_lang} (drop the data.src_lang/data.tgt_lang overrides)")
    try:
        train, val, tokenizer, (src, tgt) = d2l.mt_fra_eng(
            d2l.read_fra_txt(zip_path), c.num_steps, c.num_train, c.num_val, c.min_freq)
    except CorpusError as e:
        raise SystemExit(f"tokenize failed: {e}") from None
    except ValueError as e:
        raise SystemExit(f"tokenize failed: {zip_path}: {e}") from None
    with staged_dir(out) as tmp:
        tokenizer.save(tmp / d2l.VOCAB_FILE)
        d2l.save_arrays(train, tmp / "train.npz")
        d2l.save_arrays(val, tmp / "val.npz")
        # Val text in D2L's token space (the <eos> dropped), for val_bleu and heatmaps.
        write_lines_atomic(tmp / "val.src.txt", [" ".join(s[:-1]) for s in src[c.num_train:]])
        write_lines_atomic(tmp / "val.tgt.txt", [" ".join(t[:-1]) for t in tgt[c.num_train:]])
        write_json_atomic(tmp / "stats.json", {
            "rule": "none: D2L's MTFraEng trims or pads every sequence to num_steps",
            "splits": {"train": len(train["src"]), "val": len(val["src"])}})
    print(summaries.tokenize_summary(
        f"{c.name} {c.src_lang}-{c.tgt_lang}, D2L words", out,
        {"train": str(len(train["src"])), "val": str(len(val["src"]))},
        f"{tokenizer.source_vocab_size()} source words, {tokenizer.get_piece_size()} target words"))


def tokenize_sentencepiece(cfg: DictConfig, out: Path) -> None:
    """Joint sentencepiece BPE on the training split; filtered train, full val/test; stats.json."""
    c = cfg.data
    if c.max_len < 2:
        raise SystemExit(f"tokenize failed: data.max_len={c.max_len} would drop every pair; "
                         "set data.max_len=2 or more (a token plus <eos>)")
    try:
        splits = load_splits(c, Path(cfg.paths.raw))
    except CorpusError as e:
        raise SystemExit(f"tokenize failed: {e}") from None
    usable = [(s, t) for s, t in splits["train"] if s and t]
    if not usable:  # checked before anything is written
        raise SystemExit(f"tokenize failed: the training split is empty: {len(splits['train'])} pairs "
                         "read, none with text on both sides; nothing was written. "
                         + _empty_train_fix(cfg))
    stats = {"rule": RULE, "max_len": c.max_len, "splits": {}}
    with staged_dir(out) as tmp:
        try:  # joint vocabulary, trained on the train pairs that have text on both sides
            sp = train_sentencepiece([s for pair in usable for s in pair], tmp / "spm", c.vocab_size)
        except VocabSizeError as e:
            raise SystemExit(f"tokenize failed: {e}; nothing was written") from None
        stats["vocab_size"] = {"requested": c.vocab_size, "actual": sp.get_piece_size()}
        for name, pairs in splits.items():
            src, tgt = encode_pairs(sp, pairs)
            keep, counts = filter_pairs(src, tgt, c.max_len)
            if name == "train":
                if not keep:
                    raise SystemExit(
                        f"tokenize failed: every training pair has data.max_len={c.max_len} or more "
                        f"tokens on a side ({counts}); nothing was written. Raise data.max_len")
                src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
                print(f"{name}: {counts['kept']} pairs kept of {counts['pairs']} (dropped "
                      f"{counts['empty']} with an empty side, {counts['too_long']} with "
                      f"≥ {c.max_len} tokens on a side)")
            else:  # aligned with the references: keep all, report what training would drop
                counts["kept"] = counts["pairs"]
                write_lines_atomic(tmp / f"{name}.src.txt", [s for s, _ in pairs])
                write_lines_atomic(tmp / f"{name}.tgt.txt", [t for _, t in pairs])
                print(f"{name}: {counts['pairs']} pairs, all kept ({counts['empty']} with an empty "
                      f"side, {counts['too_long']} with ≥ {c.max_len} tokens on a side)")
            write_split(tmp / f"{name}.npz", src, tgt)
            stats["splits"][name] = counts
        write_json_atomic(tmp / "stats.json", stats)
    note = ""
    if sp.get_piece_size() < c.vocab_size:
        note = (f" (data.vocab_size={c.vocab_size} is more than this corpus gives; "
                f"sentencepiece stopped at {sp.get_piece_size()})")
    kept = {name: str(n["kept"]) + (f" of {n['pairs']}" if n["kept"] != n["pairs"] else "")
            for name, n in stats["splits"].items()}
    print(summaries.tokenize_summary(f"{c.name} {c.src_lang}-{c.tgt_lang}, sentencepiece", out, kept,
                                     f"{sp.get_piece_size()} pieces{note}"))


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    logs.setup(mlflow=False)
    if cfg.data.name == "synthetic":
        raise SystemExit("data=synthetic needs no tokenizer; choose data=multi30k or data=fra_eng")
    out = Path(cfg.paths.tokenized)
    if cfg.data.get("tokenizer", "sentencepiece") == "d2l_words":
        return tokenize_d2l(cfg, out)
    return tokenize_sentencepiece(cfg, out)


if __name__ == "__main__":
    main()
