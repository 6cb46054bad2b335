"""Translation metrics: D2L's per-sentence BLEU and sacreBLEU corpus BLEU/chrF.

The corpus scores are sacreBLEU's (Post 2018), kept as its sufficient statistics in a
``torchmetrics.Metric`` so they can be accumulated batch by batch and summed across DDP
ranks. torchmetrics' own ``SacreBLEUScore``/``CHRFScore`` are not used: they differ from
sacreBLEU (no 'exp' smoothing when an n-gram order has no match, float32 arithmetic, and
chrF's whitespace and empty-hypothesis handling), e.g. 0.0 vs sacreBLEU's 8.1167 on a
one-sentence corpus with no 4-gram match.

BLEU's tokenizer follows the target language (:func:`bleu_tokenizer`): sacreBLEU's ``13a``
splits on spaces and punctuation, which leaves a Chinese, Japanese or Korean sentence as a
few long "words"; ``zh``, ``ja-mecab`` and ``ko-mecab`` segment those languages first.

``bleu_tok_lc`` is BLEU as published Multi30k results compute it (:func:`moses_lc_tokenize`):
on lowercased, punctuation-normalized, Moses-tokenized text, as in the corpus's
``tok/*.lc.norm.tok.*`` files, with no further tokenization.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
from collections.abc import Sequence

import sacremoses
import torch
from sacrebleu.metrics import BLEU, CHRF
from torchmetrics import Metric

from attnlab.errors import ConfigError

log = logging.getLogger(__name__)

# Target language (primary subtag) → sacreBLEU's tokenizer for it, and the pip extra it needs;
# every other language gets DEFAULT_TOKENIZE (mteval-v13a, sacreBLEU's own default).
DEFAULT_TOKENIZE = "13a"
_LANGUAGE_TOKENIZE = {"zh": ("zh", None), "ja": ("ja-mecab", "ja"), "ko": ("ko-mecab", "ko")}
_FALLBACK_TOKENIZE = "char"  # MeCab missing: characters, which need nothing installed


def d2l_bleu(pred_seq: str, label_seq: str, k: int) -> float:
    """D2L's sentence BLEU (D2L 10.7.8 (zh 9.7.6), eq. 10.7.16; Papineni et al. 2002).

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
        num_matches, label_subs = 0, collections.Counter[str]()
        for i in range(len_label - n + 1):
            label_subs[" ".join(label_tokens[i : i + n])] += 1
        for i in range(len_pred - n + 1):
            gram = " ".join(pred_tokens[i : i + n])
            if label_subs[gram] > 0:
                num_matches += 1
                label_subs[gram] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


def _check_tokenize(name: str, what: str, hint: str = "") -> None:
    if name not in BLEU.TOKENIZERS:
        raise ConfigError(
            f"{what}={name!r} is not one of sacreBLEU's tokenizers: choose one of "
            f"{', '.join(BLEU.TOKENIZERS)}{hint}"
        )


@functools.cache
def _tokenizer_error(name: str) -> str | None:
    """Why sacreBLEU cannot build tokenizer ``name`` here (its first line), or ``None`` if it can."""
    try:
        BLEU(tokenize=name)  # builds the tokenizer: MeCab and its dictionary are loaded here
    except (ImportError, RuntimeError, AssertionError, OSError) as e:
        lines = str(e).strip().splitlines()
        return lines[0] if lines else type(e).__name__
    return None


def bleu_tokenizer(tgt_lang: str, override: str | None = None) -> str:
    """The sacreBLEU tokenizer for BLEU of translations into ``tgt_lang`` (sacreBLEU, Post 2018).

    ``tgt_lang``: a language code; only its primary subtag counts, lowercased (``zh``,
    ``zh-Hans``, ``zh_CN`` and ``ZH`` are all Chinese). Chinese → ``"zh"``; Japanese →
    ``"ja-mecab"`` and Korean → ``"ko-mecab"`` when sacreBLEU can load MeCab and its dictionary
    here, else ``"char"`` with a logged warning that says how to install them
    (``pip install "sacrebleu[ja]"`` / ``"sacrebleu[ko]"``); any other language → ``"13a"``.
    ``override`` (the config's ``data.bleu_tokenize``), when not ``None``, is returned as is.
    Returns a key of ``sacrebleu.metrics.BLEU.TOKENIZERS``.
    Raises:
        ValueError: ``override`` is not one of sacreBLEU's tokenizers (the message lists them).
    """
    if override is not None:
        _check_tokenize(override, "data.bleu_tokenize", ", or null to follow the target language")
        return override
    primary = str(tgt_lang).replace("_", "-").split("-")[0].lower()
    name, extra = _LANGUAGE_TOKENIZE.get(primary, (DEFAULT_TOKENIZE, None))
    if extra is not None:
        why = _tokenizer_error(name)
        if why is not None:
            log.warning(
                "BLEU of %s text: sacreBLEU's %s tokenizer is not usable here (%s); scoring with "
                "tokenize=%r instead, which is not comparable to published %s scores. "
                'Install it with `pip install "sacrebleu[%s]"`',
                primary,
                name,
                why,
                _FALLBACK_TOKENIZE,
                name,
                extra,
            )
            return _FALLBACK_TOKENIZE
    return name


@functools.cache
def _moses(lang: str) -> tuple[sacremoses.MosesPunctNormalizer, sacremoses.MosesTokenizer]:
    return sacremoses.MosesPunctNormalizer(lang=lang), sacremoses.MosesTokenizer(lang=lang)


def moses_lc_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Text as Multi30k's ``tok/*.lc.norm.tok.<lang>`` files hold it, the text that published
    Multi30k BLEU is computed on (multi-bleu.perl or fairseq's BLEU on these files).

    The corpus's ``scripts/task1-tokenize.sh``, one line at a time: Moses' ``lowercase.perl``
    (Python's ``str.lower``), ``normalize-punctuation.perl -l <lang>`` and ``tokenizer.perl -l
    <lang>`` (XML-escaped, as by default: ``'`` → ``&apos;``, ``"`` → ``&quot;``), by sacremoses'
    ports of the two Moses scripts. On the raw test_2016_flickr and test_2017_flickr files of
    en, fr and de this gives the corpus's tok files line for line. ``lang``: a language code
    (``fr``); Moses knows European languages, and tokenizes others by its generic rules (it does
    not segment Chinese, Japanese or Korean). Returns one string per line, tokens joined by one
    space. Raises TypeError if a line is not a ``str``.
    """
    normalizer, tokenizer = _moses(str(lang).replace("_", "-").split("-")[0].lower())
    out = []
    for line in lines:
        if not isinstance(line, str):
            raise TypeError(f"expected str lines, got {type(line).__name__}")
        # the newline the Perl scripts read with each line lets normalize-punctuation's rule for a
        # closing quote after a full stop (`."` → `".` in fr, de, ...) fire at the end of a line too
        normalized = normalizer.normalize(" ".join(line.lower().split()) + "\n")
        out.append(tokenizer.tokenize(normalized, return_str=True, escape=True).strip())
    return out


TOK_LC = "bleu_tok_lc"


def _sacrebleu_metrics(tokenize: str = DEFAULT_TOKENIZE, tok_lc: bool = False) -> dict[str, BLEU | CHRF]:
    """sacreBLEU's metric objects with ``corpus_bleu``/``corpus_chrf``'s defaults, BLEU with
    ``tokenize``; with ``tok_lc`` also ``bleu_tok_lc``'s (lowercased, ``tokenize="none"``: its
    text comes tokenized by :func:`moses_lc_tokenize`)."""
    _check_tokenize(tokenize, "tokenize")
    scorers: dict[str, BLEU | CHRF] = {
        "bleu": BLEU(tokenize=tokenize),
        "bleu_lc": BLEU(tokenize=tokenize, lowercase=True),
        "chrf": CHRF(),
    }
    if tok_lc:
        scorers[TOK_LC] = BLEU(tokenize="none", lowercase=True, force=True)
    return scorers


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    for what, lines in (("hypothesis", hypotheses), ("reference", references)):
        for i, line in enumerate(lines):
            if not isinstance(line, str):
                raise TypeError(
                    f"{what} {i} is {type(line).__name__}, not a str: "
                    "pass detokenized text, one string per sentence"
                )


class CorpusScores(Metric):
    """sacreBLEU corpus BLEU (cased and lowercased) and chrF2 as summable statistics.

    ``tokenize``: BLEU's sacreBLEU tokenizer (default ``"13a"``; :func:`bleu_tokenizer` chooses
    it from the target language); chrF does not tokenize.

    ``update(hypotheses, references)`` takes detokenized text, one reference per hypothesis
    (same order; *not* sacreBLEU's reference streams) and adds each pair's sacreBLEU
    sufficient statistics to integer states: for BLEU ``[hyp_len, ref_len, matches_1..4,
    totals_1..4]`` (``int64``, shape ``(10,)``), for chrF the per-order
    ``[hyp_count, ref_count, matches]`` of character 1..6-grams (``int64``, shape ``(18,)``).
    Corpus BLEU and chrF are functions of these sums alone, so the states are summed across
    DDP ranks (``dist_reduce_fx="sum"``) and ``compute()`` gives the score of the union of all
    ranks' sentences, whatever the batching. Statistics and scores are sacreBLEU's own code
    (``BLEU``/``CHRF`` ``_extract_corpus_statistics`` and ``_compute_score_from_stats``), so
    ``compute()`` equals ``sacrebleu.corpus_bleu``/``corpus_chrf`` on the same pairs exactly.

    ``tok_lc_lang``: the target language; when given, ``bleu_tok_lc`` is added: BLEU on the text
    of :func:`moses_lc_tokenize` (lowercased, Moses-normalized and -tokenized, as published
    Multi30k scores), summable the same way.

    ``compute()`` returns ``{"bleu", "bleu_lc", "chrf"}`` (and ``"bleu_tok_lc"``): Python floats
    in [0, 100] (0.0 for all when nothing was added).
    Raises:
        ValueError: ``tokenize`` is not one of sacreBLEU's tokenizers; from ``update``: the two
            lists differ in length.
        TypeError: from ``update``: an element is not a ``str``.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, tokenize: str = DEFAULT_TOKENIZE, tok_lc_lang: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.tokenize = tokenize
        self.tok_lc_lang = tok_lc_lang
        self._scorers = _sacrebleu_metrics(tokenize, tok_lc=tok_lc_lang is not None)
        # sufficient statistics: BLEU's hyp/ref lengths + matches and totals per n-gram order,
        # chrF's three per order
        sizes = {
            key: 2 + 2 * scorer.max_ngram_order if isinstance(scorer, BLEU) else 3 * scorer.order
            for key, scorer in self._scorers.items()
        }
        for key, size in sizes.items():
            self.add_state(f"{key}_stats", torch.zeros(size, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str], references: Sequence[str]) -> None:
        _check_pairs(hypotheses, references)
        if not hypotheses:
            return
        texts = {"": (list(hypotheses), [list(references)])}  # sacreBLEU takes reference *streams*
        if self.tok_lc_lang is not None:
            texts[TOK_LC] = (
                moses_lc_tokenize(hypotheses, self.tok_lc_lang),
                [moses_lc_tokenize(references, self.tok_lc_lang)],
            )
        for key, scorer in self._scorers.items():
            hyps, refs = texts.get(key, texts[""])
            per_sentence = scorer._extract_corpus_statistics(hyps, refs)
            state = getattr(self, f"{key}_stats")
            state += torch.tensor(per_sentence, dtype=torch.int64).sum(dim=0).to(state.device)

    def compute(self) -> dict[str, float]:
        return {
            key: float(scorer._compute_score_from_stats(getattr(self, f"{key}_stats").tolist()).score)
            for key, scorer in self._scorers.items()
        }


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    tokenize: str = DEFAULT_TOKENIZE,
    tok_lc_lang: str | None = None,
) -> dict[str, float]:
    """sacreBLEU on detokenized text, one reference per hypothesis (same order).

    Returns ``bleu`` (corpus BLEU, cased, tokenized by sacreBLEU's ``tokenize``: see
    :func:`bleu_tokenizer`), ``bleu_lc`` (lowercased) and ``chrf`` (chrF2), each a float in
    [0, 100], equal to ``sacrebleu.corpus_bleu(..., tokenize=tokenize)``/``corpus_chrf`` (via
    :class:`CorpusScores`); with ``tok_lc_lang`` (the target language) also ``bleu_tok_lc``,
    ``sacrebleu.corpus_bleu`` with ``tokenize="none"`` on :func:`moses_lc_tokenize`'s text.
    Raises:
        ValueError: the two lists differ in length; ``tokenize`` is not a sacreBLEU tokenizer.
        TypeError: if an element is not a ``str``.
    """
    metric = CorpusScores(tokenize, tok_lc_lang, sync_on_compute=False)
    metric.update(hypotheses, references)
    return metric.compute()


def sacrebleu_signatures(tokenize: str = DEFAULT_TOKENIZE, tok_lc_lang: str | None = None) -> dict[str, str]:
    """sacreBLEU's signature of each score of :func:`corpus_scores` with ``tokenize``, for one
    reference stream.

    Keys ``bleu``, ``bleu_lc``, ``chrf``; values from sacreBLEU's ``get_signature()``, e.g.
    ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`` (``tok:zh`` for ``"zh"``).
    With ``tok_lc_lang`` also ``bleu_tok_lc``: sacreBLEU's (``case:lc|…|tok:none``) followed by
    what tokenized the text, e.g. ``|pre:lc.norm.tok.fr|sacremoses:0.2.0``.
    Raises:
        ValueError: ``tokenize`` is not one of sacreBLEU's tokenizers.
    """
    signatures = {}
    for key, scorer in _sacrebleu_metrics(tokenize, tok_lc=tok_lc_lang is not None).items():
        scorer.corpus_score(["."], [["."]])  # sacreBLEU fixes ``nrefs`` when it reads references
        signatures[key] = str(scorer.get_signature())
    if tok_lc_lang is not None:
        signatures[TOK_LC] += f"|pre:lc.norm.tok.{tok_lc_lang}|sacremoses:{sacremoses.__version__}"
    return signatures
