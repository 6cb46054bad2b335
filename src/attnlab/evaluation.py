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
from torch import nn

from attnlab.data.corpora import read_lines
from attnlab.data.synthetic import synthetic_from_config
from attnlab.data.tokenizer import load_sentencepiece
from attnlab.decoding import LENGTH_PENALTY, MAX_OUTPUT_LEN, translate_text
from attnlab.lit.device import single_device
from attnlab.metrics import corpus_scores, sacrebleu_signatures
from attnlab.models.nadaraya_watson import nw_evaluation

BATCH_SIZE = 128  # test sentences decoded together (sorted by length)


class NoTestSplitError(ValueError):
    """The data has no test split to score (D2L's fra_eng_d2l); names the command that scores it."""


@dataclass
class Evaluation:
    """One evaluation's results.

    scores: what ``metrics/<model>.json`` holds; logged: MLflow metric name → value (``test_*``);
    tags: MLflow tags of what was measured; hypotheses: the test translations, in order (one
    line each in ``metrics/<model>.hyp.txt``), or ``None`` for a model that does not translate.
    """

    scores: dict
    logged: dict[str, float]
    tags: dict[str, str] = field(default_factory=dict)
    hypotheses: list[str] | None = None


def evaluate_translation(cfg: DictConfig, net: nn.Module) -> Evaluation:
    """Beam search (``model.decoding``: beam_size, alpha) over the test split on the one device
    ``device`` names, detokenized and scored with sacreBLEU (corpus BLEU cased 13a, lowercased BLEU,
    chrF). The scores also say what was measured, as MT papers report it: corpus, src_lang,
    tgt_lang, test_set, the decoding settings and the sacreBLEU signatures.

    Raises:
        NoTestSplitError: ``data`` has no test split (``data.test_set`` unset: D2L's fra_eng_d2l,
            or the synthetic data of NW).
        DeviceUnavailableError: the device is not available here.
    """
    if cfg.data.get("test_set") is None:
        fix = (f"D2L scores its models with `python src/d2l_table.py data={cfg.data.name} model={cfg.model.name}`"
               if cfg.data.get("tokenize") else f"model={cfg.model.name} translates: choose data=multi30k or data=fra_eng")
        raise NoTestSplitError(f"data={cfg.data.name} has no test split; {fix}")
    device = single_device(cfg.device)
    tok_dir = Path(cfg.paths.tokenized)
    tokenizer = load_sentencepiece(tok_dir / "spm.model")
    sources, references = read_lines(tok_dir / "test.src.txt"), read_lines(tok_dir / "test.tgt.txt")
    decoding = {**OmegaConf.to_container(cfg.model.decoding, resolve=True), "batch_size": BATCH_SIZE,
                "length_penalty": LENGTH_PENALTY, "max_len": MAX_OUTPUT_LEN}
    hypotheses = translate_text(net.to(device).init_state, net.step, tokenizer, sources,
                                batch_size=BATCH_SIZE, device=device,
                                beam_size=decoding["beam_size"], alpha=decoding["alpha"])
    measured = {"corpus": cfg.data.name, "src_lang": cfg.data.src_lang,
                "tgt_lang": cfg.data.tgt_lang, "test_set": cfg.data.test_set}
    signatures = sacrebleu_signatures()
    scores = {**corpus_scores(hypotheses, references), "num_sentences": len(hypotheses),
              **measured, "decoding": decoding, "signature": signatures}
    return Evaluation(
        scores, {"test_bleu": scores["bleu"], "test_bleu_lc": scores["bleu_lc"], "test_chrf": scores["chrf"]},
        {**measured, "test_decoding": json.dumps(decoding, ensure_ascii=False),
         **{f"test_{k}_signature": v for k, v in signatures.items()}},
        hypotheses)


def evaluate_regression(cfg: DictConfig, net: nn.Module) -> Evaluation:
    """Test MSE of the trained NW model against D2L's average-pooling and non-parametric
    baselines and each kernel of ``model.kernels`` (:func:`attnlab.models.nadaraya_watson.nw_evaluation`:
    mse, mse_nonparametric, mse_average_pooling, w, mse_<kernel>, kernel_width).

    Raises:
        ValueError: data other than ``synthetic``; an unknown kernel or a width σ ≤ 0.
    """
    ev = nw_evaluation(synthetic_from_config(cfg.data, cfg.seed), float(net.w.detach()),
                       cfg.model.kernels, cfg.model.width)
    scores = ev["scores"]
    return Evaluation(scores, {"test_mse": scores["mse"],
                               **{f"test_mse_{k}": scores[f"mse_{k}"] for k in cfg.model.kernels}})
