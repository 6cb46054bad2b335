"""Export a trained net into a self-contained folder (torch.export programs + sentencepiece + JSON).

A translation export folder ``models/<model>/`` holds
``init_state.pt2`` and ``step.pt2`` (``torch.export`` programs of the model's decoding
interface, see :mod:`attnlab.inference.decoding`, with dynamic batch, source, target and cache sizes:
:mod:`attnlab.export.program`), optionally ``step.aoti.pt2`` (the step built with
AOTInductor), ``attention.pt2`` (the cross attention of a translation, for alignments:
:data:`CROSS_ATTENTION`), ``ctranslate2/<quantization>/`` (a Transformer's CTranslate2 models),
``spm.model`` and ``config.json`` (:func:`export_translation`);
:mod:`attnlab.serving.translator` loads it with torch and sentencepiece alone. A model that
``torch.export`` cannot export with a dynamic source length (Bahdanau's GRU encoder) gets
TorchScript traces (``.pt``) instead, and ``config.json`` → ``runtime.why_torchscript`` says why.
NW exports ``model.pt`` mapping x (Q,) float32 → ŷ (Q,), with its training
points baked in (:func:`export_regression`).
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from attnlab.data.special_tokens import PAD_ID
from attnlab.errors import ConfigError
from attnlab.export import ctranslate2 as ct2
from attnlab.export.integrity import write_checksums
from attnlab.export.program import (
    COMPILED_ISA,
    EXAMPLE_SIZES,
    MAX_SIZE,
    call_args,
    can_compile,
    compile_program,
    export_program,
)
from attnlab.files import staged_dir
from attnlab.models import max_positions
from attnlab.serving.translator import (
    CTRANSLATE2_ENGINES,
    DEFAULT_MAX_INPUT_CHARS,
    DEFAULT_MAX_REQUEST_CHARS,
    DEFAULT_MAX_REQUEST_SENTENCES,
    DEFAULT_MAX_REQUEST_TOKENS,
)

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


class _CrossAttention(nn.Module):
    """(src (B, S), src_valid_lens (B,), tgt_in (B, T)) → the encoder–decoder attention of one
    teacher-forced pass, (B, L, H, T, S) float32: every decoder layer and head at once."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, src, src_valid_lens, tgt_in):
        return torch.stack(self.net.attention_maps(src, src_valid_lens, tgt_in)["encoder_decoder"], 1)


class _AlignmentStep(nn.Module):
    """``step`` that also returns the attention it computed: (ys (B, T), *state) →
    (weights (B, 1, S), logits (B, V), *state). For a recurrent decoder (Bahdanau), whose
    attention at step t needs the hidden state of step t − 1, so it cannot run teacher-forced
    in one traced call; the runtime feeds the output tokens one step at a time."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, ys, *state):
        out = self.net.step(ys, *state)
        return (self.net.attention.attention_weights, *out)


# The cross attention each kind of model exports as attention.pt2 (or .pt), by the kind its
# attention_maps returns: the interface (config.json → cross_attention.mode), and the wrapper
# of each interface.
CROSS_ATTENTION = {"encoder_decoder": "teacher_forced", "alignment": "step"}
CROSS_ATTENTION_WRAPPERS = {"teacher_forced": _CrossAttention, "step": _AlignmentStep}


class _NWPredictor(nn.Module):
    def __init__(self, net, x_train, y_train):
        super().__init__()
        self.net = net
        self.register_buffer("x_train", x_train)
        self.register_buffer("y_train", y_train)

    def forward(self, x):
        return self.net(x, self.x_train, self.y_train)


def _trace(module: nn.Module, example: tuple) -> torch.jit.ScriptModule:
    """TorchScript trace (NW, and the translation models ``torch.export`` cannot export). Its
    deprecation warning is shown; only the tracer's warnings about Python ints are expected."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return torch.jit.trace(module, example, check_trace=False)


def _examples(net: nn.Module, vocab_size: int) -> list[dict]:
    """Two example calls of each decoding function, sized by :data:`EXAMPLE_SIZES` (the first
    and the second number), from which :func:`attnlab.export.program.export_program` reads
    which dimensions are dynamic: ``{"init_state": (src, valid), "step": (ys, state),
    "attention": (src, valid, tgt_in)}`` with a cache of ``cache`` earlier positions."""
    examples = []
    for i in (0, 1):
        B, S, T, C = (EXAMPLE_SIZES[k][i] for k in ("batch", "source", "target", "cache"))
        g = torch.Generator().manual_seed(i)
        valid = torch.tensor([S] + [max(2, S - 2 - k) for k in range(B - 1)])
        src = torch.randint(4, vocab_size, (B, S), generator=g)
        src[torch.arange(S)[None, :] >= valid[:, None]] = PAD_ID
        ys = torch.randint(4, vocab_size, (B, C + 1), generator=g)
        state = net.init_state(src, valid)
        for c in range(C):
            state = net.step(ys[:, : c + 1], *state)[1:]
        examples.append(
            {
                "init_state": (src, valid),
                "step": (ys, tuple(state)),
                "attention": (src, valid, torch.randint(4, vocab_size, (B, T), generator=g)),
            }
        )
    return examples


def _save_programs(
    net: nn.Module, vocab_size: int, cross_mode: str | None, folder: Path, compile_step: bool
) -> dict:
    """Write init_state, step and attention (none for ``cross_mode`` None: a model without
    attention) as ``torch.export`` programs (``.pt2``) and, with
    ``compile_step``, the step's AOTInductor build; a model ``torch.export`` cannot export
    (Bahdanau: ``aten::gru`` is unrolled over the example's length, so the source length
    cannot stay dynamic) is traced with TorchScript instead. Returns ``config.json`` →
    ``runtime``: ``{"format", "files": {function: file}, "compiled": {function: file} ,
    "isa", "why_torchscript"}``."""
    a, b = _examples(net, vocab_size)
    table = _max_source_tokens(net)  # lengths the model can take, or None: no limit
    max_len = MAX_SIZE if table is None else table + 1
    wrappers = {"init_state": _InitState(net), "step": _Step(net)}
    if cross_mode is not None:
        wrappers["attention"] = CROSS_ATTENTION_WRAPPERS[cross_mode](net)
    args = {
        "init_state": "init_state",
        "step": "step",  # which example each function takes
        "attention": "attention" if cross_mode == "teacher_forced" else "step",
    }
    try:
        programs = {
            name: export_program(module, a[args[name]], b[args[name]], folder / f"{name}.pt2", max_len)
            for name, module in wrappers.items()
        }
    except Exception as e:  # noqa: BLE001 - whatever stops torch.export, the model keeps working
        for stale in folder.glob("*.pt2"):
            stale.unlink()
        for name, module in wrappers.items():
            _trace(module, call_args(a[args[name]])).save(str(folder / f"{name}.pt"))
        why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        return {
            "format": "torchscript",
            "files": {n: f"{n}.pt" for n in wrappers},
            "compiled": {},
            "why_torchscript": f"torch.export: {why}",
        }
    runtime = {"format": "torch.export", "files": {n: f"{n}.pt2" for n in wrappers}, "compiled": {}}
    if compile_step and can_compile():
        compile_program(programs["step"], folder / "step.aoti.pt2")
        runtime.update(compiled={"step": "step.aoti.pt2"}, isa=COMPILED_ISA)
    return runtime


def _max_source_tokens(net: nn.Module) -> int | None:
    """Most source tokens (without <eos>) the net can encode: its positional table − 1, or None."""
    positions = max_positions(net)
    return None if positions is None else positions - 1


def export_translation(
    net: nn.Module,
    tokenizer_path: Path,
    out_dir: Path,
    config: dict,
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
    max_request_sentences: int = DEFAULT_MAX_REQUEST_SENTENCES,
    max_request_chars: int = DEFAULT_MAX_REQUEST_CHARS,
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
    ctranslate2: Sequence[str] = (),
    compile: bool = False,
) -> Path:
    """Export ``net`` (a Transformer or Bahdanau in eval mode) and write the export folder.

    ``config.json`` holds ``config`` plus ``format_version``, ``task``, ``runtime`` (the
    format and files of the decoding functions: :func:`_save_programs`), ``engines``,
    ``cross_attention = {kind, mode, layers, heads}`` (how the attention function is called:
    :data:`CROSS_ATTENTION`; null, and no attention function, for a model without attention)
    and ``serving = {max_input_chars, max_input_tokens, max_request_sentences,
    max_request_chars, max_request_tokens}``: the longest source
    :class:`~attnlab.serving.translator.Translator`
    accepts, in characters, and in sentencepiece tokens (the Transformer's positional
    table − 1 for <eos>; null for the GRU, which has none); and the most one request
    to the served model may hold
    (:meth:`attnlab.serving.translator.Translator.check_request`). ``SHA256SUMS``, written
    last, lists every file's SHA-256 (:mod:`attnlab.export.integrity`), which the translator
    checks each file against as it loads it.

    Args:
        net: model with ``init_state``/``step`` (see :mod:`attnlab.inference.decoding`) and
            ``attention_maps``.
        tokenizer_path: its ``spm.model``.
        out_dir: target folder, replaced atomically.
        config: JSON-serializable facts stored as ``config.json`` (model name, sizes,
            optionally ``decoding = {beam_size, alpha}``, the settings
            :class:`~attnlab.serving.translator.Translator` uses).
        max_input_chars: input limit per sentence in characters, ≥ 1.
        max_request_sentences, max_request_chars, max_request_tokens: limits per request
            of the served model: sentences, characters and sentencepiece tokens of all its
            sentences together, each ≥ 1.
        ctranslate2: quantizations (``"float32"``, ``"int8"``) of CTranslate2 models to write
            beside the traces, ``ctranslate2/<quantization>/``
            (:func:`attnlab.export.ctranslate2.export_ctranslate2`), for a Transformer; a net
            CTranslate2 cannot run (Bahdanau) gets none. ``config.json`` → ``engines`` lists
            what the folder holds (:data:`attnlab.serving.translator.ENGINES`).
        compile: also build the step with AOTInductor (``step.aoti.pt2``, about a minute;
            :func:`attnlab.export.program.compile_program`), which the runtime prefers where
            the CPU can run it. Only for a model ``torch.export`` exports.
    Raises:
        ValueError: a limit < 1, or a per-request limit below what one sentence may have
            (``max_request_chars`` < ``max_input_chars``, ``max_request_tokens`` <
            ``max_input_tokens``, or < ``max_input_chars`` + 1 for a model without a token
            limit), so a sentence could be accepted by itself yet fit no request.
    """
    from attnlab.data.tokenizer import load_sentencepiece

    limits = {
        "max_input_chars": max_input_chars,
        "max_request_sentences": max_request_sentences,
        "max_request_chars": max_request_chars,
        "max_request_tokens": max_request_tokens,
    }
    for key, value in limits.items():
        if int(value) < 1:
            raise ConfigError(f"serving.{key} must be ≥ 1, got {value}")
    if max_request_chars < max_input_chars:
        raise ConfigError(
            f"serving.max_request_chars ({max_request_chars}) is below "
            f"serving.max_input_chars ({max_input_chars}): a sentence of "
            f"{max_input_chars} characters would fit no request. Raise "
            "max_request_chars or lower max_input_chars"
        )
    max_input_tokens = _max_source_tokens(net)
    one_sentence, which = (
        (max_input_tokens, "max_input_tokens")
        if max_input_tokens is not None
        else (max_input_chars + 1, "max_input_chars + 1")
    )
    if max_request_tokens < one_sentence:
        raise ConfigError(
            f"serving.max_request_tokens ({max_request_tokens}) is below the "
            f"{one_sentence} tokens one sentence may have ({which}): such a "
            "sentence would fit no request. Raise max_request_tokens"
        )

    net = net.eval().cpu()
    sp = load_sentencepiece(tokenizer_path)
    src, valid = sp.encode_sources(["a first example sentence .", "two"])
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as tmp, torch.no_grad():
        ys = torch.full((src.shape[0], 3), 4, dtype=torch.long)
        cross = _cross_attention(net, src, valid, ys)
        mode = None if cross is None else cross["mode"]
        runtime = _save_programs(net, sp.get_piece_size(), mode, tmp, compile)
        engines = ["torch"]
        if ctranslate2 and ct2.supports(net):
            for quantization in ctranslate2:
                ct2.export_ctranslate2(net, tokenizer_path, tmp / "ctranslate2" / quantization, quantization)
                engines.append(CTRANSLATE2_ENGINES[quantization])
        shutil.copy(tokenizer_path, tmp / "spm.model")
        serving = {**{k: int(v) for k, v in limits.items()}, "max_input_tokens": max_input_tokens}
        (tmp / "config.json").write_text(
            json.dumps(
                {
                    "format_version": FORMAT_VERSION,
                    "task": "translation",
                    **config,
                    "runtime": runtime,
                    "cross_attention": cross,
                    "engines": engines,
                    "serving": serving,
                },
                indent=2,
            )
        )
        write_checksums(tmp)  # last: every file's SHA-256, checked as the folder loads
    return out_dir


def _cross_attention(net: nn.Module, src, valid, ys) -> dict | None:
    """The net's cross attention (:data:`CROSS_ATTENTION`): its ``config.json`` entry, or None
    for a model without attention (``attention_maps`` returns ``{}``: the seq2seq baseline)."""
    maps = net.attention_maps(src, valid, ys)
    if not maps:
        return None
    kinds = [kind for kind in CROSS_ATTENTION if kind in maps]
    if len(kinds) != 1:
        raise ValueError(
            f"{type(net).__name__}.attention_maps returns {sorted(maps)}: expected "
            f"exactly one cross-attention kind of {sorted(CROSS_ATTENTION)}"
        )
    kind = kinds[0]
    layers = maps[kind]
    return {
        "kind": kind,
        "mode": CROSS_ATTENTION[kind],
        "layers": len(layers),
        "heads": int(layers[0].shape[1]),
    }


def export_regression(
    net: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor, out_dir: Path, config: dict
) -> Path:
    """Trace a NW model with its training points as keys/values into ``out_dir/model.pt``."""
    out_dir = Path(out_dir)
    predictor = _NWPredictor(net.eval(), x_train, y_train)
    with staged_dir(out_dir) as tmp:
        with torch.no_grad():
            _trace(predictor, (x_train[:3].clone(),)).save(str(tmp / "model.pt"))
        (tmp / "config.json").write_text(
            json.dumps({"format_version": FORMAT_VERSION, "task": "regression", **config}, indent=2)
        )
        write_checksums(tmp)
    return out_dir
