"""Translation metrics: D2L's per-sentence BLEU and sacreBLEU corpus BLEU/chrF."""
from __future__ import annotations

import collections
import math
from typing import Sequence

import sacrebleu


def d2l_bleu(pred_seq: str, label_seq: str, k: int) -> float:
    """D2L's sentence BLEU (D2L 10.7.6, eq. 10.7.16; Papineni et al. 2002).

    exp(min(0, 1 - len_label/len_pred)) · Π_{n=1..k} p_n^(1/2^n), with p_n the
    clipped n-gram precision. Tokens are split on whitespace (U+202F and U+00A0
    count as whitespace). Returns a float in [0, 1]; an empty prediction scores
    0.0 (D2L's code splits on single spaces, so it scores the empty string as one
    unmatched token, also 0).
    """
    pred_tokens, label_tokens = pred_seq.split(), label_seq.split()
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    if len_pred == 0:
        return 0.0
    score = math.exp(min(0.0, 1 - len_label / len_pred))
    for n in range(1, min(k, len_pred) + 1):
        num_matches, label_subs = 0, collections.defaultdict(int)
        for i in range(len_label - n + 1):
            label_subs[" ".join(label_tokens[i : i + n])] += 1
        for i in range(len_pred - n + 1):
            gram = " ".join(pred_tokens[i : i + n])
            if label_subs[gram] > 0:
                num_matches += 1
                label_subs[gram] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """sacreBLEU on detokenized text, one reference per hypothesis (same order).

    Returns ``bleu`` (corpus BLEU, cased, 13a tokenization), ``bleu_lc``
    (lowercased) and ``chrf`` (chrF2), each in [0, 100].
    Raises:
        ValueError: if the two lists differ in length.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    refs = [list(references)]  # sacreBLEU takes reference *streams*
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, refs).score,
        "bleu_lc": sacrebleu.corpus_bleu(hypotheses, refs, lowercase=True).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, refs).score,
    }
