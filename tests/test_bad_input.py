"""Bad input, none of it losing work: each case gets its exact error class, a message that
names the problem and the fix, and a check that nothing was lost or half-written.

Cases: truncated or corrupt archives (download and reading), non-UTF-8 bytes, empty and
over-long lines (the tokenize stage's filter rule and its counts), an empty training
split, a vocabulary size the corpus cannot give, a checkpoint of another model, an
unknown Hydra key.
"""
import gzip
import http.client
import importlib.util
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from attnlab.checkpoint import CheckpointError, load_net
from attnlab.data import d2l
from attnlab.data import download as download_mod
from attnlab.data.corpora import CorpusError, read_fra_eng, read_lines, read_multi30k
from attnlab.data.download import DownloadError, fetch
from attnlab.data.tokenizer import (VocabSizeError, filter_pairs, load_sentencepiece, load_split,
                                    train_sentencepiece)
from corpus_fixture import sentences, write_mirror

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
REDOWNLOAD = re.escape("delete it and re-run `dvc repro download`")


def _gz(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(f"{s}\n" for s in lines).encode(), mtime=0))
    return path


def _zip_with(path: Path, raw: bytes) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("fra-eng/fra.txt", raw)
    path.write_bytes(buf.getvalue())
    return path


def _flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1:]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("mirror")
    return root, write_mirror(root)


# --- 1. truncated or corrupt archives: download --------------------------------

def test_truncated_download_is_discarded_and_names_file_and_fix(mirror, tmp_path):
    good, digests = mirror
    bad = tmp_path / "bad_mirror"
    bad.mkdir()
    whole = (good / "fra-eng.zip").read_bytes()
    (bad / "fra-eng.zip").write_bytes(whole[:len(whole) // 2])
    raw = tmp_path / "raw"
    with pytest.raises(DownloadError, match=r"checksum mismatch for fra-eng\.zip .*"
                       rf"\({len(whole) // 2} bytes\).*truncated or corrupt copy.*re-run `dvc repro "
                       r"download`; if it persists, replace the mirror's copy"):
        fetch("fra-eng.zip", "http://unused.invalid/fra-eng.zip",
              {"sha256": [digests["fra-eng.zip"]]}, raw, mirror=str(bad))
    assert list(raw.iterdir()) == []  # no file, no .part


def test_truncated_file_in_raw_is_replaced_by_a_verified_copy(mirror, tmp_path):
    good, digests = mirror
    rel = "multi30k/train.en.gz"
    dest = tmp_path / "raw" / rel
    dest.parent.mkdir(parents=True)
    dest.write_bytes((good / rel).read_bytes()[:50])  # an interrupted copy
    fetched = fetch(rel, "http://unused.invalid/", {"sha256": [digests[rel]]}, tmp_path / "raw",
                    mirror=str(good))
    assert fetched == (dest, True)  # the download stage reports it as fetched, not kept
    assert dest.read_bytes() == (good / rel).read_bytes()
    assert len(read_lines(dest)) == 40


class _CutStream:
    """A response that sends ``data`` then drops the connection."""

    def __init__(self, data: bytes):
        self.parts = [data]

    def read(self, n):
        if self.parts:
            return self.parts.pop()
        raise http.client.IncompleteRead(b"", 1000)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_transfer_cut_short_keeps_the_existing_file(monkeypatch, tmp_path):
    rel = "multi30k/val.en.gz"
    url = "https://example.invalid/val.en.gz"
    monkeypatch.setattr(download_mod, "_open_source", lambda r, u, m: (_CutStream(b"\x1f\x8b"), url))
    dest = tmp_path / rel
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"previous copy")  # unverified, so fetch tries again
    with pytest.raises(DownloadError, match=rf"the transfer of {re.escape(rel)} from {re.escape(url)} "
                       r"was cut short \(IncompleteRead: .*re-run `dvc repro download`"):
        fetch(rel, url, {"sha256": ["0" * 64]}, tmp_path, mirror="")
    assert dest.read_bytes() == b"previous copy"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["val.en.gz"]  # no .part left


# --- 1. truncated or corrupt archives: reading ---------------------------------

def _good_gz() -> bytes:
    return gzip.compress("".join(f"{e}\n" for e, _, _ in sentences()).encode(), mtime=0)


@pytest.mark.parametrize("damage, cause", [
    (lambda b: b[:len(b) // 2], "EOFError: Compressed file ended before the end-of-stream marker"),
    (lambda b: b[:-4], "EOFError"),                      # gzip trailer cut off
    (lambda b: b"", "is empty \\(0 bytes\\)"),
    (lambda b: b"plain text, not gzip\n", "BadGzipFile: Not a gzipped file"),
    (lambda b: _flip(b, len(b) - 6), "BadGzipFile: CRC check failed"),  # a byte of the CRC
    (lambda b: _flip(b, 30), "(error: Error -3 while decompressing|BadGzipFile: CRC check failed)"),
])
def test_truncated_or_corrupt_gzip_is_a_corpus_error_naming_file_and_fix(tmp_path, damage, cause):
    path = tmp_path / "train.en.gz"
    path.write_bytes(damage(_good_gz()))
    with pytest.raises(CorpusError, match=rf"^{re.escape(str(path))} (is truncated or corrupt \()?"
                       rf"{cause}.*{REDOWNLOAD}"):
        read_lines(path)


@pytest.mark.parametrize("reader", [read_fra_eng, d2l.read_fra_txt], ids=["read_fra_eng", "d2l"])
@pytest.mark.parametrize("damage, cause", [
    (lambda b: b[:len(b) // 2], "BadZipFile: File is not a zip file"),
    (lambda b: _flip(b, 100), "BadZipFile: Bad CRC-32 for file 'fra-eng/fra.txt'"),
])
def test_truncated_or_corrupt_zip_is_a_corpus_error_naming_file_and_fix(mirror, tmp_path, reader,
                                                                         damage, cause):
    path = tmp_path / "fra-eng.zip"
    path.write_bytes(damage((mirror[0] / "fra-eng.zip").read_bytes()))
    with pytest.raises(CorpusError, match=rf"^{re.escape(str(path))} is truncated or corrupt "
                       rf"\({re.escape(cause)}.*{REDOWNLOAD}"):
        reader(path)


def test_zip_without_fra_txt_names_the_member(tmp_path):
    path = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("other.txt", "x")
    with pytest.raises(CorpusError, match=rf"fra-eng\.zip has no fra-eng/fra\.txt.*{REDOWNLOAD}"):
        d2l.read_fra_txt(path)


# --- 2. non-UTF-8 bytes ------------------------------------------------------------

def test_non_utf8_in_plain_file_names_file_and_line(tmp_path):
    p = tmp_path / "val.src.txt"
    p.write_bytes("un\ndeux\ntroisième\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"val\.src\.txt: line 3 is not valid UTF-8 \(invalid "
                       r"continuation byte\); convert the file to UTF-8"):
        read_lines(p)


def test_non_utf8_inside_gzip_names_file_and_line(tmp_path):
    p = tmp_path / "train.fr.gz"
    p.write_bytes(gzip.compress("Un homme.\nUne femme.\nL'été\n".encode("cp1252")))
    with pytest.raises(CorpusError, match=r"train\.fr\.gz: line 3 is not valid UTF-8"):
        read_lines(p)


@pytest.mark.parametrize("reader", [read_fra_eng, d2l.read_fra_txt], ids=["read_fra_eng", "d2l"])
def test_non_utf8_inside_zip_names_archive_member_and_line(tmp_path, reader):
    path = _zip_with(tmp_path / "fra-eng.zip", b"Go.\tVa !\nHi.\tSalut \xe0 toi.\n")
    with pytest.raises(CorpusError, match=r"fra-eng\.zip:fra-eng/fra\.txt: line 2 is not valid UTF-8"):
        reader(path)


# --- 3. empty and over-long lines: the filter rule ----------------------------------

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
    and one empty and one over-long pair in val and in test."""
    train = [(e, f) for e, f, _ in sentences()[:40]]
    train[3:3] = [("", "Un chien."), ("A dog.", " \u00a0 "), ("", "")]  # 3 empty pairs
    train += [(LONG_EN, "Un chien."), ("A man.", LONG_FR), ("\u202f", "La mer.")]  # 2 long, 1 empty
    held = [(e, f) for e, f, _ in sentences()[40:44]]
    raw = root / "data" / "raw" / "multi30k"
    for split, pairs in {"train": train, "val": held + [("", "Rien."), (LONG_EN, "Long.")],
                         "test_2016_flickr": [(LONG_EN, LONG_FR), ("", "")] + held}.items():
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
        "test": {"pairs": 6, "empty": 1, "too_long": 1, "kept": 6}}
    sp = load_sentencepiece(out / "spm.model")
    assert stats["vocab_size"] == {"requested": 5000, "actual": sp.get_piece_size()}
    assert sp.get_piece_size() < 5000  # the tiny corpus gives fewer: an upper bound, reported
    src, tgt = load_split(out / "train.npz")
    assert len(src) == len(tgt) == 40 and min(map(len, src)) > 0 and max(map(len, tgt)) < 50
    assert [sp.decode(s.tolist()) for s in src] == [e for e, _, _ in sentences()[:40]]
    val_src, _ = load_split(out / "val.npz")
    assert len(val_src) == 6 and len(val_src[4]) == 0 and len(val_src[5]) >= 50
    assert read_lines(out / "test.src.txt") == read_lines(tmp_path / "data/raw/multi30k/test_2016_flickr.en.gz")
    printed = capsys.readouterr().out
    assert "train: 40 pairs kept of 46 (dropped 4 with an empty side, 2 with ≥ 50 tokens on a side)" in printed
    assert "val: 6 pairs, all kept (1 with an empty side, 1 with ≥ 50 tokens on a side)" in printed
    assert f"sentencepiece stopped at {sp.get_piece_size()}" in printed
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no staging folder left


def test_tokenize_of_a_truncated_gzip_names_it_and_writes_nothing(tmp_path):
    _raw_corpus(tmp_path)
    bad = tmp_path / "data/raw/multi30k/train.fr.gz"
    bad.write_bytes(bad.read_bytes()[:-10])
    cfg = _cfg(tmp_path, "data=multi30k")
    with pytest.raises(SystemExit, match=rf"^tokenize failed: {re.escape(str(bad))} is truncated or "
                       rf"corrupt \(EOFError.*{REDOWNLOAD}"):
        _tokenize_app().main(cfg)
    assert not (tmp_path / "data" / "tokenized").exists()


def test_tokenize_d2l_of_a_corrupt_zip_names_it_and_writes_nothing(mirror, tmp_path):
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / "fra-eng.zip").write_bytes(_flip((mirror[0] / "fra-eng.zip").read_bytes(), 100))
    cfg = _cfg(tmp_path, "data=fra_eng_d2l")
    with pytest.raises(SystemExit, match=rf"^tokenize failed: {re.escape(str(raw / 'fra-eng.zip'))} is "
                       rf"truncated or corrupt \(BadZipFile: Bad CRC-32.*{REDOWNLOAD}"):
        _tokenize_app().main(cfg)
    assert not (tmp_path / "data" / "tokenized").exists()


# --- 4. an empty training split -----------------------------------------------------

def test_empty_training_split_is_an_error_and_keeps_the_previous_output(tmp_path):
    _raw_corpus(tmp_path)
    raw = tmp_path / "data/raw/multi30k"
    _gz(raw / "train.en.gz", ["", "A dog.", ""])
    _gz(raw / "train.fr.gz", ["Un chien.", " ", ""])
    cfg = _cfg(tmp_path, "data=multi30k")
    out = Path(cfg.paths.tokenized)
    out.mkdir(parents=True)
    (out / "spm.model").write_bytes(b"previous run")
    with pytest.raises(SystemExit, match=r"^tokenize failed: the training split is empty: 3 pairs read, "
                       r"none with text on both sides; nothing was written\. Check .*multi30k/"
                       r"train\.\{en,fr\}\.gz \(delete them and re-run `dvc repro download`\) and "
                       r"data\.splits\.train"):
        _tokenize_app().main(cfg)
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no staging folder
    assert [p.name for p in out.iterdir()] == ["spm.model"]
    assert (out / "spm.model").read_bytes() == b"previous run"


def test_held_out_split_taking_every_pair_names_data_heldout(mirror, tmp_path):
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / "fra-eng.zip").write_bytes((mirror[0] / "fra-eng.zip").read_bytes())  # 48 pairs
    cfg = _cfg(tmp_path, "data=fra_eng", "data.heldout.num_val=24", "data.heldout.num_test=24")
    with pytest.raises(SystemExit, match=r"the training split is empty: 0 pairs read.*data\.heldout "
                       r"\(num_val=24 \+ num_test=24 pairs are held out"):
        _tokenize_app().main(cfg)
    assert not (tmp_path / "data" / "tokenized").exists()


# --- 5. a vocabulary size the corpus cannot give --------------------------------------

TEXT = [s for e, f, _ in sentences()[:40] for s in (e, f)]


def test_too_large_vocabulary_names_the_key_and_the_largest_size_that_works(tmp_path):
    with pytest.raises(VocabSizeError, match=r"^data\.vocab_size=5000 is too large for this training "
                       r"corpus: sentencepiece can make at most \d+ pieces from it; set "
                       r"data\.vocab_size=\d+ \(or less\)") as e:
        train_sentencepiece(TEXT, tmp_path / "spm", 5000, hard_vocab_limit=True)
    assert list(tmp_path.iterdir()) == []  # no model, no temporary prefix files
    most = int(re.search(r"set data\.vocab_size=(\d+)", str(e.value)).group(1))
    assert 100 < most < 5000
    sp = train_sentencepiece(TEXT, tmp_path / "spm", most, hard_vocab_limit=True)
    assert sp.get_piece_size() == most  # the size the message names does work


def test_too_small_vocabulary_names_the_key_and_the_smallest_size_that_works(tmp_path):
    with pytest.raises(VocabSizeError, match=r"^data\.vocab_size=10 is too small for this training "
                       r"corpus: its characters and the 4 special pieces alone need \d+; set "
                       r"data\.vocab_size=\d+ \(or more\)") as e:
        train_sentencepiece(TEXT, tmp_path / "spm", 10)
    assert list(tmp_path.iterdir()) == []
    least = int(re.search(r"set data\.vocab_size=(\d+)", str(e.value)).group(1))
    n_chars = len(set("".join(TEXT).replace(" ", "")))  # plus "▁" and the 4 specials
    assert least == n_chars + 1 + 4
    assert train_sentencepiece(TEXT, tmp_path / "spm", least).get_piece_size() == least


def test_tokenize_with_too_small_vocabulary_exits_and_writes_nothing(tmp_path):
    _raw_corpus(tmp_path)
    cfg = _cfg(tmp_path, "data=multi30k", "data.vocab_size=10")
    with pytest.raises(SystemExit, match=r"^tokenize failed: data\.vocab_size=10 is too small.*set "
                       r"data\.vocab_size=\d+ \(or more\); nothing was written$"):
        _tokenize_app().main(cfg)
    assert list((tmp_path / "data" / "tokenized").iterdir()) == []  # staging folder removed


# --- 6. a checkpoint from another model type -------------------------------------------

@pytest.fixture(scope="module")
def nw_checkpoint(tmp_path_factory) -> tuple[Path, torch.Tensor]:
    """A real Lightning checkpoint: NW trained one step on D2L's synthetic data."""
    import pytorch_lightning as pl

    from attnlab.lit.regression import RegressionModule, full_batch_loader
    from attnlab.models.nadaraya_watson import synthetic_regression

    data = synthetic_regression(50, 0.5, 5.0, seed=0)
    module = RegressionModule(optimizer={"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5}, init_w=1.0)
    module.data = data
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, full_batch_loader(data["x_train"], data["y_train"]))
    path = tmp_path_factory.mktemp("ckpt") / "best.ckpt"
    trainer.save_checkpoint(path)
    return path, module.net.w.detach().clone()


def test_real_checkpoint_of_another_model_is_a_checkpoint_error(nw_checkpoint):
    path, w = nw_checkpoint
    net = load_net(path, expected_kind="nw")  # torch.load(weights_only=True) reads it
    assert net.kind == "nw" and torch.equal(net.w, w) and not torch.equal(w, torch.ones(1))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path))} holds a nw model, not "
                       r"transformer; pass checkpoints/transformer/ \(train it with `python "
                       r"src/train\.py model=transformer`\) or run with model=nw$"):
        load_net(path, expected_kind="transformer")


def test_checkpoint_with_pickled_objects_is_refused_not_unpickled(tmp_path):
    from omegaconf import OmegaConf

    path = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": OmegaConf.create({"init_w": 1.0}),
                "state_dict": {"net.w": torch.ones(1)}}, path)
    assert torch.load(path, weights_only=False)["hyper_parameters"]["init_w"] == 1.0  # a valid file
    with pytest.raises(CheckpointError, match=r"holds Python objects that torch\.load\(weights_only=True\) "
                       r"refuses.*retrain with `python src/train\.py`"):
        load_net(path)


def test_truncated_checkpoint_is_a_checkpoint_error(nw_checkpoint, tmp_path):
    data = nw_checkpoint[0].read_bytes()
    for name, content, cause in [("cut.ckpt", data[:len(data) // 2], "RuntimeError: PytorchStreamReader"),
                                 ("empty.ckpt", b"", "EOFError: empty")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError, match=rf"{name} is truncated or not a torch checkpoint "
                           rf"\({cause}.*retrain with `python src/train\.py` or copy the file again"):
            load_net(tmp_path / name)


# --- 7. an unknown Hydra key ---------------------------------------------------------------

def test_misspelled_trainer_key_is_a_composition_error_naming_it(tmp_path):
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'trainer\.max_epoch'") as e:
        _cfg(tmp_path, "trainer.max_epoch=1")
    assert "Key 'max_epoch' is not in struct" in str(e.value.__cause__)


def test_train_script_with_misspelled_key_exits_nonzero_naming_it(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "src" / "train.py"), "trainer.max_epoch=1",
                           f"paths.root={tmp_path}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "Could not override 'trainer.max_epoch'" in proc.stderr
    assert "Key 'max_epoch' is not in struct" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # failed at composition: nothing ran, nothing written
