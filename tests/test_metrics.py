"""BLEU: D2L's sentence BLEU by hand, sacreBLEU corpus scores against sacrebleu itself."""
import math

import pytest
import sacrebleu

from attnlab.metrics import corpus_scores, d2l_bleu


def test_exact_two_token_match_scores_one_with_k4():
    assert d2l_bleu("il est", "il est", 4) == 1.0


def test_empty_prediction_scores_zero():
    assert d2l_bleu("", "il est calme", 2) == 0.0
    assert d2l_bleu("   ", "il est calme", 2) == 0.0


def test_brevity_penalty_d2l_example():
    assert d2l_bleu("il", "il est calme", 2) == pytest.approx(math.exp(1 - 3))


def test_d2l_table_value():
    # D2L 10.7.6: pred "il est calme ." vs label "il est calme ." → 1; one wrong word:
    # p1 = 3/4 (il, est, .), p2 = 1/3 ("il est") → (3/4)^(1/2) (1/3)^(1/4)
    assert d2l_bleu("il est mouillé .", "il est calme .", 2) == pytest.approx(
        (3 / 4) ** 0.5 * (1 / 3) ** 0.25)


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
