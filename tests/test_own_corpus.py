"""A user's own parallel corpus (``data=parallel``, ``attnlab.data.corpora.read_parallel_corpus``):
both layouts, held-out splits, the errors for bad input, the sentencepiece settings for Chinese,
and a tokenizer taken from a parent model.

Every error names the file (and line) and the fix, and is raised before anything is written: the
tokenized folder is either the previous one or absent.
"""

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from hydra import compose, initialize_config_dir

from attnlab.data.corpora import read_lines, read_parallel_corpus
from attnlab.data.tokenizer import (
    CJK_COVERAGE,
    FULL_COVERAGE,
    choose_character_coverage,
    load_sentencepiece,
    load_split,
    split_files,
    train_sentencepiece,
)
from helpers import zh_en_corpus
from helpers.corpus_fixture import sentences

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "zh-en"
PAIRS = [(e, f) for e, f, _ in sentences()]  # 48 English–French pairs


def _cfg(root: Path, *overrides, data: str = "parallel"):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[f"paths.root={root}", f"data={data}", *overrides])


def _tokenize(cfg):
    spec = importlib.util.spec_from_file_location("tokenize_data_app", ROOT / "src" / "tokenize_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(cfg)
    return Path(cfg.paths.tokenized)


def _write(path: Path, lines, gz: bool = False) -> Path:
    data = "".join(f"{line}\n" for line in lines).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def _lines_layout(folder: Path, splits: dict, gz: bool = False) -> Path:
    for name, pairs in splits.items():
        suffix = ".gz" if gz else ""
        _write(folder / f"{name}.en{suffix}", [s for s, _ in pairs], gz)
        _write(folder / f"{name}.fr{suffix}", [t for _, t in pairs], gz)
    return folder


def _tsv_layout(folder: Path, splits: dict, gz: bool = False) -> Path:
    for name, pairs in splits.items():
        _write(folder / (f"{name}.tsv" + (".gz" if gz else "")), [f"{s}\t{t}" for s, t in pairs], gz)
    return folder


SPLITS = {"train": PAIRS[:40], "val": PAIRS[40:44], "test": PAIRS[44:]}


def _spm_and_ids(out: Path) -> tuple[bytes, dict]:
    arrays = {}
    for name in ("train", "val", "test"):
        arrays[name] = {k: np.load(p).tolist() for k, p in split_files(out / name).items()}
    return (out / "spm.model").read_bytes(), arrays


# --- the two layouts ------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_both_layouts_give_the_pairs_and_the_same_tokenized_bytes(tmp_path, gz):
    lines = _lines_layout(tmp_path / "lines", SPLITS, gz)
    tsv = _tsv_layout(tmp_path / "tsv", SPLITS, gz)
    cfg = _cfg(tmp_path, f"data.path={lines}")
    read, heldout = read_parallel_corpus(cfg.data, lines)
    assert read == SPLITS and heldout == {}
    assert read_parallel_corpus(cfg.data, tsv) == (SPLITS, {})
    outs = [_tokenize(_cfg(tmp_path / f.name, f"data.path={f}", "data.vocab_size=200")) for f in (lines, tsv)]
    assert _spm_and_ids(outs[0]) == _spm_and_ids(outs[1])
    assert read_lines(outs[0] / "test.tgt.txt") == [t for _, t in SPLITS["test"]]
    sp = load_sentencepiece(outs[0] / "spm.model")
    src, tgt = load_split(outs[0] / "val")
    assert [(sp.decode(s.tolist()), sp.decode(t.tolist())) for s, t in zip(src, tgt)] == SPLITS["val"]


def test_the_reverse_direction_reads_the_same_files(tmp_path):
    folder = _lines_layout(tmp_path / "c", SPLITS)
    cfg = _cfg(tmp_path, f"data.path={folder}", "data.src_lang=fr", "data.tgt_lang=en")
    read, _ = read_parallel_corpus(cfg.data, folder)
    assert read["train"] == [(t, s) for s, t in SPLITS["train"]]


def test_missing_val_and_test_are_held_out_of_train_with_a_fixed_seed(tmp_path, capsys):
    folder = _lines_layout(tmp_path / "c", {"train": PAIRS})
    overrides = [f"data.path={folder}", "data.heldout.num_val=5", "data.heldout.num_test=3"]
    cfg = _cfg(tmp_path, *overrides)
    read, heldout = read_parallel_corpus(cfg.data, folder)
    assert heldout == {"val": 5, "test": 3}
    assert [len(read[k]) for k in ("train", "val", "test")] == [40, 5, 3]
    assert sorted(read["train"] + read["val"] + read["test"]) == sorted(PAIRS)  # disjoint, complete
    assert read_parallel_corpus(cfg.data, folder) == (read, heldout)  # the same split every run
    other, _ = read_parallel_corpus(_cfg(tmp_path, *overrides, "data.heldout.seed=1").data, folder)
    assert other["test"] != read["test"]
    # only the missing split is held out: a val file stays val, and test comes out of train
    _write(folder / "val.en", [s for s, _ in PAIRS[:2]])
    _write(folder / "val.fr", [t for _, t in PAIRS[:2]])
    read, heldout = read_parallel_corpus(cfg.data, folder)
    assert heldout == {"test": 3} and read["val"] == PAIRS[:2] and len(read["train"]) == 45
    out = _tokenize(cfg)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["heldout"] == {"seed": 0, "test": 3}
    assert "test: 3 pairs held out of train (seed 0), all kept" in capsys.readouterr().out


# --- bad input: the file, the line, the fix; nothing written --------------------------------


def _bad(tmp_path, case: str) -> Path:
    folder = tmp_path / "bad"
    if case == "no tab":
        _tsv_layout(folder, SPLITS)
        text = (folder / "val.tsv").read_text().splitlines()
        text[2] = text[2].replace("\t", " ")
        (folder / "val.tsv").write_text("\n".join(text) + "\n")
    elif case == "two tabs":
        _tsv_layout(folder, SPLITS)
        _write(folder / "test.tsv", ["A\tB", "C\tD\tE"])
    elif case == "unequal":
        _lines_layout(folder, SPLITS)
        _write(folder / "train.fr", [t for _, t in SPLITS["train"][:-1]])
    elif case == "not utf-8":
        _lines_layout(folder, SPLITS)
        raw = (folder / "train.fr").read_bytes().split(b"\n")
        raw[6] = "Un caf\u00e9.".encode("latin-1")
        (folder / "train.fr").write_bytes(b"\n".join(raw))
    elif case == "empty split":
        _lines_layout(folder, SPLITS)
        (folder / "val.en").write_bytes(b"")
        (folder / "val.fr").write_bytes(b"")
    elif case == "language":
        _lines_layout(folder, SPLITS)
    elif case == "both layouts":
        _lines_layout(folder, SPLITS)
        _tsv_layout(folder, {"val": SPLITS["val"]})
    elif case == "gz and plain":
        _lines_layout(folder, SPLITS)
        _write(folder / "train.en.gz", ["A."], gz=True)
    elif case == "no train":
        _lines_layout(folder, {"val": SPLITS["val"]})
    elif case == "held out too many":
        _lines_layout(folder, {"train": PAIRS[:10]})
    elif case == "not a folder":
        pass
    return folder


BAD = {
    # case: (extra overrides, the message; {folder} is the corpus folder)
    "no tab": ([], "{folder}/val.tsv: line 3 has no tab; each line must be source<TAB>target"),
    "two tabs": ([], "{folder}/test.tsv: line 2 has 2 tabs; each line must be source<TAB>target"),
    "unequal": ([], "line counts differ: {folder}/train.en has 40 lines, {folder}/train.fr has 39"),
    "not utf-8": ([], "{folder}/train.fr: line 7 is not valid UTF-8 (invalid continuation byte); "
                  "convert the file to UTF-8 or fix that line"),
    "empty split": ([], "split 'val' is empty ({folder}/val.en and {folder}/val.fr has no line)"),
    "language": (["data.src_lang=zh"], "{folder} has split 'train' in the languages en, fr, not in zh "
                 "(no train.zh): set src_lang/tgt_lang to two of en, fr"),
    "both layouts": ([], "{folder} has split 'val' twice, as val.tsv and as val.en: keep one layout"),
    "gz and plain": ([], "{folder} has both train.en and train.en.gz: keep one"),
    "no train": ([], "{folder} has no training split: it needs train.<src_lang> and train.<tgt_lang>"),
    "held out too many": (
        ["data.heldout.num_val=6", "data.heldout.num_test=4"],
        "{folder} has no val and no test split, and holding out data.heldout.num_val=6 + "
        "data.heldout.num_test=4 pairs from its 10 training pairs leaves none to train on",
    ),
    "not a folder": ([], "data.path={folder} is not a folder; point data.path (params.yaml: data_path)"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_corpus_is_refused_with_file_line_and_fix_and_nothing_is_written(tmp_path, case):
    folder = _bad(tmp_path, case)
    overrides, message = BAD[case]
    cfg = _cfg(tmp_path, f"data.path={folder}", *overrides)
    out = Path(cfg.paths.tokenized)
    out.mkdir(parents=True)
    (out / "previous.txt").write_text("the last good output")
    with pytest.raises(SystemExit) as e:
        _tokenize(cfg)
    assert str(e.value).startswith("tokenize: ") and message.format(folder=folder) in str(e.value)
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no staging folder left
    assert [p.name for p in out.iterdir()] == ["previous.txt"]


def test_without_data_path_the_error_says_how_to_set_it(tmp_path):
    with pytest.raises(SystemExit, match=r"data=parallel needs the folder of your corpus: set data.path="):
        _tokenize(_cfg(tmp_path))


def test_the_download_folder_as_data_path_is_refused_as_unset(tmp_path):
    """params.yaml's default data_path is data/raw: `-S data=parallel` alone reaches tokenize
    with it, and gets the same error as no data.path at all, not "no training split"."""
    refused = r"needs the folder of your corpus, not the download folder data/raw: set data.path="
    with pytest.raises(SystemExit, match=refused):
        _tokenize(_cfg(tmp_path, "data.path=data/raw"))


def test_a_damaged_gz_of_ones_own_is_to_be_re_created_not_downloaded(tmp_path):
    folder = _lines_layout(tmp_path / "mine", SPLITS, gz=True)
    whole = (folder / "train.fr.gz").read_bytes()
    (folder / "train.fr.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SystemExit) as e:
        _tokenize(_cfg(tmp_path, f"data.path={folder}"))
    message = str(e.value)
    assert f"{folder}/train.fr.gz is truncated or corrupt (EOFError" in message, message
    assert message.endswith(
        "re-create or re-compress it from your copy of the corpus (no stage downloads it)"
    ), message
    assert "dvc repro download" not in message


def test_a_byte_order_mark_is_not_part_of_the_first_sentence(tmp_path):
    folder = _lines_layout(tmp_path / "mine", SPLITS)
    (folder / "train.en").write_bytes(b"\xef\xbb\xbf" + (folder / "train.en").read_bytes())
    read, _ = read_parallel_corpus(_cfg(tmp_path).data, folder)
    assert read["train"][0] == SPLITS["train"][0]


def test_a_relative_data_path_starts_at_the_project_root(tmp_path):
    _lines_layout(tmp_path / "corpora" / "mine", SPLITS)
    out = _tokenize(_cfg(tmp_path, "data.path=corpora/mine", "data.vocab_size=200"))
    assert read_lines(out / "val.src.txt") == [s for s, _ in SPLITS["val"]]


# --- Chinese: the fixture, character coverage ------------------------------------------------


def test_the_committed_zh_en_fixture_is_what_its_generator_writes(tmp_path):
    zh_en_corpus.write(tmp_path)
    for path in sorted(FIXTURE.iterdir()):
        assert gzip.decompress(path.read_bytes()) == gzip.decompress((tmp_path / path.name).read_bytes())
    splits = zh_en_corpus.pairs()
    assert [len(v) for v in splits.values()] == list(zh_en_corpus.SPLITS.values())
    seen = [pair for v in splits.values() for pair in v]
    assert len(set(seen)) == len(seen)  # no test sentence is also a training sentence
    zh, en = splits["train"][0]
    assert " " not in zh and zh.endswith(("。", "？")) and en.endswith((".", "?"))


def test_character_coverage_follows_the_script():
    assert choose_character_coverage(["A man rides a bike.", "Un homme fait du vélo."]) == FULL_COVERAGE
    assert choose_character_coverage(["我有三本书。", "I have three books."]) == CJK_COVERAGE
    # 1 Han character in 120 non-space characters is under 1%: a stray character is not Chinese text
    assert choose_character_coverage(["x" * 119 + "书"]) == FULL_COVERAGE
    assert choose_character_coverage(["x" * 99 + "书"]) == CJK_COVERAGE
    assert choose_character_coverage(["こんにちは", "안녕하세요"]) == CJK_COVERAGE
    assert choose_character_coverage([]) == FULL_COVERAGE


def test_a_chinese_corpus_trains_sentencepiece_with_cjk_coverage(tmp_path, capsys):
    out = _tokenize(
        _cfg(tmp_path, f"data.path={FIXTURE}", "data.src_lang=zh", "data.tgt_lang=en", "data.vocab_size=500")
    )
    stats = json.loads((out / "stats.json").read_text())
    assert stats["character_coverage"] == CJK_COVERAGE
    assert stats["corpus_path"] == str(FIXTURE)  # the folder, as data.path gave it
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString((out / "spm.model").read_bytes())
    assert proto.trainer_spec.character_coverage == pytest.approx(CJK_COVERAGE)
    assert "character_coverage 0.9995 (CJK text)" in capsys.readouterr().out
    sp = load_sentencepiece(out / "spm.model")
    src, tgt = load_split(out / "test")
    zh, en = zh_en_corpus.pairs()["test"][0]
    assert (sp.decode(src[0].tolist()), sp.decode(tgt[0].tolist())) == (zh, en)
    # an English–French corpus keeps full coverage, the setting for small alphabets
    fr = _tokenize(_cfg(tmp_path / "fr", f"data.path={_lines_layout(tmp_path / 'c', SPLITS)}"))
    proto = sentencepiece_model_pb2.ModelProto.FromString((fr / "spm.model").read_bytes())
    assert proto.trainer_spec.character_coverage == FULL_COVERAGE
    assert "character_coverage" not in json.loads((fr / "stats.json").read_text())


def test_a_sentence_sample_trains_the_same_pieces_every_run(tmp_path):
    text = [s for pair in zh_en_corpus.pairs()["train"][:2000] for s in pair]
    a = train_sentencepiece(text, tmp_path / "a", 300, input_sentence_size=200)
    train_sentencepiece(text, tmp_path / "b", 300, input_sentence_size=200)
    full = train_sentencepiece(text, tmp_path / "full", 300)
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
    pieces = {full.id_to_piece(i) for i in range(full.get_piece_size())}
    assert {a.id_to_piece(i) for i in range(a.get_piece_size())} != pieces  # 200 of 4000 sentences
    with pytest.raises(SystemExit, match=r"data.input_sentence_size=50 is too small: sentencepiece"):
        _tokenize(_cfg(tmp_path, f"data.path={FIXTURE}", "data.src_lang=zh", "data.tgt_lang=en",
                       "data.input_sentence_size=50"))  # fmt: skip


# --- a parent's tokenizer ------------------------------------------------------------------------


def test_tokenizer_from_copies_the_parents_model_and_encodes_with_it(tmp_path):
    parent = _tokenize(_cfg(tmp_path / "p", f"data.path={_lines_layout(tmp_path / 'c1', SPLITS)}"))
    other = {"train": PAIRS[10:], "val": PAIRS[:3], "test": PAIRS[3:6]}
    cfg = _cfg(
        tmp_path / "child",
        f"data.path={_lines_layout(tmp_path / 'c2', other)}",
        f"data.tokenizer_from={parent / 'spm.model'}",
    )
    out = _tokenize(cfg)
    assert (out / "spm.model").read_bytes() == (parent / "spm.model").read_bytes()
    assert (out / "spm.vocab").read_text() == (parent / "spm.vocab").read_text()
    sp = spm.SentencePieceProcessor(model_file=str(parent / "spm.model"))
    src, _ = load_split(out / "val")
    assert [s.tolist() for s in src] == sp.encode([s for s, _ in other["val"]])
    bad = tmp_path / "not.model"
    bad.write_bytes(b"not a model")
    for path, message in (
        (tmp_path / "none.model", "does not exist"),
        (bad, "is not a usable sentencepiece"),
    ):
        with pytest.raises(SystemExit, match=f"data.tokenizer_from={path} {message}"):
            _tokenize(_cfg(tmp_path / "child", f"data.path={tmp_path / 'c2'}", f"data.tokenizer_from={path}"))
    assert (out / "spm.model").read_bytes() == (parent / "spm.model").read_bytes()  # kept


def test_multi30k_files_read_as_a_parallel_corpus_give_multi30k_s_ids(tmp_path, mirror_dir):
    """The same files through data=multi30k and through data=parallel: the same bytes."""
    raw = tmp_path / "m" / "data" / "raw"
    shutil.copytree(mirror_dir / "multi30k", raw / "multi30k")
    folder = tmp_path / "as-parallel"
    folder.mkdir()
    for stem, name in (("train", "train"), ("val", "val"), ("test_2016_flickr", "test")):
        for lang in ("en", "fr"):
            shutil.copy(raw / "multi30k" / f"{stem}.{lang}.gz", folder / f"{name}.{lang}.gz")
    multi30k = _tokenize(
        _cfg(
            tmp_path / "m",
            "data.more_test_splits=[]",
            "~data.splits.test_2017",
            "data.vocab_size=300",
            data="multi30k",
        )
    )
    parallel = _tokenize(
        _cfg(tmp_path / "p", f"data.path={folder}", "data.vocab_size=300", "data.input_sentence_size=0")
    )
    assert _spm_and_ids(multi30k) == _spm_and_ids(parallel)
