"""What evaluate refuses before it decodes anything: a corpus without a test split, further test
splits (``data.more_test_splits``) that are not distinct test splits of the corpus, a
tokenized folder that lacks a test split's text, and bf16 decoding on a CPU without bf16 units.

Scoring itself (each test set's BLEU, lowercased BLEU and chrF equal sacreBLEU's on its
translations) is checked on the pipeline's own run in tests/test_pipeline.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from attnlab.inference.evaluation import NoTestSplitError, evaluate_translation

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _cfg(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=["model=transformer", *overrides])


def test_multi30k_scores_test_2017_flickr_beside_test_2016_flickr():
    data = _cfg().data
    assert data.test_set == "test_2016_flickr"
    assert [data.splits[k] for k in data.more_test_splits] == ["test_2017_flickr"]


@pytest.mark.parametrize("split", ["test_2018", "val", "train", "test"])
def test_a_further_test_split_must_be_another_test_split_of_the_corpus(split):
    cfg = _cfg(f"data.more_test_splits=[{split}]")
    with pytest.raises(
        NoTestSplitError,
        match=rf"data.more_test_splits names '{split}', which is "
        r"not a further test split of data.splits \(train, val, test, test_2017\); "
        r"list further test splits of data.splits, or set data.more_test_splits=\[\]",
    ):
        evaluate_translation(cfg, net=None)  # refused before any model or file is touched


@pytest.mark.parametrize(
    "value, problem",
    [
        ("test_2017", r"must be a list of keys of data.splits \(e.g. \[test_2017\]\), not 'test_2017'"),
        ("[test_2017,test_2017]", r"names test_2017_flickr twice \('test_2017' and 'test_2017'\)"),
        ("[test_2017,again]", r"names test_2017_flickr twice \('test_2017' and 'again'\)"),
    ],
)
def test_further_test_splits_are_a_list_of_distinct_test_sets(value, problem):
    extra = ["+data.splits.again=test_2017_flickr"] if "again" in problem else []
    cfg = _cfg(f"data.more_test_splits={value}", *extra)
    with pytest.raises(
        NoTestSplitError,
        match=problem + r"; list further test splits of "
        r"data.splits, or set data.more_test_splits=\[\]",
    ):
        evaluate_translation(cfg, net=None)


def test_a_tokenized_folder_without_a_test_splits_text_names_the_stage_that_writes_it(tmp_path):
    """A folder tokenized before `test_2017` was a split: refused before anything is decoded."""
    cfg = _cfg(f"paths.root={tmp_path}")
    tok = Path(cfg.paths.tokenized)
    tok.mkdir(parents=True)
    for name in ("test.src.txt", "test.tgt.txt", "test_2017.src.txt"):
        (tok / name).write_text("A dog.\n", encoding="utf-8")
    with pytest.raises(
        NoTestSplitError,
        match=rf"{tok} has no test_2017.tgt.txt: it was tokenized "
        r"before data.splits had `test_2017`; re-run the tokenize stage \(`dvc repro "
        r"tokenize`, or `python src/tokenize_data.py data=multi30k`\)",
    ):
        evaluate_translation(cfg, net=None)


def test_fra_eng_has_no_further_test_split():
    cfg = _cfg("data=fra_eng", "+data.more_test_splits=[test_2017]")
    with pytest.raises(
        NoTestSplitError,
        match=r"names 'test_2017', which is not a further test "
        r"split of data.splits \(data=fra_eng has no data.splits\)",
    ):
        evaluate_translation(cfg, net=None)


def test_a_corpus_without_a_test_split_names_the_command_that_scores_it():
    cfg = _cfg("data=fra_eng_d2l", "model=bahdanau")
    with pytest.raises(
        NoTestSplitError,
        match=r"data=fra_eng_d2l has no test split; D2L scores its "
        r"models with `python src/d2l_table.py data=fra_eng_d2l model=bahdanau`",
    ):
        evaluate_translation(cfg, net=None)


@pytest.mark.parametrize("main", ["test", "val", "train"])
def test_a_further_test_split_may_not_be_the_file_of_the_main_splits(main):
    """`test_2017: test_2016_flickr` would report the main test set a second time as a 'further' one."""
    cfg = _cfg(f"data.splits.test_2017=${{.{main}}}")
    name = cfg.data.splits[main]
    with pytest.raises(
        NoTestSplitError,
        match=rf"data.more_test_splits names 'test_2017', whose file "
        rf"{name} is data.splits.{main}'s: it would be scored as a further test set; "
        r"list further test splits",
    ):
        evaluate_translation(cfg, net=None)


def test_bf16_decoding_is_refused_before_decoding_where_the_cpu_has_no_bf16_units(tmp_path, monkeypatch):
    """model.decoding.bf16=true on a CPU without avx512_bf16 or amx_bf16 (there bf16 matmuls run
    at a few percent of fp32): an error naming the fix, before the tokenizer or the model is read."""
    from attnlab import config
    from attnlab.inference.decoding import Bf16UnitsError

    monkeypatch.setattr(config, "cpu_flags", lambda: {"avx2", "avx512f"})
    cfg = _cfg(f"paths.root={tmp_path}", "device=cpu", "model.decoding.bf16=true")
    tok = Path(cfg.paths.tokenized)
    tok.mkdir(parents=True)
    for split in ("test", "test_2017"):
        for side in ("src", "tgt"):
            (tok / f"{split}.{side}.txt").write_text("A dog.\n", encoding="utf-8")
    with pytest.raises(
        Bf16UnitsError,
        match=r"bf16 decoding \(model.decoding.bf16=true\) needs bf16 "
        r"matrix units, and this cpu has none .*decode in float32 "
        r"\(model.decoding.bf16=false\)",
    ):
        evaluate_translation(cfg, net=None)


# Chinese without spaces: one 13a token per sentence, no match; sacreBLEU's zh tokenizer splits
# the characters (tests/test_metrics.py scores the same kind of pairs).
ZH_SOURCES = ["We walk in the park today.", "The cat sleeps on the sofa."]
ZH_HYPS = ["我们今天去公园散步。", "这只猫在沙发上睡觉。"]
ZH_REFS = ["今天我们去公园散步。", "那只猫在沙发上睡觉。"]


def _evaluate_zh(tmp_path, monkeypatch, *overrides):
    """evaluate_translation on an en→zh test split whose 'translations' are ZH_HYPS (decoding
    and the tokenizer replaced: only the scoring runs)."""
    import attnlab.inference.evaluation as evaluation

    cfg = _cfg(
        f"paths.root={tmp_path}", "device=cpu", "data.tgt_lang=zh", "data.more_test_splits=[]", *overrides
    )
    tok = Path(cfg.paths.tokenized)
    tok.mkdir(parents=True, exist_ok=True)
    (tok / "test.src.txt").write_text("".join(s + "\n" for s in ZH_SOURCES), encoding="utf-8")
    (tok / "test.tgt.txt").write_text("".join(s + "\n" for s in ZH_REFS), encoding="utf-8")
    monkeypatch.setattr(evaluation, "load_sentencepiece", lambda path: None)
    translations = dict(zip(ZH_SOURCES, ZH_HYPS))
    monkeypatch.setattr(evaluation, "translate_text", lambda *a, **k: [translations[s] for s in a[3]])

    class Net:
        init_state = step = None

        def to(self, device):
            return self

    return evaluate_translation(cfg, Net())


def test_evaluate_scores_a_chinese_target_with_sacrebleus_zh_tokenizer(tmp_path, monkeypatch):
    import sacrebleu

    result = _evaluate_zh(tmp_path, monkeypatch)
    zh = sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="zh")
    assert result.scores["bleu"] == result.logged["test_bleu"] == zh.score > 0
    assert sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS]).score == 0.0  # what 13a would have said
    assert "|tok:zh|" in result.scores["signature"]["bleu"]
    assert result.tags["test_bleu_signature"] == result.scores["signature"]["bleu"]
    assert "|tok:zh|" in result.tags["test_bleu_lc_signature"]
    assert result.scores["tgt_lang"] == "zh"


def test_evaluate_takes_the_tokenizer_override_of_the_data_config(tmp_path, monkeypatch):
    import sacrebleu

    result = _evaluate_zh(tmp_path, monkeypatch, "data.bleu_tokenize=char")
    assert result.scores["bleu"] == sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="char").score
    assert "|tok:char|" in result.tags["test_bleu_signature"]


def test_an_unknown_bleu_tokenizer_is_refused_before_the_tokenized_folder_is_read(tmp_path):
    cfg = _cfg(f"paths.root={tmp_path}", "data.bleu_tokenize=jieba")
    with pytest.raises(ValueError, match=r"data.bleu_tokenize='jieba' is not one of sacreBLEU's tokenizers"):
        evaluate_translation(cfg, net=None)
