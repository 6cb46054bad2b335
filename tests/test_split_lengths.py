"""Every split fits the model before anything runs (attnlab.inference.lengths).

A Transformer has ``model.net.max_len`` positions (512): a side of n tokens takes n + 1 (the
source's <eos>, the teacher-forced target's <bos>) and a translation up to
min(1.5 × (n + 1) + 10, 256). Training pairs it cannot take are dropped with a count; a
validation or test pair it cannot take is refused, naming the split, the line, its length,
the limit and the fix, before an epoch runs (train) or a sentence is decoded (evaluate).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from attnlab.data.corpora import read_lines
from attnlab.data.tokenizer import load_sentencepiece, write_split
from attnlab.inference import lengths
from attnlab.inference.evaluation import evaluate_translation
from attnlab.inference.lengths import (
    TEST_SIDES,
    VAL_SIDES,
    PairTooLongError,
    check_splits_fit,
    find_overlong,
    positions_needed,
    training_bound,
)
from attnlab.lit.translation import TranslationModule
from attnlab.models import Bahdanau, Transformer, max_positions
from helpers.corpus_fixture import sentences
from helpers.tiny_train import ROOT, mlflow_client, runs, train

PAIRS = [(e, f) for e, f, _ in sentences()]  # 48 short English–French pairs


def _split(prefix: Path, src_lengths, tgt_lengths) -> Path:
    """A real encoded split (the tokenize stage's four .npy files) with these token counts."""
    write_split(prefix, [[5] * n for n in src_lengths], [[6] * n for n in tgt_lengths])
    return prefix


# --- the rule, on hand-made lengths -----------------------------------------------------------


def test_positions_a_side_needs():
    # targets: n + 1 (<bos>); sources: n + 1 (<eos>), or more when decoding may run longer:
    # floor(1.5 × (n + 1) + 10), at most 256
    assert positions_needed(np.array([0, 9, 300]), "tgt").tolist() == [1, 10, 301]
    src = positions_needed(np.array([0, 12, 20, 200, 255, 300]), "src")
    assert src.tolist() == [11, 29, 41, 256, 256, 301]


def test_max_positions_is_the_nets_positional_table():
    assert max_positions(Transformer(vocab_size=20, d_model=8, num_heads=2, ffn_hidden=16)) == 512
    assert max_positions(Transformer(vocab_size=20, d_model=8, num_heads=2, ffn_hidden=16, max_len=40)) == 40
    assert max_positions(Bahdanau(vocab_size=20, embed_size=8, num_hiddens=8)) is None


@pytest.fixture
def five_pairs(tmp_path):
    """Five pairs against a 300-position model: lines 2 (source) and 4 (target) do not fit;
    3 and 5 need exactly 300."""
    return _split(tmp_path / "val", [10, 300, 20, 5, 299], [12, 2, 299, 310, 8])


def test_val_counts_both_sides_and_names_the_first_and_the_longest(five_pairs):
    found = find_overlong(five_pairs, 300, VAL_SIDES)
    assert found == lengths.Overlong(
        "val",
        5,
        2,
        first=lengths.Line("val", "src", 2, 300, 301),
        longest=lengths.Line("val", "tgt", 4, 310, 311),
    )
    assert found.describe(five_pairs.parent) == (
        f"val: 2 of 5 pairs; the first, line 2 of {five_pairs.parent}/val.src.txt has 300 source tokens "
        f"(301 positions with its <eos>); the longest, line 4 of {five_pairs.parent}/val.tgt.txt has "
        "310 target tokens (311 positions with its <bos>)"
    )


def test_a_test_split_is_read_on_its_source_side_only(five_pairs):
    found = find_overlong(five_pairs, 300, TEST_SIDES)
    line_2 = lengths.Line("val", "src", 2, 300, 301)
    assert (found.count, found.first, found.longest) == (1, line_2, line_2)
    assert find_overlong(five_pairs, 311, VAL_SIDES) is None  # all fit one position more


def test_a_short_table_is_checked_for_the_length_decoding_may_reach(tmp_path):
    prefix = _split(tmp_path / "test", [12, 20], [29, 29])
    found = find_overlong(prefix, 30, VAL_SIDES)
    assert (found.count, found.first) == (1, lengths.Line("test", "src", 2, 20, 41))
    assert found.first.describe(tmp_path) == (
        f"line 2 of {tmp_path}/test.src.txt has 20 source tokens (its translation may take 41 "
        "positions (decoding's limit: min(1.5 × (tokens + 1) + 10, 256)))"
    )


def test_slices_give_the_same_answer_and_the_earliest_of_equals(tmp_path, monkeypatch):
    # two pairs a slice: the first over-long pair is in the second slice, the longest (twice) in
    # the third and fourth
    prefix = _split(tmp_path / "val", [1, 2, 3, 400, 5, 600, 7, 8], [1, 2, 3, 4, 5, 6, 599, 3])
    whole = find_overlong(prefix, 300, VAL_SIDES)
    monkeypatch.setattr(lengths, "_CHUNK", 2)
    assert find_overlong(prefix, 300, VAL_SIDES) == whole
    assert (whole.count, whole.first.line, whole.longest) == (3, 4, lengths.Line("val", "src", 6, 600, 601))


def test_training_reads_pairs_below_the_smaller_of_max_len_and_the_table():
    assert training_bound(100, 512) == 100
    assert training_bound(1000, 512) == 512
    assert training_bound(1000, None) == 1000  # a GRU takes any length


def test_no_table_no_check_and_a_missing_test_split_is_left_to_evaluate(tmp_path):
    _split(tmp_path / "val", [10, 900], [10, 10])
    check_splits_fit(tmp_path, {"val": VAL_SIDES}, None, "bahdanau", "train")  # no error
    check_splits_fit(tmp_path, {"test": TEST_SIDES}, 512, "transformer", "train")  # absent: skipped
    with pytest.raises(FileNotFoundError, match="tokenize"):  # val is always there
        check_splits_fit(tmp_path / "elsewhere", {"val": VAL_SIDES}, 512, "transformer", "train")


# --- a real corpus with an over-long val pair and an over-long test pair ----------------------

LONG = " ".join(e for e, _ in PAIRS * 3)  # 144 sentences run together: one line of 900 tokens
LONG_FR = " ".join(f for _, f in PAIRS * 3)


def _corpus(folder: Path, splits: dict) -> Path:
    for name, pairs in splits.items():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.en").write_text("".join(s + "\n" for s, _ in pairs))
        (folder / f"{name}.fr").write_text("".join(t + "\n" for _, t in pairs))
    return folder


def _cfg(root: Path, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            config_name="config",
            overrides=[
                f"paths.root={root}",
                "data=parallel",
                f"data.path={root}/corpus",
                "data.vocab_size=150",
                *overrides,
            ],
        )


def _tokenize(cfg) -> Path:
    spec = importlib.util.spec_from_file_location("tokenize_data_app", ROOT / "src" / "tokenize_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(cfg)
    return Path(cfg.paths.tokenized)


@pytest.fixture(scope="module")
def overlong_project(tmp_path_factory):
    """Val line 3 and test line 2: 144 sentences on one source line. Test line 1's reference
    is as long, which does not matter: a reference is never fed to the model."""
    root = tmp_path_factory.mktemp("overlong")
    val, test = list(PAIRS[40:44]), list(PAIRS[44:])
    val[2] = (LONG, val[2][1])
    test[1] = (LONG, test[1][1])
    test[0] = (test[0][0], LONG_FR)
    _corpus(root / "corpus", {"train": PAIRS[:40], "val": val, "test": test})
    tok = _tokenize(_cfg(root))
    return root, tok


def _tokens(tok: Path, split: str, line: int) -> int:
    """The reference: sentencepiece's own count for that line of the tokenized text."""
    return len(load_sentencepiece(tok / "spm.model").encode(read_lines(tok / f"{split}.src.txt")[line - 1]))


def test_the_long_lines_pass_tokenize_all_kept(overlong_project):
    _, tok = overlong_project
    assert _tokens(tok, "val", 3) == _tokens(tok, "test", 2) > 511  # what the Transformer cannot take
    assert len(read_lines(tok / "val.src.txt")) == len(read_lines(tok / "test.src.txt")) == 4


def test_training_is_refused_before_an_epoch_naming_split_line_length_and_fix(overlong_project, tmp_path):
    src, tok = overlong_project
    n = _tokens(tok, "val", 3)
    result = train(src, "data=parallel", f"data.path={src}/corpus", f"paths.checkpoints={tmp_path}/ckpt")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = (
        "train: these pairs do not fit the transformer model, which has 512 positions (model.net.max_len) "
        "and so takes at most 511 tokens a side:\n"
        f"  val: 1 of 4 pairs: line 3 of {tok}/val.src.txt has {n} source tokens ({n + 1} positions "
        "with its <eos>)\n"
        f"  test: 1 of 4 pairs: line 2 of {tok}/test.src.txt has {n} source tokens ({n + 1} positions "
        "with its <eos>)\n"
        "Validation and test pairs are scored, so none is dropped or cut (either would change BLEU "
        "without a word). Split such a line into its sentences, or remove the pair, in the corpus and "
        "re-run `python src/tokenize_data.py` (or `dvc repro tokenize`); or give the model a longer "
        f"positional table with ++model.net.max_len={n + 1} (a new model)\n"
    )
    assert result.stderr.endswith(message), result.stderr[-3000:]
    # no epoch ran: no checkpoint, no MLflow run, no metric
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())
    assert runs(mlflow_client(src)) == []
    assert "val_loss" not in result.stdout + result.stderr


def test_evaluate_refuses_a_test_source_the_model_cannot_take_before_decoding(overlong_project):
    _, tok = overlong_project
    n = _tokens(tok, "test", 2)
    cfg = _cfg(overlong_project[0], "device=cpu")
    net = Transformer(vocab_size=150, d_model=8, num_heads=2, ffn_hidden=16)
    with pytest.raises(PairTooLongError) as e:
        evaluate_translation(cfg, net)
    assert str(e.value).splitlines()[1:2] == [
        f"  test: 1 of 4 pairs: line 2 of {tok}/test.src.txt has {n} source tokens "
        f"({n + 1} positions with its <eos>)"
    ]
    assert str(e.value).endswith(
        f"or score a model trained with a longer positional table (++model.net.max_len={n + 1} when training)"
    )


def test_a_table_long_enough_takes_them(overlong_project):
    _, tok = overlong_project
    cfg = _cfg(overlong_project[0], f"++model.net.max_len={_tokens(tok, 'val', 3) + 1}")
    module, (dm,) = TranslationModule.from_config(cfg)
    assert max_positions(module.net) == _tokens(tok, "val", 3) + 1
    assert len(dm.dataset("val")) == 4 and len(dm.dataset("train")) == 40


def test_training_pairs_the_model_cannot_take_are_dropped_with_a_count(tmp_path, caplog):
    # data.max_len=100 keeps a training pair of six sentences (about 40 tokens a side) at
    # tokenize; a 30-position table cannot take it. The single sentences (6 or 7 tokens) fit it,
    # their translations too (at most 1.5 × 8 + 10 = 22 positions).
    six = (" ".join(e for e, _ in PAIRS[:6]), " ".join(f for _, f in PAIRS[:6]))
    _corpus(tmp_path / "corpus", {"train": [*PAIRS[:40], six], "val": PAIRS[40:44], "test": PAIRS[44:]})
    tok = _tokenize(_cfg(tmp_path))
    sp = load_sentencepiece(tok / "spm.model")
    assert 30 <= max(len(ids) for ids in sp.encode(list(six))) < 100
    assert max(len(ids) for pair in PAIRS for ids in sp.encode(list(pair))) <= 8
    with caplog.at_level(logging.WARNING, logger="attnlab.lit.translation"):
        module, (dm,) = TranslationModule.from_config(_cfg(tmp_path, "++model.net.max_len=30"))
    assert dm.max_len == 30 and len(dm.dataset("train")) == 40
    assert caplog.messages == [
        "train: 1 of 41 tokenized pairs left out of training, with 30 or more tokens on a side (the "
        "transformer model has 30 positions (model.net.max_len), fewer than data.max_len=100; set "
        "data.max_len=30 to drop them at tokenize, counted in stats.json)"
    ]
    batch = next(iter(dm.train_dataloader()))  # the pairs left in fit the table
    with torch.no_grad():
        module.net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
