"""The runtime of an export folder: load it, and translate text with it.

:func:`load_translator` needs only torch and sentencepiece; the decoding loops
are :mod:`attnlab.inference.decoding`'s, the same ones evaluation uses, so an export
decodes exactly the tokens its checkpoint does. :class:`Translator` is the
text-in, text-out front end (``src/translate.py`` and the MLflow model of
:mod:`attnlab.serving.model` use it): the export's beam settings, its input limits
(``config.json`` → ``serving``: per sentence, and per request for the served model),
and "" → "". The folder is written by :func:`attnlab.export.trace.export_translation`.

This is the served model's runtime: keep its imports to torch, sentencepiece and
:mod:`attnlab.inference.decoding`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.data.special_tokens import BOS_ID, EOS_ID
from attnlab.errors import MissingFileError, UserError
from attnlab.inference.decoding import decodable, translate
from attnlab.serving.batching import RequestBatcher
from attnlab.serving.sentences import Split, split_sentences

# Longest source sentence a served/translated export accepts, in characters (Unicode code
# points). Multi30k's longest English sentence has about 220 (test_2017_flickr); beam search
# time grows with the length.
DEFAULT_MAX_INPUT_CHARS = 500
# Most the served model decodes in one request (Translator.check_request), so that a request
# at the limit is answered well inside the scoring server's MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT
# (default 60 s). Decoding time grows with the source tokens of the request (each sentence
# decodes up to 1.5 × its tokens + 10 steps): the token budget bounds it whatever the text; the
# characters (a cheap check before tokenizing; 32 sentences of twice Multi30k's mean 61
# characters) and the sentence count bound the work around it.
# Measured with a d_model 256, 2+2-layer, 5,000-piece Transformer with random weights (every
# sentence decodes to its length cap, the worst case), beam 5, on a 2-core machine at load
# average 4-6. Served (`mlflow models serve`), one request at each limit: 32 Multi30k test
# sentences (1,974 characters, 481 tokens) 1.7-1.8 s; 4 × 500 characters (428 tokens)
# 1.9-2.6 s; 3 token-dense sentences (1,230 characters, 993 tokens) 4.5-6.1 s (English at
# the 4,000-character limit is about 860 tokens). In-process with
# two threads on the busy cores, 5-10× slower: 32 test sentences 12-18 s, 4 × 500 characters
# 11-21 s, 4 token-dense × 500 characters (1,610 tokens, over the limit) 37-42 s. See the
# serving how-to of the documentation.
DEFAULT_MAX_REQUEST_SENTENCES = 32
# The decoders an export folder may hold (config.json → engines): attnlab's own decoding loops
# over the traced model ("torch": every model, exactly the checkpoint's and evaluate's tokens),
# and CTranslate2 models of a Transformer (attnlab.export.ctranslate2: greedy gives the same
# tokens, beam search may differ in rare sentences), float32 or int8 weights.
CTRANSLATE2_ENGINES = {"float32": "ctranslate2", "int8": "ctranslate2_int8"}
ENGINES = ("torch", *CTRANSLATE2_ENGINES.values())
DEFAULT_ENGINE = "torch"
DEFAULT_MAX_REQUEST_CHARS = 4000
DEFAULT_MAX_REQUEST_TOKENS = 1000


def _load_function(folder: Path, runtime: dict, name: str, files=None):
    """One decoding function of an export folder: the AOTInductor build where this CPU runs
    it, else the ``torch.export`` program, or the TorchScript trace of an older export or of
    a model torch.export cannot export. Each file is checked against the folder's
    ``SHA256SUMS`` first (``files``: the folder's
    :class:`~attnlab.export.integrity.ExportFiles`, made here if not given).

    A damaged AOTInductor build beside a whole portable program: the program, with a
    :class:`~attnlab.export.integrity.DamagedExportWarning` that names the damaged file and the
    fix, once per process (:func:`~attnlab.export.integrity.warn_once`).

    Raises:
        DamagedExportError: the file to load is missing, changed since the export or
            unreadable (names it and the command that exports the model again).
    """
    from attnlab.export.integrity import DamagedExportError, ExportFiles, warn_once
    from attnlab.export.program import can_compile, load_compiled, load_program

    files = files or ExportFiles(folder)
    portable = runtime.get("files", {}).get(name, f"{name}.pt")
    compiled = runtime.get("compiled", {}).get(name)
    if compiled is not None and can_compile():
        try:
            return load_compiled(files.check(compiled), files.model_name())
        except DamagedExportError as e:
            if not files.whole(portable):
                raise
            warn_once(
                f"{e}. Translating with the portable program {folder / portable} instead, "
                "which gives the same translations, more slowly"
            )
    if portable.endswith(".pt2"):
        return load_program(files.check(portable), files.model_name())
    with files.loading(portable) as path:
        return torch.jit.load(str(path), map_location="cpu")


def load_translator(export_dir: Path):
    """Load an export folder: (init_state, step, tokenizer, config), with torch and sentencepiece only.

    Every file is checked against the folder's ``SHA256SUMS`` before it is loaded (a folder
    written before it existed is loaded unchecked): :mod:`attnlab.export.integrity`.

    Raises:
        MissingFileError: the folder holds no export (a ``FileNotFoundError``; names the stage
            to run).
        ConfigError: the folder holds another task's export (a ``ValueError``).
        DamagedExportError: a file of the folder is missing, cut short, changed since the
            export or unreadable (a ``ValueError``; names it and the command that exports the
            model again). A damaged AOTInductor build beside a whole portable program is
            passed over instead (:func:`_load_function`).
    """
    from attnlab.data.tokenizer import load_sentencepiece  # sentencepiece, with encode_sources
    from attnlab.errors import ConfigError
    from attnlab.export.integrity import ExportFiles

    d = Path(export_dir)
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise MissingFileError(
            f"{cfg_path} not found; export first with `python src/export.py model=<name>` or `dvc repro`"
        )
    files = ExportFiles(d)
    with files.loading("config.json") as path:
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError(f"it holds a JSON {type(config).__name__}, not an object")
    runtime = config.get("runtime") or {}  # older exports: TorchScript init_state.pt, step.pt
    step_file = runtime.get("files", {}).get("step", "step.pt")
    listed = files.sums is not None and step_file in files.sums  # missing then: damaged
    if not (d / step_file).exists() and not listed:  # a regression export holds model.pt alone
        raise ConfigError(
            f"{d} has no step function: it is not a translation model's export "
            f"(config.json says task {config.get('task')!r}); pass one, e.g. "
            "models/transformer, or export it again with `python src/export.py model=<name>`"
        )
    init_state = _load_function(d, runtime, "init_state", files)
    step = _load_function(d, runtime, "step", files)
    with files.loading("spm.model") as path:
        tokenizer = load_sentencepiece(path)
    return init_state, step, tokenizer, config


@dataclass(frozen=True)
class Alignment:
    """A translation and the cross attention that produced it.

    Attributes:
        translation: the detokenized output, as :meth:`Translator.__call__` returns it.
        source_tokens: the S source pieces the model attended over, its ``</s>`` included.
        target_tokens: the T output pieces, one per decoding step, the final ``</s>`` included.
        kind: ``encoder_decoder`` (Transformer) or ``alignment`` (Bahdanau).
        weights: (L, H, T, S) float32, every decoder layer (bottom first) and head: row t is
            the attention over the source while the model chose output token t; each row sums
            to 1. A sentence with nothing to translate has T = S = 0.
    """

    translation: str
    source_tokens: list[str]
    target_tokens: list[str]
    kind: str
    weights: torch.Tensor

    def as_json(self) -> dict:
        """The served model's answer for one sentence (docs: How-to, serving): the fields above,
        ``attention`` = ``weights`` as nested lists ``[layer][head][target][source]``, and
        ``alignment`` = the mean over the heads of the last layer ``[target][source]`` (fairseq's
        ``--print-alignment`` convention; for Bahdanau, its one map)."""
        w = self.weights
        last = w[-1].mean(0) if w.shape[0] else w.new_zeros(0, 0)
        return {
            "translation": self.translation,
            "source_tokens": list(self.source_tokens),
            "target_tokens": list(self.target_tokens),
            "attention_kind": self.kind,
            "alignment": last.tolist(),
            "attention": w.tolist(),
        }


@dataclass(frozen=True)
class Translation:
    """One input translated sentence by sentence (:mod:`attnlab.serving.sentences`).

    Attributes:
        translation: the translations of :attr:`sentences` joined with the input's own
            separators and line breaks (what :meth:`Translator.__call__` returns).
        sentences: the N source sentences the input was cut into (N ≥ 0).
        translations: their N translations.
        alignments: with :meth:`Translator.align`, the N sentences' :class:`Alignment`; else None.
    """

    translation: str
    sentences: list[str]
    translations: list[str]
    alignments: list[Alignment] | None = None

    def as_json(self) -> dict:
        """The served model's answer for one input with ``details`` or ``alignments`` (docs:
        How-to, serving): ``translation`` and ``sentences``, one object per source sentence
        with its ``source`` and ``translation`` and, with alignments, the fields of
        :meth:`Alignment.as_json`."""
        items = [{"source": s, "translation": t} for s, t in zip(self.sentences, self.translations)]
        for item, alignment in zip(items, self.alignments or []):
            item.update(alignment.as_json())
        return {"translation": self.translation, "sentences": items}


class InputTooLongError(UserError, ValueError):
    """A sentence is longer than the export's input limit (``config.json`` → ``serving``)."""


class InvalidRequestError(UserError, ValueError):
    """A request to the served model is not a list of strings (:meth:`Translator.check_request`)."""


class UnknownEngineError(InvalidRequestError):
    """An engine that is not one of :data:`ENGINES`, or that the export does not hold."""


class RequestTooLargeError(InvalidRequestError):
    """A request to the served model holds more sentences, characters or tokens than its
    per-request limits (``config.json`` → ``serving``) allow."""


class EmptyRequestError(InvalidRequestError):
    """A request to the served model holds no sentence."""


class InvalidTextError(InvalidRequestError):
    """A sentence holds a lone surrogate (U+D800–U+DFFF): not text, and nothing a tokenizer
    or a UTF-8 encoder takes (a broken UTF-16 pair, or bytes that were not UTF-8)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(sentences: Sequence[str]) -> None:
    """Raise :class:`InvalidTextError` for the first sentence with a lone surrogate (index from 0)."""
    for i, text in enumerate(sentences):
        if bad := _SURROGATE.search(text):
            raise InvalidTextError(
                f"input {i} holds U+{ord(bad.group()):04X} at character {bad.start()}, a lone "
                "surrogate, which is not text (half of a UTF-16 pair, or a byte that was not "
                "UTF-8); send valid Unicode text"
            )


class NoAttentionError(InvalidRequestError):
    """Alignments asked of a model without attention (the seq2seq baseline: ``config.json`` →
    ``cross_attention`` null)."""


def _first_over(lengths: list[int], labels: list[str], limit: int, unit: str, rule: str) -> None:
    """Raise :class:`InputTooLongError` for the first length over ``limit``:
    "<label> has <length> <unit> <limit> <rule>"."""
    for label, n in zip(labels, lengths):
        if n > limit:
            raise InputTooLongError(f"{label} has {n} {unit} {limit} {rule}")


def _labels(splits: list[Split]) -> list[str]:
    """ "input <i>" for each sentence of the inputs, ", sentence <j>" added where an input has
    several (both from 0, as the request's list)."""
    return [
        f"input {i}" + (f", sentence {j}" if len(split.sentences) > 1 else "")
        for i, split in enumerate(splits)
        for j in range(len(split.sentences))
    ]


class _PreEncoded:
    """A tokenizer whose ``encode`` answers the given sentences with their known ids (any
    other sentence is encoded), so decoding does not tokenize a checked request again."""

    def __init__(self, tokenizer, sentences: Sequence[str], ids: Sequence[list[int]]):
        self._tokenizer, self._ids = tokenizer, dict(zip(sentences, ids))

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        known = self._ids
        missing = [s for s in sentences if s not in known]
        fresh = dict(zip(missing, self._tokenizer.encode(missing))) if missing else {}
        return [known[s] if s in known else fresh[s] for s in sentences]

    def encode_sources(self, sentences: Sequence[str]):
        # the tokenizer's own encode_sources (its padding), reading the ids from encode above
        return type(self._tokenizer).encode_sources(self, sentences)

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)


class Translator:
    """An export folder as a text-in, text-out translator.

    Each input is cut into sentences (:func:`attnlab.serving.sentences.split_sentences`, for the
    export's source language ``config.json`` → ``data.src_lang``), every sentence is translated,
    and the translations are joined with the input's own separators and line breaks, so no
    sentence of an input is dropped. Decodes with the export's ``decoding`` settings
    (``config.json`` → ``decoding``, else ``model_config.decoding``, else greedy) unless
    ``beam_size``/``alpha`` are given, through :func:`attnlab.inference.decoding.translate`,
    so each sentence gets exactly the tokens that function gives it.
    A sentence with nothing to translate (empty, whitespace, control or invisible format
    characters alone, or no token but the </s>: :func:`attnlab.inference.decoding.decodable`) translates
    to "" without decoding, on every engine.

    Args:
        export_dir: a folder written by :func:`attnlab.export.trace.export_translation`.
        beam_size, alpha: override the export's decoding settings (beam_size 1 is greedy).
        batch_size: sentences decoded together.
        engine: the decoder (:data:`ENGINES`): ``torch`` (the default: the tokens evaluate
            scored, for every model), ``ctranslate2`` or ``ctranslate2_int8`` (a Transformer's
            CTranslate2 model in the folder, float32 or int8 weights).
    Attributes:
        language: the source language the inputs are split for (``en`` for older exports).
        max_input_chars: longest accepted sentence in characters (Unicode code points).
        max_input_tokens: longest accepted sentence in sentencepiece tokens, or None.
        max_request_sentences, max_request_chars, max_request_tokens: most sentences,
            characters and tokens per request of the served model (:meth:`serve`).
        beam_size, alpha, config: the settings in use and the export's ``config.json``.
    Raises:
        FileNotFoundError, ValueError: as :func:`load_translator`.
        UnknownEngineError: ``engine`` is not one of :data:`ENGINES` or not in this export.
    """

    def __init__(
        self,
        export_dir: Path,
        beam_size: int | None = None,
        alpha: float | None = None,
        batch_size: int = 128,
        engine: str = DEFAULT_ENGINE,
    ):
        self.export_dir = Path(export_dir)
        self.init_state, self.step, self.tokenizer, self.config = load_translator(export_dir)
        dec = self.config.get("decoding") or self.config.get("model_config", {}).get("decoding") or {}
        self.beam_size = int(beam_size if beam_size is not None else dec.get("beam_size", 1))
        self.alpha = float(alpha if alpha is not None else dec.get("alpha", 0.0))
        limits = self.config.get("serving") or {}  # exports older than the limit get the default
        self.max_input_chars = int(limits.get("max_input_chars") or DEFAULT_MAX_INPUT_CHARS)
        self.max_input_tokens = limits.get("max_input_tokens")
        self.max_request_sentences = int(limits.get("max_request_sentences") or DEFAULT_MAX_REQUEST_SENTENCES)
        self.max_request_chars = int(limits.get("max_request_chars") or DEFAULT_MAX_REQUEST_CHARS)
        self.max_request_tokens = int(limits.get("max_request_tokens") or DEFAULT_MAX_REQUEST_TOKENS)
        self.language = str((self.config.get("data") or {}).get("src_lang") or "en")
        self.batch_size = batch_size
        self.engines: list[str] = list(self.config.get("engines") or ["torch"])
        self._ctranslate2: dict[str, object] = {}
        self.engine = self.check_engine(engine)
        # the served model sets these (attnlab.serving.model): requests of serve() are decoded in
        # batches with other requests, each answered or refused within its timeout
        self.batcher: RequestBatcher | None = None
        self.request_timeout_s = 60.0

    def check_engine(self, engine: str) -> str:
        """``engine`` if this export holds it, else :class:`UnknownEngineError` naming those it has."""
        if engine not in self.engines:
            why = (
                "not an engine"
                if engine not in ENGINES
                else "not in this export (CTranslate2 runs Transformers only; export one again "
                "with `python src/export.py model=transformer` to add it)"
            )
            raise UnknownEngineError(f"engine {engine!r} is {why}; this model has {', '.join(self.engines)}")
        return engine

    def split(self, inputs: Sequence[str]) -> tuple[list[Split], list[list[int]] | None]:
        """Cut each input into sentences (:func:`attnlab.serving.sentences.split_sentences`) and
        check them: :class:`InvalidTextError` for the first input that is not text, then
        :class:`InputTooLongError` naming the first sentence over a limit ("input 2, sentence
        1", from 0).

        Returns:
            One :class:`~attnlab.serving.sentences.Split` per input, and all sentences' token
            ids (in order) when the token limit needed them, else None.
        """
        _check_text(inputs)
        splits = [split_sentences(text, self.language) for text in inputs]
        sentences = [s for split in splits for s in split.sentences]
        labels = _labels(splits)
        _first_over(
            [len(text) for text in sentences],
            labels,
            self.max_input_chars,
            "characters; this model translates at most",
            "characters per sentence (max_input_chars). A sentence ends at . ! ? (。！？) or a line "
            "break: shorten it or end it sooner.",
        )
        if self.max_input_tokens is None:
            return splits, None
        ids = self.tokenizer.encode(sentences)
        _first_over(
            [len(seq) for seq in ids],
            labels,
            self.max_input_tokens,
            "sentencepiece tokens; this model encodes at most",
            "tokens per sentence (max_input_tokens). Shorten the sentence or end it sooner.",
        )
        return splits, ids

    def check_request(self, sentences: Sequence[str]) -> list[Split]:
        """:meth:`checked_request`'s splits."""
        return self.checked_request(sentences)[0]

    def checked_request(self, sentences: Sequence[str]) -> tuple[list[Split], list[list[int]]]:
        """Check one request of the served model against every limit, cheapest first.

        ``sentences`` must be a non-empty list of str (the inputs); then at most
        ``max_request_sentences`` of them, ``max_request_chars`` characters together, each
        sentence they hold within :meth:`split`'s limits, and ``max_request_tokens``
        sentencepiece tokens together. Nothing is decoded; the count and type checks run
        before any input is read, the token checks after the character checks.

        Returns:
            The inputs' :class:`~attnlab.serving.sentences.Split`, as :meth:`split`, and the
            token ids of all their sentences in order (``tokenizer.encode``), which decoding
            reuses: a request is tokenized once.

        Raises:
            InvalidRequestError: ``sentences`` is not a list/tuple, or an item is not a str
                (names its index and type).
            EmptyRequestError: no sentence.
            RequestTooLargeError: over a per-request limit (names the count, the limit,
                its ``serving.*`` setting and how to split).
            InputTooLongError: a sentence over a per-sentence limit.
        """
        if not isinstance(sentences, (list, tuple)):
            raise InvalidRequestError(
                f"expected a list of sentences (strings), got {type(sentences).__name__}; "
                'send {"inputs": ["sentence 1", "sentence 2", ...]}'
            )
        if not sentences:
            raise EmptyRequestError(
                "the request has no sentences (an empty list); send at least one: "
                '{"inputs": ["A man rides a bike."]}'
            )
        n = len(sentences)
        if n > self.max_request_sentences:
            raise RequestTooLargeError(
                f"the request has {n} sentences; this model translates at most "
                f"{self.max_request_sentences} sentences per request "
                f"(serving.max_request_sentences). Split it into "
                f"{-(-n // self.max_request_sentences)} or more requests of at most "
                f"{self.max_request_sentences} sentences each."
            )
        for i, text in enumerate(sentences):
            if not isinstance(text, str):
                kind = "null" if text is None else type(text).__name__
                raise InvalidRequestError(
                    f"input {i} is {kind}, not a string; send each sentence as a JSON string: "
                    '{"inputs": ["sentence 1", "sentence 2", ...]}'
                )
        chars = sum(len(s) for s in sentences)
        if chars > self.max_request_chars:
            raise RequestTooLargeError(
                f"the request has {chars} characters in its {n} sentences; this model "
                f"translates at most {self.max_request_chars} characters per request "
                f"(serving.max_request_chars). Split it into requests of at most "
                f"{self.max_request_chars} characters (and {self.max_request_sentences} "
                "sentences) each."
            )
        splits, ids = self.split(sentences)
        if ids is None:
            ids = self.tokenizer.encode([s for split in splits for s in split.sentences])
        tokens = sum(len(seq) for seq in ids)
        if tokens > self.max_request_tokens:
            raise RequestTooLargeError(
                f"the request has {tokens} sentencepiece tokens in its {n} sentences; this "
                f"model decodes at most {self.max_request_tokens} tokens per request "
                f"(serving.max_request_tokens; text without spaces, digits and rare scripts "
                "take more tokens per character). Split it into requests of fewer sentences."
            )
        return splits, ids

    def __call__(self, sentences: Sequence[str]) -> list[str]:
        """Translate ``sentences`` (list of str, the inputs) → one str per input, input order:
        each input's sentences translated and joined with its own separators (:class:`Split`).

        Raises:
            InputTooLongError: a sentence exceeds ``max_input_chars`` or ``max_input_tokens``;
                nothing is decoded then.
            InvalidTextError: an input holds a lone surrogate; nothing is decoded then.
        """
        splits, _ = self.split(list(sentences))
        return [t.translation for t in self._translations(splits)]

    def align(self, sentences: Sequence[str]) -> list[Translation]:
        """Translate ``sentences`` like :meth:`__call__`, with each sentence's cross attention
        over its source, every decoder layer and head (:attr:`Translation.alignments`).

        The weights come from the export's ``attention.pt``: the model run once more on its own
        output (teacher forcing; step by step for a recurrent decoder), which by causality are
        the weights it had while it chose each token. One sentence at a time, so a sentence's
        weights do not depend on its batch-mates.

        Raises:
            InputTooLongError, InvalidTextError: as :meth:`__call__`; nothing is decoded then.
            FileNotFoundError: the export predates alignments (no ``attention.pt``); names the
                command that exports it again.
            NoAttentionError: the model has no attention (seq2seq); nothing is decoded then.
        """
        splits, _ = self.split(list(sentences))
        return self._translations(splits, alignments=True)

    def serve(
        self,
        sentences: Sequence[str],
        alignments: bool = False,
        engine: str | None = None,
        details: bool = False,
        beam_size: int | None = None,
    ) -> list[str] | list[dict]:
        """One request of the served model: :meth:`checked_request`, then translate like
        :meth:`__call__` (in a batch with other requests when :attr:`batcher` is set, the
        served model's: :mod:`attnlab.serving.batching`) with ``engine`` (default: this
        translator's) and ``beam_size``
        (default: this translator's; 1 is greedy, and gives exactly what a
        ``Translator(..., beam_size=1)`` gives; the caller checks its bounds,
        :func:`attnlab.serving.signature.check_beam_size`). With ``details`` each answer is
        :meth:`Translation.as_json` (the sentences the input was cut into, each with its
        translation); with ``alignments``, that and each sentence's :meth:`Alignment.as_json`.

        Raises:
            UnknownEngineError: ``engine`` is not in this export; nothing is decoded then.
            InvalidRequestError (EmptyRequestError, RequestTooLargeError), InputTooLongError:
                as :meth:`check_request`; nothing is decoded then.
            FileNotFoundError, NoAttentionError: as :meth:`align` (the latter an
                InvalidRequestError: HTTP 400 from the served model).
            DeadlineExceededError: batched, the request waited :attr:`request_timeout_s`
                before its batch began; it was not decoded.
        """
        engine = self.check_engine(engine or self.engine)
        splits, ids = self.checked_request(sentences)
        if self.batcher is not None and not alignments:
            beam = self.beam_size if beam_size is None else int(beam_size)
            tokens = sum(len(seq) for seq in ids)
            translations = self.batcher.submit((engine, beam), (splits, ids), tokens, self.request_timeout_s)
        else:
            translations = self._translations(
                splits, engine, alignments=alignments, beam_size=beam_size, ids=ids
            )
        if alignments or details:
            return [t.as_json() for t in translations]
        return [t.translation for t in translations]

    def decode_batch(self, key: tuple[str, int], requests: list) -> list[list[Translation]]:
        """Checked requests ``[(splits, ids), ...]`` (:meth:`checked_request`'s) translated as
        one decoding batch with ``key`` = (engine, beam_size); one list of
        :class:`Translation` per request, as :meth:`serve` alone gives it (the decoder is batch
        invariant). :class:`attnlab.serving.batching.RequestBatcher` calls it."""
        engine, beam_size = key
        splits = [split for request_splits, _ in requests for split in request_splits]
        ids = [seq for _, request_ids in requests for seq in request_ids]
        # one decoding batch, however many sentences: the batcher's token budget bounds them
        flat = self._translations(splits, engine, beam_size=beam_size, ids=ids, batch_size=max(1, len(ids)))
        out, start = [], 0
        for request_splits, _ in requests:
            out.append(flat[start : start + len(request_splits)])
            start += len(request_splits)
        return out

    def _translations(
        self,
        splits: list[Split],
        engine: str | None = None,
        alignments: bool = False,
        beam_size: int | None = None,
        ids: list[list[int]] | None = None,
        batch_size: int | None = None,
    ) -> list[Translation]:
        """The checked inputs' sentences translated together with ``engine``, ``beam_size`` and
        ``batch_size`` (defaults: this translator's), then joined per input; with ``alignments``
        each sentence's :class:`Alignment` too. ``ids``: the sentences' token ids when the caller
        has them (not encoded again)."""
        sentences = [s for split in splits for s in split.sentences]
        if alignments:
            aligned = self._align(sentences, engine, beam_size)
            flat = [a.translation for a in aligned]
        else:
            aligned, flat = None, self._decode(sentences, engine, beam_size, ids, batch_size)
        out, start = [], 0
        for split in splits:
            stop = start + len(split.sentences)
            out.append(
                Translation(
                    split.join(flat[start:stop]),
                    split.sentences,
                    flat[start:stop],
                    None if aligned is None else aligned[start:stop],
                )
            )
            start = stop
        return out

    def _translate(
        self,
        sentences: list[str],
        engine: str | None = None,
        beam_size: int | None = None,
        ids: list[list[int]] | None = None,
        batch_size: int | None = None,
    ) -> list[list[int]]:
        """Output ids of checked sentences with ``engine`` and ``beam_size`` (defaults: this
        translator's); those without text give [] undecoded
        (:func:`attnlab.inference.decoding.translate` skips them). ``ids``: the sentences'
        source ids (``tokenizer.encode``), reused by the torch engine; ``batch_size``: sentences
        decoded together (default :attr:`batch_size`)."""
        engine = engine or self.engine
        beam_size = self.beam_size if beam_size is None else int(beam_size)
        batch_size = self.batch_size if batch_size is None else int(batch_size)
        if engine == "torch":
            return translate(
                self.init_state,
                self.step,
                self.tokenizer if ids is None else _PreEncoded(self.tokenizer, sentences, ids),
                sentences,
                batch_size=batch_size,
                beam_size=beam_size,
                alpha=self.alpha,
            )
        if engine not in self._ctranslate2:  # loaded once, on first use
            from attnlab.export.ctranslate2 import CTranslate2Translator

            quantization = {v: k for k, v in CTRANSLATE2_ENGINES.items()}[engine]
            # torch's thread count when the engine is first used: the served model's match
            # (attnlab.serving.threads), else the caller's
            self._ctranslate2[engine] = CTranslate2Translator(
                self.export_dir / "ctranslate2" / quantization,
                self.tokenizer,
                intra_threads=torch.get_num_threads(),
            )
        return self._ctranslate2[engine].translate(
            sentences, beam_size=beam_size, alpha=self.alpha, batch_size=batch_size
        )

    def _decode(
        self,
        sentences: list[str],
        engine: str | None = None,
        beam_size: int | None = None,
        ids: list[list[int]] | None = None,
        batch_size: int | None = None,
    ) -> list[str]:
        """Translate checked sentences (:meth:`_translate`), detokenized."""
        decoded = self._translate(sentences, engine, beam_size, ids, batch_size)
        return [self.tokenizer.decode(out) for out in decoded]

    def _cross_attention(self):
        """The export's attention function and its ``config.json`` entry, loaded once."""
        if getattr(self, "_attention", None) is None:
            if "cross_attention" in self.config and self.config["cross_attention"] is None:
                raise NoAttentionError(
                    f"model {self.config.get('model', '')!r} has no attention, so there are no "
                    "alignments to show; translate without alignments (or use model=bahdanau or "
                    "model=transformer)"
                )
            runtime = self.config.get("runtime") or {}
            file = runtime.get("files", {}).get("attention", "attention.pt")
            if not (self.export_dir / file).exists() or "cross_attention" not in self.config:
                raise MissingFileError(
                    f"{self.export_dir / file} not found: this export predates alignments. Export "
                    f"it again with `python src/export.py model={self.config.get('model', '<name>')}` "
                    "(or `dvc repro`)"
                )
            self._attention = (
                _load_function(self.export_dir, runtime, "attention"),
                self.config["cross_attention"],
            )
        return self._attention

    @torch.no_grad()
    def _align(
        self, sentences: list[str], engine: str | None = None, beam_size: int | None = None
    ) -> list[Alignment]:
        """:meth:`align` of checked sentences, translated with ``engine``; the weights are
        always the torch model's, on the tokens the engine printed."""
        attention, spec = self._cross_attention()
        out = []
        for sentence, ids in zip(sentences, self._translate(sentences, engine, beam_size)):
            src, valid = self.tokenizer.encode_sources([sentence])
            if not bool(decodable([sentence], valid)[0]):  # translate() did not decode it
                out.append(
                    Alignment("", [], [], spec["kind"], torch.zeros(spec["layers"], spec["heads"], 0, 0))
                )
                continue
            tgt_in = torch.tensor([[BOS_ID] + ids], dtype=torch.long)
            if spec["mode"] == "teacher_forced":
                weights = attention(src, valid, tgt_in)[0]  # (L, H, T, S)
            else:  # a recurrent decoder's attention, one output token at a time
                state, rows = self.init_state(src, valid), []
                for t in range(tgt_in.shape[1]):
                    w, _, *state = attention(tgt_in[:, : t + 1], *state)
                    rows.append(w[0])  # (1, S)
                weights = torch.cat(rows)[None, None]  # (1, 1, T, S)
            piece = self.tokenizer.source_id_to_piece
            out.append(
                Alignment(
                    self.tokenizer.decode(ids),
                    [piece(int(i)) for i in src[0]],
                    [self.tokenizer.id_to_piece(i) for i in ids + [EOS_ID]],
                    spec["kind"],
                    weights.float(),
                )
            )
        return out
