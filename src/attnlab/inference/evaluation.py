"""What the evaluate stage measures, one function per task.

``conf/model/<model>.yaml`` names its function as ``task.evaluate``; ``src/evaluate.py`` calls
it with the composed config and the kept checkpoint's net, then writes ``metrics/<model>.json``
(and the translations), logs to the model's MLflow run and prints the summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.checkpoint import load_net
from attnlab.data.corpora import read_lines
from attnlab.data.synthetic import synthetic_from_config
from attnlab.data.tokenizer import load_sentencepiece
from attnlab.device import single_device
from attnlab.errors import ConfigError, DamagedFileError, UserError
from attnlab.inference.decoding import LENGTH_PENALTY, MAX_OUTPUT_LEN, require_bf16_units, translate_text
from attnlab.inference.ensemble import Ensemble
from attnlab.inference.lengths import TEST_SIDES, check_splits_fit
from attnlab.metrics import bleu_tokenizer, corpus_scores, sacrebleu_signatures
from attnlab.models import Bahdanau, NadarayaWatson, Transformer, max_positions
from attnlab.models.nadaraya_watson import nw_evaluation

BATCH_SIZE = 128  # test sentences decoded together (sorted by length)


class NoTestSplitError(UserError, ValueError):
    """A test split evaluate cannot score: the data has none (D2L's fra_eng_d2l: names the command
    that scores it), ``data.more_test_splits`` names one the corpus lacks, or the tokenized folder
    lacks a split's text (it predates the config: names the stage that writes it)."""


@dataclass
class Evaluation:
    """One evaluation's results.

    scores: what ``metrics/<model>.json`` holds; logged: MLflow metric name → value (``test_*``);
    tags: MLflow tags of what was measured; hypotheses: the test translations, in order (one
    line each in ``metrics/<model>.hyp.txt``), or ``None`` for a model that does not translate;
    more_hypotheses: test set name → its translations, for each of ``data.more_test_splits``.
    """

    scores: dict
    logged: dict[str, float]
    tags: dict[str, str] = field(default_factory=dict)
    hypotheses: list[str] | None = None
    more_hypotheses: dict[str, list[str]] = field(default_factory=dict)


SCORES = ("bleu", "bleu_lc", "chrf", "bleu_tok_lc")  # each logged to MLflow as test_<score>


def evaluate_translation(cfg: DictConfig, net: Transformer | Bahdanau) -> Evaluation:
    """Beam search (``model.decoding``: beam_size, alpha; bf16 autocast if ``bf16``) over the test
    split on the one device ``device`` names, detokenized and scored with sacreBLEU (corpus BLEU
    cased, lowercased BLEU, chrF). BLEU's tokenizer follows ``data.tgt_lang`` (zh → zh, ja →
    ja-mecab, ko → ko-mecab, else 13a) unless ``data.bleu_tokenize`` names one
    (:func:`attnlab.metrics.bleu_tokenizer`). The scores also say what was measured, as MT papers
    report it: corpus, src_lang, tgt_lang, test_set, the decoding settings and the sacreBLEU
    signatures (``tok:zh``, ...). ``bleu_tok_lc`` is BLEU as published Multi30k results compute it,
    on lowercased Moses-tokenized text (:func:`attnlab.metrics.moses_lc_tokenize`).

    Each split of ``data.more_test_splits`` (keys of ``data.splits``: Multi30k's test_2017_flickr)
    is decoded and scored the same way and reported under its file's name: ``more_test_sets``
    in the scores (bleu, bleu_lc, chrf, bleu_tok_lc, num_sentences) and MLflow metrics
    ``test_<score>/<name>``. The flat scores stay the main test set's (``data.test_set``).

    ``model.decoding.ensemble`` (a list of checkpoint paths, absent by default: add it with
    ``'+model.decoding.ensemble=[a.ckpt]'``) decodes with ``net`` and those nets together, the
    mean of their probabilities at each step (:class:`attnlab.inference.ensemble.Ensemble`);
    each is loaded as ``net`` was, checked against the tokenized corpus.

    Raises:
        NoTestSplitError: ``data`` has no test split (``data.test_set`` unset: D2L's fra_eng_d2l,
            or the synthetic data of NW); ``data.more_test_splits`` is not a list of distinct
            further test splits of ``data.splits``; or the tokenized folder lacks a split's
            text (it predates the config: re-run the tokenize stage). All checked before
            anything is decoded.
        ValueError: ``data.bleu_tokenize`` is not a sacreBLEU tokenizer (checked before the
            tokenized folder).
        ConfigError: ``model.decoding.ensemble`` is not a list of paths.
        CheckpointError, TokenizerMismatchError: a ``model.decoding.ensemble`` checkpoint that
            is missing, damaged, of another model, or of another corpus
            (:func:`attnlab.checkpoint.load_net`'s message, prefixed with the setting).
        PairTooLongError: a test source needs more positions than ``net`` has
            (:func:`attnlab.inference.lengths.check_splits_fit`: names the split, line and fix).
        DeviceUnavailableError: the device is not available here.
        Bf16UnitsError: ``model.decoding.bf16`` on a device without bf16 units
            (:func:`attnlab.inference.decoding.require_bf16_units`). Both checked before anything is decoded.
    """
    if cfg.data.get("test_set") is None:
        fix = (
            "D2L scores its models with "
            f"`python src/d2l_table.py data={cfg.data.name} model={cfg.model.name}`"
            if cfg.data.get("tokenize")
            else f"model={cfg.model.name} translates: choose data=multi30k, data=fra_eng or data=parallel"
        )
        raise NoTestSplitError(f"data={cfg.data.name} has no test split; {fix}")
    more = _more_test_splits(cfg.data)
    tokenize = bleu_tokenizer(cfg.data.tgt_lang, cfg.data.get("bleu_tokenize"))
    tok_dir = Path(cfg.paths.tokenized)
    for split in ("test", *more.values()):
        missing = [f for f in (f"{split}.src.txt", f"{split}.tgt.txt") if not (tok_dir / f).is_file()]
        if missing:
            raise NoTestSplitError(
                f"{tok_dir} has no {' or '.join(missing)}: it was tokenized before data.splits "
                f"had `{split}`; re-run the tokenize stage (`dvc repro tokenize`, or "
                f"`python src/tokenize_data.py data={cfg.data.name}`)"
            )
    members = _ensemble_members(cfg, tok_dir)
    # a source a net cannot take would stop decoding halfway: refused before any is decoded
    sides = {split: TEST_SIDES for split in ("test", *more.values())}
    check_splits_fit(tok_dir, sides, max_positions(net), cfg.model.name, "evaluate")
    for path, member in members:
        check_splits_fit(tok_dir, sides, max_positions(member), f"{cfg.model.name} ({path})", "evaluate")
    nets = [net, *(member for _, member in members)]
    device = single_device(cfg.device)
    settings = OmegaConf.to_container(cfg.model.decoding, resolve=True)
    assert isinstance(settings, dict)  # model.decoding is a mapping in every conf/model/*.yaml
    decoding = {
        **settings,
        "batch_size": BATCH_SIZE,
        "length_penalty": LENGTH_PENALTY,
        "max_len": MAX_OUTPUT_LEN,
    }
    bf16 = bool(decoding.get("bf16", False))
    if bf16:
        require_bf16_units(device.type)
    tokenizer = load_sentencepiece(tok_dir / "spm.model")

    nets = [member.to(device) for member in nets]
    decoder = Ensemble([(member.init_state, member.step) for member in nets])

    def score(split: str) -> tuple[dict, list[str]]:
        src_path, tgt_path = tok_dir / f"{split}.src.txt", tok_dir / f"{split}.tgt.txt"
        sources, references = read_lines(src_path), read_lines(tgt_path)
        if len(sources) != len(references):  # the tokenize stage writes them line-aligned
            raise DamagedFileError(
                f"{src_path} has {len(sources)} lines but {tgt_path} has {len(references)}: one "
                "is damaged (the tokenize stage writes them line for line); re-run it with "
                f"`dvc repro tokenize` (or `python src/tokenize_data.py data={cfg.data.name}`)"
            )
        hypotheses = translate_text(
            decoder.init_state,
            decoder.step,
            tokenizer,
            sources,
            batch_size=BATCH_SIZE,
            device=device,
            beam_size=decoding["beam_size"],
            alpha=decoding["alpha"],
            bf16=bf16,
        )
        scores = corpus_scores(hypotheses, references, tokenize, cfg.data.tgt_lang)
        return {**scores, "num_sentences": len(hypotheses)}, hypotheses

    main, hypotheses = score("test")
    scored = {name: score(key) for name, key in more.items()}
    measured = {
        "corpus": cfg.data.name,
        "src_lang": cfg.data.src_lang,
        "tgt_lang": cfg.data.tgt_lang,
        "test_set": cfg.data.test_set,
    }
    signatures = sacrebleu_signatures(tokenize, cfg.data.tgt_lang)
    scores = {**main, **measured, "decoding": decoding, "signature": signatures}
    logged = {f"test_{k}": main[k] for k in SCORES}
    if scored:
        scores["more_test_sets"] = {name: s for name, (s, _) in scored.items()}
        for name, (s, _) in scored.items():
            logged.update({f"test_{k}/{name}": s[k] for k in SCORES})
    return Evaluation(
        scores,
        logged,
        {
            **measured,
            "test_decoding": json.dumps(decoding, ensure_ascii=False),
            **{f"test_{k}_signature": v for k, v in signatures.items()},
        },
        hypotheses,
        {name: h for name, (_, h) in scored.items()},
    )


def _ensemble_members(cfg: DictConfig, tok_dir: Path) -> list[tuple[str, Transformer | Bahdanau]]:
    """(path as given, net) of each checkpoint of ``model.decoding.ensemble`` (a relative path is
    from ``paths.root``), loaded as evaluate loads its own.

    Raises:
        ConfigError: the setting is not a list of paths.
        CheckpointError, TokenizerMismatchError: from :func:`attnlab.checkpoint.load_net`.
    """
    paths = cfg.model.decoding.get("ensemble") or []
    listed = OmegaConf.is_list(paths) or isinstance(paths, list)
    if not listed or not all(isinstance(p, str) for p in paths):
        raise ConfigError(
            f"model.decoding.ensemble must be a list of checkpoint paths, e.g. "
            f"'+model.decoding.ensemble=[outputs/seed1.ckpt]'; got {paths!r}"
        )
    root = Path(cfg.paths.root)  # a relative path is the project's, as every other path
    members: list[tuple[str, Transformer | Bahdanau]] = []
    for path in paths:
        try:
            net = load_net(root / path, expected_kind=cfg.model.name, tokenized_dir=tok_dir)
        except UserError as e:  # load_net's fix is for the kept checkpoint: name the member's
            raise type(e)(
                f"model.decoding.ensemble: {e} (this member: give the path of a checkpoint of this "
                "model trained on this corpus, e.g. one written by scripts/choose_on_val.py "
                "--write, or leave it out)"
            ) from None
        assert isinstance(net, (Transformer, Bahdanau))  # expected_kind is a translation model's
        members.append((path, net))
    return members


def _more_test_splits(data: DictConfig) -> dict[str, str]:
    """``data.more_test_splits`` as {test set name (its file's): key of ``data.splits``}.

    Raises:
        NoTestSplitError: not a list, an entry twice or naming a file twice, an entry that
            is not a further test split of ``data.splits`` (train, val and test are not), or one
            whose file is the train, val or main test split's.
    """
    keys = data.get("more_test_splits") or []
    splits = data.get("splits") or {}
    fix = "list further test splits of data.splits, or set data.more_test_splits=[]"
    if not (OmegaConf.is_list(keys) or isinstance(keys, list)):
        raise NoTestSplitError(
            f"data.more_test_splits must be a list of keys of data.splits "
            f"(e.g. [test_2017]), not {keys!r}; {fix}"
        )
    more: dict[str, str] = {}
    for key in keys:
        if key in ("train", "val", "test") or key not in splits:
            known = ", ".join(splits) if splits else f"data={data.name} has no data.splits"
            raise NoTestSplitError(
                f"data.more_test_splits names {key!r}, which is not a further "
                f"test split of data.splits ({known}); {fix}"
            )
        same = [k for k in ("train", "val", "test") if splits.get(k) == splits[key]]
        if same:
            raise NoTestSplitError(
                f"data.more_test_splits names {key!r}, whose file {splits[key]} is "
                f"data.splits.{same[0]}'s: it would be scored as a further test set; {fix}"
            )
        if splits[key] in more:
            raise NoTestSplitError(
                f"data.more_test_splits names {splits[key]} twice ({more[splits[key]]!r} and {key!r}); {fix}"
            )
        more[splits[key]] = key
    return more


def evaluate_regression(cfg: DictConfig, net: NadarayaWatson) -> Evaluation:
    """Test MSE of the trained NW model against D2L's average-pooling and non-parametric
    baselines and each kernel of ``model.kernels`` (:func:`attnlab.models.nadaraya_watson.nw_evaluation`:
    mse, mse_nonparametric, mse_average_pooling, w, mse_<kernel>, kernel_width).

    Raises:
        ValueError: data other than ``synthetic``; an unknown kernel or a width σ ≤ 0.
    """
    ev = nw_evaluation(
        synthetic_from_config(cfg.data, cfg.seed), float(net.w.detach()), cfg.model.kernels, cfg.model.width
    )
    scores = ev["scores"]
    return Evaluation(
        scores,
        {"test_mse": scores["mse"], **{f"test_mse_{k}": scores[f"mse_{k}"] for k in cfg.model.kernels}},
    )
