"""Trace a trained net into a self-contained export folder (TorchScript + sentencepiece + JSON).

A translation export folder ``models/<model>/`` holds
``init_state.pt`` and ``step.pt`` (TorchScript traces of the model's decoding
interface, see :mod:`attnlab.decoding`), ``spm.model`` and ``config.json``
(:func:`export_translation`); :mod:`attnlab.export.translator` loads it with torch
and sentencepiece alone.
NW exports ``model.pt`` mapping x (Q,) float32 → ŷ (Q,), with its training
points baked in (:func:`export_regression`).
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from attnlab.export.translator import (DEFAULT_MAX_INPUT_CHARS, DEFAULT_MAX_REQUEST_CHARS,
                                       DEFAULT_MAX_REQUEST_SENTENCES, DEFAULT_MAX_REQUEST_TOKENS)
from attnlab.files import staged_dir

FORMAT_VERSION = 1


class _InitState(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, src, src_valid_lens):
        return self.net.init_state(src, src_valid_lens)


class _Step(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, ys, *state):
        return self.net.step(ys, *state)


class _NWPredictor(nn.Module):
    def __init__(self, net, x_train, y_train):
        super().__init__()
        self.net = net
        self.register_buffer("x_train", x_train)
        self.register_buffer("y_train", y_train)

    def forward(self, x):
        return self.net(x, self.x_train, self.y_train)


def _trace(module: nn.Module, example: tuple) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():  # tracer warnings about Python ints are expected here
        warnings.simplefilter("ignore")
        return torch.jit.trace(module, example, check_trace=False)


def _max_source_tokens(net: nn.Module) -> int | None:
    """Most source tokens (without <eos>) the net can encode: its positional table − 1, or None."""
    table = getattr(getattr(net, "pos_encoding", None), "P", None)
    return None if table is None else int(table.shape[1]) - 1


def export_translation(net: nn.Module, tokenizer_path: Path, out_dir: Path, config: dict,
                       max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
                       max_request_sentences: int = DEFAULT_MAX_REQUEST_SENTENCES,
                       max_request_chars: int = DEFAULT_MAX_REQUEST_CHARS,
                       max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS) -> Path:
    """Trace ``net`` (a Transformer or Bahdanau in eval mode) and write the export folder.

    ``config.json`` holds ``config`` plus ``format_version``, ``task`` and
    ``serving = {max_input_chars, max_input_tokens, max_request_sentences,
    max_request_chars, max_request_tokens}``: the longest source
    :class:`~attnlab.export.translator.Translator`
    accepts, in characters, and in sentencepiece tokens (the Transformer's positional
    table − 1 for <eos>; null for the GRU, which has none); and the most one request
    to the served model may hold
    (:meth:`attnlab.export.translator.Translator.check_request`).

    Args:
        net: model with ``init_state``/``step`` (see :mod:`attnlab.decoding`).
        tokenizer_path: its ``spm.model``.
        out_dir: target folder, replaced atomically.
        config: JSON-serializable facts stored as ``config.json`` (model name, sizes,
            optionally ``decoding = {beam_size, alpha}``, the settings
            :class:`~attnlab.export.translator.Translator` uses).
        max_input_chars: input limit per sentence in characters, ≥ 1.
        max_request_sentences, max_request_chars, max_request_tokens: limits per request
            of the served model: sentences, characters and sentencepiece tokens of all its
            sentences together, each ≥ 1.
    Raises:
        ValueError: a limit < 1, or a per-request limit below what one sentence may have
            (``max_request_chars`` < ``max_input_chars``, ``max_request_tokens`` <
            ``max_input_tokens``, or < ``max_input_chars`` + 1 for a model without a token
            limit), so a sentence could be accepted by itself yet fit no request.
    """
    from attnlab.data.tokenizer import load_sentencepiece

    limits = {"max_input_chars": max_input_chars, "max_request_sentences": max_request_sentences,
              "max_request_chars": max_request_chars, "max_request_tokens": max_request_tokens}
    for key, value in limits.items():
        if int(value) < 1:
            raise ValueError(f"serving.{key} must be ≥ 1, got {value}")
    if max_request_chars < max_input_chars:
        raise ValueError(f"serving.max_request_chars ({max_request_chars}) is below "
                         f"serving.max_input_chars ({max_input_chars}): a sentence of "
                         f"{max_input_chars} characters would fit no request. Raise "
                         "max_request_chars or lower max_input_chars")
    max_input_tokens = _max_source_tokens(net)
    one_sentence, which = ((max_input_tokens, "max_input_tokens") if max_input_tokens is not None
                           else (max_input_chars + 1, "max_input_chars + 1"))
    if max_request_tokens < one_sentence:
        raise ValueError(f"serving.max_request_tokens ({max_request_tokens}) is below the "
                         f"{one_sentence} tokens one sentence may have ({which}): such a "
                         "sentence would fit no request. Raise max_request_tokens")

    net = net.eval().cpu()
    sp = load_sentencepiece(tokenizer_path)
    src, valid = sp.encode_sources(["a first example sentence .", "two"])
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as tmp, torch.no_grad():
        state = net.init_state(src, valid)
        ys = torch.full((src.shape[0], 3), 4, dtype=torch.long)
        _trace(_InitState(net), (src, valid)).save(str(tmp / "init_state.pt"))
        _trace(_Step(net), (ys, *state)).save(str(tmp / "step.pt"))
        shutil.copy(tokenizer_path, tmp / "spm.model")
        serving = {**{k: int(v) for k, v in limits.items()}, "max_input_tokens": max_input_tokens}
        (tmp / "config.json").write_text(json.dumps(
            {"format_version": FORMAT_VERSION, "task": "translation", **config, "serving": serving},
            indent=2))
    return out_dir


def export_regression(net: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor,
                      out_dir: Path, config: dict) -> Path:
    """Trace a NW model with its training points as keys/values into ``out_dir/model.pt``."""
    out_dir = Path(out_dir)
    predictor = _NWPredictor(net.eval(), x_train, y_train)
    with staged_dir(out_dir) as tmp:
        with torch.no_grad():
            _trace(predictor, (x_train[:3].clone(),)).save(str(tmp / "model.pt"))
        (tmp / "config.json").write_text(json.dumps(
            {"format_version": FORMAT_VERSION, "task": "regression", **config}, indent=2))
    return out_dir
