"""The tokenize stage (``src/tokenize_data.py``, ``attnlab.data.tokenizer``) on bad input:
empty and over-long lines (the filter rule and its counts), an empty training split, a
vocabulary size the corpus cannot give, a corrupt raw corpus.

Each case gets a clear error naming the problem and the fix, and nothing is half-written:
a failed run leaves no staging folder and keeps the previous output.
"""

import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from attnlab.data.corpora import read_lines
from attnlab.data.tokenizer import (
    VocabSizeError,
    filter_pairs,
    load_sentencepiece,
    load_split,
    train_sentencepiece,
)
from helpers.corpus_fixture import REDOWNLOAD, flip, sentences

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")


def _gz(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(f"{s}\n" for s in lines).encode(), mtime=0))
    return path


# --- empty and over-long lines: the filter rule ----------------------------------------


def test_filter_rule_by_hand_at_the_max_len_boundary():
    src = [[5] * 3, [], [5] * 4, [5] * 3, [5] * 3, [5] * 5]
    tgt = [[6] * 4, [6], [6] * 2, [], [6] * 5, [6] * 3]
    keep, counts = filter_pairs(src, tgt, max_len=5)
    # 0: 3/4 tokens < 5 kept; 1, 3: an empty side; 2: 4/2 kept; 4: target has 5 ≥ 5; 5: source 5
    assert keep == [0, 2]
    assert counts == {"pairs": 6, "empty": 2, "too_long": 2, "kept": 2}
    with pytest.raises(ValueError, match="data.max_len must be ≥ 2"):
        filter_pairs(src, tgt, max_len=1)


def _tokenize_app():
    spec = importlib.util.spec_from_file_location("tokenize_data_app", ROOT / "src" / "tokenize_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cfg(root: Path, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=[f"paths.root={root}", *overrides])


LONG_EN = " ".join(["a dog sees the sea"] * 10)  # 50 words: ≥ 50 pieces, each word starts one
LONG_FR = " ".join(["un chien voit la mer"] * 10)


def _raw_corpus(root: Path) -> list[tuple[str, str]]:
    """data/raw/multi30k with the tiny corpus plus 4 empty-side and 2 over-long train pairs,
    and one empty and one over-long pair in val and in test (test_2016_flickr); test_2017_flickr
    is 5 pairs, one with an empty side."""
    train = [(e, f) for e, f, _ in sentences()[:40]]
    train[3:3] = [("", "Un chien."), ("A dog.", " \u00a0 "), ("", "")]  # 3 empty pairs
    train += [(LONG_EN, "Un chien."), ("A man.", LONG_FR), ("\u202f", "La mer.")]  # 2 long, 1 empty
    held = [(e, f) for e, f, _ in sentences()[40:44]]
    raw = root / "data" / "raw" / "multi30k"
    for split, pairs in {
        "train": train,
        "val": held + [("", "Rien."), (LONG_EN, "Long.")],
        "test_2016_flickr": [(LONG_EN, LONG_FR), ("", "")] + held,
        "test_2017_flickr": held[::-1] + [("A cat.", "")],
    }.items():
        _gz(raw / f"{split}.en.gz", [e for e, _ in pairs])
        _gz(raw / f"{split}.fr.gz", [f for _, f in pairs])
    return train


def test_tokenize_drops_empty_and_long_train_pairs_keeps_val_test_and_reports_counts(tmp_path, capsys):
    """Train: 46 read = 40 clean + 4 with an empty side + 2 with ≥ 50 tokens on a side.

    A clean sentence has at most 39 characters, so at most 40 pieces (< 50);
    the long ones have 50 words, so at least 50 pieces. Val/test keep all 6 pairs.
    """
    assert max(len(s) for e, f, _ in sentences() for s in (e, f)) == 39
    _raw_corpus(tmp_path)
    cfg = _cfg(tmp_path, "data=multi30k", "data.max_len=50", "data.vocab_size=5000")
    _tokenize_app().main(cfg)
    out = Path(cfg.paths.tokenized)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["max_len"] == 50
    assert stats["splits"] == {
        "train": {"pairs": 46, "empty": 4, "too_long": 2, "kept": 40},
        "val": {"pairs": 6, "empty": 1, "too_long": 1, "kept": 6},
        "test": {"pairs": 6, "empty": 1, "too_long": 1, "kept": 6},
        "test_2017": {"pairs": 5, "empty": 1, "too_long": 0, "kept": 5},
    }  # data.more_test_splits
    sp = load_sentencepiece(out / "spm.model")
    assert stats["vocab_size"] == {"requested": 5000, "actual": sp.get_piece_size()}
    assert sp.get_piece_size() < 5000  # the tiny corpus gives fewer: an upper bound, reported
    src, tgt = load_split(out / "train")
    assert len(src) == len(tgt) == 40 and min(map(len, src)) > 0 and max(map(len, tgt)) < 50
    assert [sp.decode(s.tolist()) for s in src] == [e for e, _, _ in sentences()[:40]]
    val_src, _ = load_split(out / "val")
    assert len(val_src) == 6 and len(val_src[4]) == 0 and len(val_src[5]) >= 50
    assert read_lines(out / "test.src.txt") == read_lines(
        tmp_path / "data/raw/multi30k/test_2016_flickr.en.gz"
    )
    raw_2017 = tmp_path / "data/raw/multi30k/test_2017_flickr"
    assert read_lines(out / "test_2017.src.txt") == read_lines(raw_2017.with_suffix(".en.gz"))
    assert read_lines(out / "test_2017.tgt.txt") == read_lines(raw_2017.with_suffix(".fr.gz"))
    printed = capsys.readouterr().out
    assert (
        "train: 40 pairs kept of 46 (dropped 4 with an empty side, 2 with ≥ 50 tokens on a side)" in printed
    )
    assert "val: 6 pairs, all kept (1 with an empty side, 1 with ≥ 50 tokens on a side)" in printed
    assert f"sentencepiece stopped at {sp.get_piece_size()}" in printed
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no staging folder left


# --- a truncated or corrupt raw corpus ---------------------------------------------------


def test_tokenize_of_a_truncated_gzip_names_it_and_writes_nothing(tmp_path):
    _raw_corpus(tmp_path)
    bad = tmp_path / "data/raw/multi30k/train.fr.gz"
    bad.write_bytes(bad.read_bytes()[:-10])
    cfg = _cfg(tmp_path, "data=multi30k")
    with pytest.raises(
        SystemExit,
        match=rf"^tokenize: {re.escape(str(bad))} is truncated or "
        rf"corrupt \(EOFError.*{REDOWNLOAD}",
    ):
        _tokenize_app().main(cfg)
    assert not (tmp_path / "data" / "tokenized").exists()


def test_tokenize_d2l_of_a_corrupt_zip_names_it_and_writes_nothing(mirror, tmp_path):
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / "fra-eng.zip").write_bytes(flip((mirror[0] / "fra-eng.zip").read_bytes(), 100))
    cfg = _cfg(tmp_path, "data=fra_eng_d2l")
    with pytest.raises(
        SystemExit,
        match=rf"^tokenize: {re.escape(str(raw / 'fra-eng.zip'))} is "
        rf"truncated or corrupt \(BadZipFile: Bad CRC-32.*{REDOWNLOAD}",
    ):
        _tokenize_app().main(cfg)
    assert not (tmp_path / "data" / "tokenized").exists()


# --- an empty training split ---------------------------------------------------------------


def test_empty_training_split_is_an_error_and_keeps_the_previous_output(tmp_path):
    _raw_corpus(tmp_path)
    raw = tmp_path / "data/raw/multi30k"
    _gz(raw / "train.en.gz", ["", "A dog.", ""])
    _gz(raw / "train.fr.gz", ["Un chien.", " ", ""])
    cfg = _cfg(tmp_path, "data=multi30k")
    out = Path(cfg.paths.tokenized)
    out.mkdir(parents=True)
    (out / "spm.model").write_bytes(b"previous run")
    with pytest.raises(
        SystemExit,
        match=r"^tokenize: the training split is empty: 3 pairs read, "
        r"none with text on both sides; nothing was written\. Check .*multi30k/"
        r"train\.\{en,fr\}\.gz \(delete them and re-run `dvc repro download`\) and "
        r"data\.splits\.train",
    ):
        _tokenize_app().main(cfg)
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no staging folder
    assert [p.name for p in out.iterdir()] == ["spm.model"]
    assert (out / "spm.model").read_bytes() == b"previous run"


def test_held_out_split_taking_every_pair_names_data_heldout(mirror, tmp_path):
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / "fra-eng.zip").write_bytes((mirror[0] / "fra-eng.zip").read_bytes())  # 48 pairs
    cfg = _cfg(tmp_path, "data=fra_eng", "data.heldout.num_val=24", "data.heldout.num_test=24")
    with pytest.raises(
        SystemExit,
        match=r"the training split is empty: 0 pairs read.*data\.heldout "
        r"\(num_val=24 \+ num_test=24 pairs are held out",
    ):
        _tokenize_app().main(cfg)
    assert not (tmp_path / "data" / "tokenized").exists()


# --- a vocabulary size the corpus cannot give ------------------------------------------------

TEXT = [s for e, f, _ in sentences()[:40] for s in (e, f)]


def test_too_large_vocabulary_names_the_key_and_the_largest_size_that_works(tmp_path):
    with pytest.raises(
        VocabSizeError,
        match=r"^data\.vocab_size=5000 is too large for this training "
        r"corpus: sentencepiece can make at most \d+ pieces from it; set "
        r"data\.vocab_size=\d+ \(or less\)",
    ) as e:
        train_sentencepiece(TEXT, tmp_path / "spm", 5000, hard_vocab_limit=True)
    assert list(tmp_path.iterdir()) == []  # no model, no temporary prefix files
    most = int(re.search(r"set data\.vocab_size=(\d+)", str(e.value)).group(1))
    assert 100 < most < 5000
    sp = train_sentencepiece(TEXT, tmp_path / "spm", most, hard_vocab_limit=True)
    assert sp.get_piece_size() == most  # the size the message names does work


def test_too_small_vocabulary_names_the_key_and_the_smallest_size_that_works(tmp_path):
    with pytest.raises(
        VocabSizeError,
        match=r"^data\.vocab_size=10 is too small for this training "
        r"corpus: its characters and the 4 special pieces alone need \d+; set "
        r"data\.vocab_size=\d+ \(or more\)",
    ) as e:
        train_sentencepiece(TEXT, tmp_path / "spm", 10)
    assert list(tmp_path.iterdir()) == []
    least = int(re.search(r"set data\.vocab_size=(\d+)", str(e.value)).group(1))
    n_chars = len(set("".join(TEXT).replace(" ", "")))  # plus "▁" and the 4 specials
    assert least == n_chars + 1 + 4
    assert train_sentencepiece(TEXT, tmp_path / "spm", least).get_piece_size() == least


def test_tokenize_with_too_small_vocabulary_exits_and_writes_nothing(tmp_path):
    _raw_corpus(tmp_path)
    cfg = _cfg(tmp_path, "data=multi30k", "data.vocab_size=10")
    with pytest.raises(
        SystemExit,
        match=r"^tokenize: data\.vocab_size=10 is too small.*set "
        r"data\.vocab_size=\d+ \(or more\); nothing was written$",
    ):
        _tokenize_app().main(cfg)
    assert list((tmp_path / "data" / "tokenized").iterdir()) == []  # staging folder removed
