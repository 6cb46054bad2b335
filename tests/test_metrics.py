"""BLEU: D2L's sentence BLEU by hand, sacreBLEU corpus scores against sacrebleu itself."""

import gzip
import math
from pathlib import Path

import pytest
import sacrebleu
import torch

from attnlab import metrics
from attnlab.metrics import CorpusScores, bleu_tokenizer, corpus_scores, d2l_bleu, sacrebleu_signatures


def test_exact_two_token_match_scores_one_with_k4():
    assert d2l_bleu("il est", "il est", 4) == 1.0


def test_empty_prediction_scores_zero():
    assert d2l_bleu("", "il est calme", 2) == 0.0
    assert d2l_bleu("   ", "il est calme", 2) == 0.0


def test_brevity_penalty_d2l_example():
    assert d2l_bleu("il", "il est calme", 2) == pytest.approx(math.exp(1 - 3))


def test_d2l_table_value():
    # D2L 10.7.8 (zh 9.7.6): pred "il est calme ." vs label "il est calme ." → 1; one wrong word:
    # p1 = 3/4 (il, est, .), p2 = 1/3 ("il est") → (3/4)^(1/2) (1/3)^(1/4)
    assert d2l_bleu("il est mouillé .", "il est calme .", 2) == pytest.approx(
        (3 / 4) ** 0.5 * (1 / 3) ** 0.25
    )


def test_narrow_no_break_space_splits_tokens():
    assert d2l_bleu("va\u202f!", "va !", 2) == 1.0
    assert d2l_bleu("va\u00a0!", "va !", 2) == 1.0


def test_corpus_scores_equal_sacrebleu_and_pair_in_order():
    hyps = ["A dog runs on the grass .", "Two men play chess ."]
    refs = ["A dog runs on the green grass .", "Two men are playing chess ."]
    s = corpus_scores(hyps, refs)
    assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert corpus_scores(refs, refs)["bleu"] == pytest.approx(100.0)
    assert corpus_scores(refs, refs[::-1])["bleu"] < 10  # swapped pairs score low


def test_lowercased_bleu_ignores_case():
    s = corpus_scores(["a man rides a bike ."], ["A man rides a bike ."])
    assert s["bleu_lc"] == pytest.approx(100.0)
    assert s["bleu"] < 100.0


def test_corpus_scores_length_mismatch():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"])


# --- CorpusScores: sacreBLEU's statistics in a torchmetrics Metric ---------------------------
# Every expected number below is sacreBLEU's own, computed here on the same pairs; the metric
# must reproduce it to 1e-9 however the pairs are batched or split across (simulated) ranks.

PROJECT_ROOT = Path(__file__).resolve().parents[1]
HYPOTHESES = PROJECT_ROOT / "metrics/transformer.hyp.txt"  # evaluate's committed system output

TRICKY = {  # name: (hypotheses, references), one reference per hypothesis
    "empty hypothesis among others": (
        ["", "A dog runs on the grass .", "   "],
        ["A man is sleeping .", "A dog runs on the green grass .", "Two kids play ."],
    ),
    "all hypotheses empty": (["", ""], ["Un homme dort.", "Deux enfants jouent."]),
    "no 4-gram match ('exp' smoothing)": (
        ["A Man Rides A Bike .", "the cat sat", "Hi ."],
        ["a man rides a bike .", "the cat sat on the mat", "Hi there ."],
    ),
    "single short sentence": (["Hi ."], ["Hi there ."]),
    "numbers": (
        ["Il coûte 1,000.50 $ en 2016.", "3.5 km à 10h30", "Le 1er mai, 42 %"],
        ["Il coûte 1,000.50$ en 2016.", "3,5 km à 10 h 30", "Le 1er mai, 42%"],
    ),
    "punctuation": (
        ["Wait... what?!", "(yes) - no", "Un homme—en bleu—court ; vite !"],
        ["Wait ... what ?!", "( yes ) -- no", "Un homme - en bleu - court; vite!"],
    ),
    "apostrophes": (
        ["l'homme n'est pas là", "it's John's dog", "aujourd’hui c’est l'été"],
        ["L' homme n' est pas là", "it 's John's dog", "aujourd'hui c'est l’été"],
    ),
    "quotes": (
        ['Il dit « bonjour » et "salut"', "“Stop”, she said.", "'quoted'"],
        ['Il dit "bonjour" et « salut »', '"Stop", she said.', "' quoted '"],
    ),
    "narrow no-break and no-break spaces": (
        ["Va\u202f! Quoi\u00a0?", "Ça va\u202f?"],
        ["Va ! Quoi ?", "Ça va ?"],
    ),
    "odd unicode": (
        ["Une femme naïve mange un crème brûlée 🍮.", "Cafe\u0301 ouvert"],
        ["Une femme naïve mange une crème brûlée.", "Café ouvert"],
    ),
    "hypothesis longer than reference": (
        ["Two men are playing a game of chess in the park today ."],
        ["Two men are playing chess ."],
    ),
}


def _sacrebleu(hyps, refs):
    return {
        "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
        "bleu_lc": sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score,
        "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
    }


def _chunks(n):
    """Ways to split n pairs into update calls: one batch, one per call, and uneven."""
    ways = {"one batch": [n], "one pair per call": [1] * n}
    if n > 2:
        ways["uneven"] = [2, n - 2]
    return ways


def _close(got, expected):
    assert set(got) == {"bleu", "bleu_lc", "chrf"}
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=0, abs=1e-9), key


@pytest.mark.parametrize("name", TRICKY)
def test_metric_equals_sacrebleu_on_tricky_cases_however_batched(name):
    hyps, refs = TRICKY[name]
    expected = _sacrebleu(hyps, refs)
    _close(corpus_scores(hyps, refs), expected)
    for sizes in _chunks(len(hyps)).values():
        metric, start = CorpusScores(), 0
        for size in sizes:
            metric.update(hyps[start : start + size], refs[start : start + size])
            start += size
        _close(metric.compute(), expected)


def test_tricky_cases_cover_what_they_claim():
    # 'exp' smoothing: no 4-gram matches, yet sacreBLEU's cased BLEU is > 0 (not torchmetrics' 0).
    hyps, refs = TRICKY["no 4-gram match ('exp' smoothing)"]
    assert sacrebleu.corpus_bleu(hyps, [refs]).counts[3] == 0
    assert corpus_scores(hyps, refs)["bleu"] > 0
    assert corpus_scores(*TRICKY["all hypotheses empty"]) == {"bleu": 0.0, "bleu_lc": 0.0, "chrf": 0.0}


def test_all_tricky_cases_as_one_corpus_in_uneven_batches():
    hyps = [h for hs, _ in TRICKY.values() for h in hs]
    refs = [r for _, rs in TRICKY.values() for r in rs]
    metric = CorpusScores()
    for start, stop in ((0, 5), (5, 6), (6, 19), (19, len(hyps))):
        metric.update(hyps[start:stop], refs[start:stop])
    _close(metric.compute(), _sacrebleu(hyps, refs))


def test_states_summed_across_two_ranks_give_one_corpus_score():
    """What DDP does: each rank adds its shard; torchmetrics sums the states (dist_reduce_fx='sum')."""
    hyps = [h for hs, _ in TRICKY.values() for h in hs]
    refs = [r for _, rs in TRICKY.values() for r in rs]
    ranks = [CorpusScores(), CorpusScores()]
    for r, metric in enumerate(ranks):
        metric.update(hyps[r::2], refs[r::2])
    expected = _sacrebleu(hyps, refs)
    halves = [corpus_scores(hyps[r::2], refs[r::2])["bleu"] for r in (0, 1)]
    # The test can tell: neither half, nor their mean, is the corpus score.
    assert expected["bleu"] not in halves
    assert expected["bleu"] != pytest.approx(sum(halves) / 2, abs=1e-3)
    whole = CorpusScores()
    whole.update(hyps, refs)
    for key in ("bleu_stats", "bleu_lc_stats", "chrf_stats"):
        assert ranks[0]._reductions[key] is not None  # reduced across ranks, not kept per rank
        assert torch.equal(getattr(ranks[0], key) + getattr(ranks[1], key), getattr(whole, key))
    ranks[0].merge_state(ranks[1])  # torchmetrics' own reduction of the two ranks' states
    _close(ranks[0].compute(), expected)


def test_states_are_integer_counts_and_reset_clears_them():
    metric = CorpusScores()
    metric.update(["Un homme dort ."], ["Un homme dort."])
    assert all(getattr(metric, k).dtype == torch.int64 for k in ("bleu_stats", "bleu_lc_stats", "chrf_stats"))
    assert metric.bleu_stats.shape == (10,) and metric.chrf_stats.shape == (18,)
    # hyp_len, ref_len (13a splits the final '.'), 1..4-gram matches, 1..4-gram totals
    assert metric.bleu_stats.tolist() == [4, 4, 4, 3, 2, 1, 4, 3, 2, 1]
    metric.reset()
    assert not metric.bleu_stats.any() and not metric.chrf_stats.any()


def test_metric_update_rejects_mismatched_lengths_and_non_strings():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        CorpusScores().update(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="reference 1 is NoneType"):
        corpus_scores(["a", "b"], ["a", None])


def test_sacrebleu_signatures_name_one_reference_stream():
    v = sacrebleu.__version__
    assert sacrebleu_signatures() == {
        "bleu": f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{v}",
        "bleu_lc": f"nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:{v}",
        "chrf": f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{v}",
    }


# --- BLEU's tokenizer follows the target language (sacreBLEU, Post 2018) ---------------------

# Chinese puts no spaces between words, and 13a does not split "，" or "。": every sentence is one
# 13a token, and no hypothesis equals its reference, so 13a finds no match at all. sacreBLEU's
# zh tokenizer splits each Chinese character off and finds the shared ones.
ZH_HYPS = ["我们今天去公园散步。", "这只猫在沙发上睡觉。", "他每天早上喝一杯咖啡，然后去上班。"]
ZH_REFS = ["今天我们去公园散步。", "那只猫在沙发上睡觉。", "他每天早晨喝一杯咖啡，然后去上班。"]


def test_a_chinese_target_scored_with_its_tokenizer_is_sacrebleus_zh_bleu_not_13as():
    tokenize = bleu_tokenizer("zh")
    zh = sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="zh").score
    got = corpus_scores(ZH_HYPS, ZH_REFS, tokenize)
    assert got["bleu"] == zh
    assert got["bleu_lc"] == sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="zh", lowercase=True).score
    assert got["chrf"] == sacrebleu.corpus_chrf(ZH_HYPS, [ZH_REFS]).score  # chrF does not tokenize
    assert sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="13a").counts[0] == 0
    assert corpus_scores(ZH_HYPS, ZH_REFS)["bleu"] == 0.0 < 50 < zh  # default 13a: no match


def test_corpus_scores_with_zh_equal_sacrebleu_also_fed_in_two_batches():
    metric = CorpusScores(tokenize="zh")
    metric.update(ZH_HYPS[:1], ZH_REFS[:1])
    metric.update(ZH_HYPS[1:], ZH_REFS[1:])
    got = metric.compute()
    assert got["bleu"] == sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="zh").score
    assert got["bleu_lc"] == sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="zh", lowercase=True).score
    assert got == corpus_scores(ZH_HYPS, ZH_REFS, "zh")


@pytest.mark.parametrize(
    "tgt_lang, want",
    [("zh", "zh"), ("zh-Hans", "zh"), ("zh_CN", "zh"), ("ZH", "zh")]
    + [(lang, "13a") for lang in ("fr", "de", "en", "fr-CA", "none")],
)
def test_bleu_tokenizer_follows_the_primary_subtag_of_the_target_language(tgt_lang, want):
    assert bleu_tokenizer(tgt_lang) == want


@pytest.mark.parametrize("lang, mecab, extra", [("ja", "ja-mecab", "ja"), ("ko", "ko-mecab", "ko")])
def test_japanese_and_korean_use_mecab_where_sacrebleu_loads_it(lang, mecab, extra, monkeypatch, caplog):
    monkeypatch.setattr(metrics, "_tokenizer_error", lambda name: None)  # MeCab loads
    with caplog.at_level("WARNING", logger="attnlab.metrics"):
        assert bleu_tokenizer(lang) == bleu_tokenizer(f"{lang.upper()}-JP") == mecab
    assert caplog.records == []
    monkeypatch.setattr(metrics, "_tokenizer_error", lambda name: f"no MeCab for {name}")
    with caplog.at_level("WARNING", logger="attnlab.metrics"):
        assert bleu_tokenizer(lang) == "char"
    (record,) = caplog.records
    message = record.getMessage()
    assert f"no MeCab for {mecab}" in message and "tokenize='char' instead" in message
    assert f'pip install "sacrebleu[{extra}]"' in message


@pytest.mark.skipif(metrics._tokenizer_error("ja-mecab") is None, reason="MeCab is installed here")
def test_without_mecab_installed_japanese_falls_back_to_characters(caplog):
    with caplog.at_level("WARNING", logger="attnlab.metrics"):
        assert bleu_tokenizer("ja") == "char"
    assert 'pip install "sacrebleu[ja]"' in caplog.text
    # what sacreBLEU itself says: its ja-mecab tokenizer cannot be built here
    with pytest.raises(RuntimeError, match=r"sacrebleu\[ja\]"):
        sacrebleu.BLEU(tokenize="ja-mecab")


@pytest.mark.parametrize("override", ["char", "13a", "intl", "none", "zh"])
def test_a_tokenizer_override_wins_over_the_language(override):
    assert bleu_tokenizer("zh", override) == bleu_tokenizer("fr", override) == override


def test_an_unknown_tokenizer_override_names_it_and_lists_sacrebleus():
    with pytest.raises(ValueError) as e:
        bleu_tokenizer("zh", "jieba")
    message = str(e.value)
    assert "data.bleu_tokenize='jieba' is not one of sacreBLEU's tokenizers" in message
    assert ", ".join(sacrebleu.BLEU.TOKENIZERS) in message  # none, zh, 13a, intl, char, ...
    with pytest.raises(ValueError, match="tokenize='13A' is not one of sacreBLEU's tokenizers"):
        CorpusScores(tokenize="13A")


def test_signatures_name_the_zh_tokenizer():
    v = sacrebleu.__version__
    assert sacrebleu_signatures("zh") == {
        "bleu": f"nrefs:1|case:mixed|eff:no|tok:zh|smooth:exp|version:{v}",
        "bleu_lc": f"nrefs:1|case:lc|eff:no|tok:zh|smooth:exp|version:{v}",
        "chrf": f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{v}",
    }
    got = sacrebleu.BLEU(tokenize="zh")
    got.corpus_score(ZH_HYPS, [ZH_REFS])
    assert sacrebleu_signatures("zh")["bleu"] == str(got.get_signature())


def test_the_validation_scorer_follows_the_data_configs_target_language(tmp_path, monkeypatch):
    """TranslationModule.from_config: val_bleu with data.tgt_lang's tokenizer, or data.bleu_tokenize."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    import attnlab.lit.translation as translation

    class Data:  # the datamodule's parts from_config reads, without a tokenized corpus
        vocab_size, src_vocab_size, tokenizer = 40, None, None

        def __init__(self, *args, **kwargs):
            pass

        def fixed_batch(self, split, n):
            return None

    monkeypatch.setattr(translation, "TranslationDataModule", Data)
    monkeypatch.setattr(translation, "fit_splits", lambda cfg, dm, positions: None)  # no arrays here
    conf = str(Path(__file__).resolve().parents[1] / "conf")

    def module(*overrides, drop_key=False):
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose(
                config_name="config",
                overrides=[f"paths.root={root}", "model=transformer", "model.net.d_model=16", *overrides],
            )
        if drop_key:  # a data config without the key (Hydra cannot delete a null value)
            with open_dict(cfg):
                del cfg.data["bleu_tokenize"]
        tok = Path(cfg.paths.tokenized)
        tok.mkdir(parents=True)
        (tok / "val.src.txt").write_text("A cat sleeps.\n", encoding="utf-8")
        (tok / "val.tgt.txt").write_text("猫在睡觉。\n", encoding="utf-8")
        m, _ = translation.TranslationModule.from_config(cfg)
        return m

    zh = module("data.tgt_lang=zh-Hans")
    assert zh.val_scores.tokenize == zh.hparams.bleu_tokenize == "zh"  # saved in the checkpoint
    zh.val_scores.update(ZH_HYPS, ZH_REFS)
    assert zh.val_scores.compute()["bleu"] == sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="zh").score
    assert module("data.tgt_lang=zh", "data.bleu_tokenize=char").val_scores.tokenize == "char"
    assert module("data.tgt_lang=zh", drop_key=True).val_scores.tokenize == "zh"  # key absent
    assert module().val_scores.tokenize == "13a"  # Multi30k en→fr
    with pytest.raises(ValueError, match="data.bleu_tokenize='jieba' is not one of"):
        module("data.bleu_tokenize=jieba")


def test_the_evaluate_summary_prints_the_tokenizer_of_the_signature(monkeypatch):
    from attnlab.console import summaries

    monkeypatch.setattr(summaries, "_run_rows", lambda record, logged: ([], []))
    scores = {
        "bleu": 12.345,
        "bleu_lc": 13.0,
        "chrf": 20.0,
        "num_sentences": 3,
        "signature": sacrebleu_signatures("zh"),
    }
    out = summaries.evaluate_summary("transformer", scores, Path("metrics/transformer.json"), {})
    assert out.splitlines()[1].split() == ["test_bleu", ":", "12.35", "(sacreBLEU,", "cased,", "zh)"]
    del scores["signature"]  # a metrics file without one: the tokenizer is not guessed
    out = summaries.evaluate_summary("transformer", scores, Path("metrics/transformer.json"), {})
    assert out.splitlines()[1].split() == ["test_bleu", ":", "12.35", "(sacreBLEU,", "cased)"]


def _lines(text: str) -> list[str]:
    """One sentence per '\\n'-terminated line (str.splitlines would also split on U+2028 etc.)."""
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def real_test_2016_check(hyp_path: Path, mirror: Path):
    """The metric on the system output for test_2016 equals sacreBLEU, batched as validation does."""
    with gzip.open(mirror / "multi30k/test_2016_flickr.fr.gz", "rt", encoding="utf-8") as f:
        refs = _lines(f.read())
    hyps = _lines(hyp_path.read_text(encoding="utf-8"))
    assert len(hyps) == len(refs) == 1000
    expected = _sacrebleu(hyps, refs)
    assert 0 < expected["bleu"] < 100
    _close(corpus_scores(hyps, refs), expected)
    ranks = [CorpusScores(), CorpusScores()]
    for r, metric in enumerate(ranks):
        for start in range(r * 256, len(hyps), 512):  # two ranks, batches of 256
            metric.update(hyps[start : start + 256], refs[start : start + 256])
    ranks[0].merge_state(ranks[1])
    _close(ranks[0].compute(), expected)


def test_metric_equals_sacrebleu_on_real_test_2016_output(mirror_dir):
    if not HYPOTHESES.is_file():
        pytest.skip(
            f"no {HYPOTHESES.relative_to(PROJECT_ROOT)}: the committed transformer system "
            "output appears after the next pipeline run (dvc repro evaluate@transformer)"
        )
    real_test_2016_check(HYPOTHESES, mirror_dir)


# --- val_loss: a token-weighted MeanMetric -------------------------------------------------


def test_val_loss_is_the_mean_over_all_target_tokens_of_two_batches():
    import torch.nn.functional as F

    from attnlab.data.tokenizer import PAD_ID
    from attnlab.lit.translation import TranslationModule

    torch.manual_seed(0)
    net_cfg = {
        "_target_": "attnlab.models.transformer.Transformer",
        "d_model": 16,
        "num_heads": 2,
        "num_layers": 1,
        "ffn_hidden": 32,
        "dropout": 0.0,
    }
    m = TranslationModule(net_cfg, {"_target_": "torch.optim.Adam", "_partial_": True}, vocab_size=30)
    m.eval()
    tgt_out = [torch.randint(4, 30, (3, 6)), torch.randint(4, 30, (2, 3))]
    tgt_out[0][0, 2:] = PAD_ID  # 14 target tokens in the first batch, 6 in the second
    batches = [
        {
            "src": torch.randint(4, 30, (len(t), 5)),
            "src_valid_lens": torch.full((len(t),), 5),
            "tgt_in": torch.randint(4, 30, t.shape),
            "tgt_out": t,
        }
        for t in tgt_out
    ]
    total, ntok = 0.0, 0
    with torch.no_grad(), pytest.warns(UserWarning, match="trainer. reference is not registered"):
        for i, batch in enumerate(batches):
            m.validation_step(batch, i)
            logits = m.net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
            total += F.cross_entropy(
                logits.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD_ID, reduction="sum"
            ).item()
            ntok += int((batch["tgt_out"] != PAD_ID).sum())
    assert ntok == 20
    batch_means = [m._loss(b, 0.0).item() for b in batches]
    assert m.val_loss.compute().item() == pytest.approx(total / ntok, rel=1e-6)
    assert total / ntok != pytest.approx(sum(batch_means) / 2, rel=1e-3)  # not the plain mean
    m.val_loss.update(torch.tensor(float("nan")), weight=4)  # a diverged batch is not dropped
    assert torch.isnan(m.val_loss.compute())


def test_val_loss_and_val_pairs_leave_out_the_pairs_a_batch_marks_not_counted():
    """A batch's ``counted`` (CountOnceLoader: False for the repeats that pad a DDP rank) takes
    its pairs out of val_loss and val_pairs; a batch with none counted adds nothing."""
    import torch.nn.functional as F

    from attnlab.data.tokenizer import PAD_ID
    from attnlab.lit.translation import TranslationModule

    torch.manual_seed(0)
    net_cfg = {
        "_target_": "attnlab.models.transformer.Transformer",
        "d_model": 16,
        "num_heads": 2,
        "num_layers": 1,
        "ffn_hidden": 32,
        "dropout": 0.0,
    }
    m = TranslationModule(net_cfg, {"_target_": "torch.optim.Adam", "_partial_": True}, vocab_size=30)
    m.eval()
    batch = {
        "src": torch.randint(4, 30, (4, 5)),
        "src_valid_lens": torch.tensor([5, 3, 4, 2]),
        "tgt_in": torch.randint(4, 30, (4, 6)),
        "tgt_out": torch.randint(4, 30, (4, 6)),
    }
    batch["tgt_out"][1, 3:] = PAD_ID
    counted = torch.tensor([False, True, False, True])
    with torch.no_grad():
        logits = m.net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
        rows = F.cross_entropy(
            logits.transpose(1, 2), batch["tgt_out"], ignore_index=PAD_ID, reduction="none"
        ).sum(dim=1)  # summed token loss per pair
    tokens = (batch["tgt_out"] != PAD_ID).sum(dim=1)
    assert tokens.tolist() == [6, 3, 6, 6]
    expected = (rows[counted].sum() / tokens[counted].sum()).item()  # pairs 1 and 3: 9 tokens
    assert expected != pytest.approx((rows.sum() / tokens.sum()).item(), rel=1e-3)  # the test can tell
    with torch.no_grad(), pytest.warns(UserWarning, match="trainer. reference is not registered"):
        m.validation_step({**batch, "counted": counted}, 0)
        m.validation_step({**batch, "counted": torch.zeros(4, dtype=torch.bool)}, 1)  # a repeat
    assert m.val_loss.compute().item() == pytest.approx(expected, rel=1e-6)
    assert m.val_pairs.compute().item() == 2
    assert m.val_loss.weight.item() == 9


# --- bleu_tok_lc: the papers' BLEU on lowercased, Moses-tokenized text --------------------------


def test_moses_lc_tokenize_gives_what_the_multi30k_scripts_give_by_hand():
    """Tokenized by hand with the rules of Multi30k's task1-tokenize.sh (Moses lowercase.perl,
    normalize-punctuation.perl -l, tokenizer.perl -l, escaped): French elision splits after the
    apostrophe, English clitics before it; a closing quote after a full stop at the end of a
    French line moves before it; `…` becomes `...`, `’` becomes `'`, runs of spaces one."""
    assert metrics.moses_lc_tokenize(
        ['Un homme regarde l’herbe, "verte."', "  Deux  chiens jouent dans la neige…  "], "fr"
    ) == ["un homme regarde l&apos; herbe , &quot; verte &quot; .", "deux chiens jouent dans la neige ..."]
    assert metrics.moses_lc_tokenize(['A man\'s "big" dog-sled.', "Two dogs & a cat (3)"], "en") == [
        "a man &apos;s &quot; big &quot; dog-sled .",
        "two dogs &amp; a cat ( 3 )",
    ]
    with pytest.raises(TypeError, match="expected str lines, got bytes"):
        metrics.moses_lc_tokenize([b"un chien"], "fr")


def test_bleu_tok_lc_is_sacrebleu_with_no_tokenizer_on_hand_tokenized_text():
    hyps = ["Un chien court sur l’herbe.", 'Deux hommes jouent aux "échecs".', "Une femme."]
    refs = ["Un chien court dans l'herbe verte.", 'Deux hommes jouent aux "échecs."', "Une femme sourit."]
    by_hand_hyps = [
        "un chien court sur l&apos; herbe .",
        "deux hommes jouent aux &quot; échecs &quot; .",
        "une femme .",
    ]
    by_hand_refs = [
        "un chien court dans l&apos; herbe verte .",
        "deux hommes jouent aux &quot; échecs &quot; .",
        "une femme sourit .",
    ]
    scores = corpus_scores(hyps, refs, tok_lc_lang="fr")
    expected = sacrebleu.corpus_bleu(by_hand_hyps, [by_hand_refs], tokenize="none").score
    assert scores["bleu_tok_lc"] == expected
    # the same text tokenized by 13a counts `l’herbe` and `"échecs."` differently
    assert scores["bleu_lc"] != pytest.approx(expected)
    assert "bleu_tok_lc" not in corpus_scores(hyps, refs)  # only when a language is given


def test_bleu_tok_lc_sums_over_batches_and_names_its_tokenizer():
    hyps = ["Un chien court sur l’herbe.", "Deux hommes.", "Une femme sourit.", "Un vélo rouge."]
    refs = ["Un chien court dans l'herbe.", "Deux hommes jouent.", "Une femme sourit.", "Un vélo bleu."]
    metric = CorpusScores(tok_lc_lang="fr", sync_on_compute=False)
    metric.update(hyps[:1], refs[:1])
    metric.update(hyps[1:], refs[1:])
    assert metric.compute()["bleu_tok_lc"] == corpus_scores(hyps, refs, tok_lc_lang="fr")["bleu_tok_lc"]
    version = sacrebleu.__version__
    import sacremoses

    assert sacrebleu_signatures(tok_lc_lang="fr")["bleu_tok_lc"] == (
        f"nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:{version}"
        f"|pre:lc.norm.tok.fr|sacremoses:{sacremoses.__version__}"
    )


# SHA-256 of the Multi30k repository's data/task1/tok/<test set>.lc.norm.tok.<lang> (commit
# 7bee46bc, made by its scripts/task1-tokenize.sh with Moses' Perl scripts): the text published
# Multi30k BLEU is computed on.
MULTI30K_TOK_SHA256 = {
    ("test_2016_flickr", "en"): "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    ("test_2016_flickr", "fr"): "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836",
    ("test_2016_flickr", "de"): "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
    ("test_2017_flickr", "en"): "c9d1dfd7a26add989382e534af235af9f0f658b2a30e7eb0efdaf142496ee54f",
    ("test_2017_flickr", "fr"): "c0583117a47b31e8a6c6a97cfe8de153e462074668f4e994764fcc80b21d33b4",
    ("test_2017_flickr", "de"): "02067e4a9402786a4fcb8c1b6f4307e4a5073ced64800abead5273b54f5f31f6",
}


@pytest.mark.parametrize(("test_set", "lang"), sorted(MULTI30K_TOK_SHA256))
def test_moses_lc_tokenize_of_the_raw_test_sets_is_the_corpus_tok_file(mirror_dir, test_set, lang):
    """bleu_tok_lc's references are the raw files processed here; they are the corpus's own
    lc.norm.tok files byte for byte, so bleu_tok_lc is multi-bleu on those files."""
    import hashlib

    with gzip.open(mirror_dir / "multi30k" / f"{test_set}.{lang}.gz", "rt", encoding="utf-8") as f:
        raw = f.read().splitlines()
    text = "".join(line + "\n" for line in metrics.moses_lc_tokenize(raw, lang))
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == MULTI30K_TOK_SHA256[(test_set, lang)]
