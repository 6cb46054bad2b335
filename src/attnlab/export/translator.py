"""The runtime of an export folder: load it, and translate text with it.

:func:`load_translator` needs only torch and sentencepiece; the decoding loops
are :mod:`attnlab.decoding`'s, the same ones evaluation uses, so an export
decodes exactly the tokens its checkpoint does. :class:`Translator` is the
text-in, text-out front end (``src/translate.py`` and the MLflow model of
:mod:`attnlab.serving` use it): the export's beam settings, its input limits
(``config.json`` → ``serving``: per sentence, and per request for the served model),
and "" → "". The folder is written by :func:`attnlab.export.trace.export_translation`.

This is the served model's runtime: keep its imports to torch, sentencepiece and
:mod:`attnlab.decoding`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from attnlab.decoding import translate_text

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
# 11-21 s, 4 token-dense × 500 characters (1,610 tokens, over the limit) 37-42 s. See README
# "Serving a model over HTTP".
DEFAULT_MAX_REQUEST_SENTENCES = 32
DEFAULT_MAX_REQUEST_CHARS = 4000
DEFAULT_MAX_REQUEST_TOKENS = 1000


def load_translator(export_dir: Path):
    """Load an export folder: (init_state, step, tokenizer, config), with torch and sentencepiece only.

    Raises:
        FileNotFoundError: if the folder is not a translation export (names the stage to run).
    """
    from attnlab.data.tokenizer import load_sentencepiece  # sentencepiece, with encode_sources

    d = Path(export_dir)
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found; export first with "
                                "`python src/export.py model=<name>` or `dvc repro`")
    config = json.loads(cfg_path.read_text())
    if not (d / "step.pt").exists():  # a regression export holds model.pt alone
        raise ValueError(f"{d} has no step.pt: it is not a translation model's export (config.json "
                         f"says task {config.get('task')!r}); pass one, e.g. models/transformer, or "
                         "export it again with `python src/export.py model=<name>`")
    init_state = torch.jit.load(str(d / "init_state.pt"), map_location="cpu")
    step = torch.jit.load(str(d / "step.pt"), map_location="cpu")
    tokenizer = load_sentencepiece(d / "spm.model")
    return init_state, step, tokenizer, config


class InputTooLongError(ValueError):
    """A sentence is longer than the export's input limit (``config.json`` → ``serving``)."""


class InvalidRequestError(ValueError):
    """A request to the served model is not a list of strings (:meth:`Translator.check_request`)."""


class RequestTooLargeError(InvalidRequestError):
    """A request to the served model holds more sentences, characters or tokens than its
    per-request limits (``config.json`` → ``serving``) allow."""


class EmptyRequestError(InvalidRequestError):
    """A request to the served model holds no sentence."""


def _first_over(lengths: list[int], limit: int, unit: str, rule: str) -> None:
    """Raise :class:`InputTooLongError` for the first length over ``limit``:
    "input <i> has <length> <unit> <limit> <rule>"."""
    for i, n in enumerate(lengths):
        if n > limit:
            raise InputTooLongError(f"input {i} has {n} {unit} {limit} {rule}")


class Translator:
    """An export folder as a text-in, text-out translator.

    Decodes with the export's ``decoding`` settings (``config.json`` → ``decoding``,
    else ``model_config.decoding``, else greedy) unless ``beam_size``/``alpha`` are
    given, through :func:`attnlab.decoding.translate_text`, so it returns exactly
    the strings that function returns for the non-empty sentences.
    A sentence with nothing to translate (empty, whitespace, control or invisible format
    characters alone: :func:`attnlab.decoding.has_text`) translates to "" without decoding.

    Args:
        export_dir: a folder written by :func:`attnlab.export.trace.export_translation`.
        beam_size, alpha: override the export's decoding settings (beam_size 1 is greedy).
        batch_size: sentences decoded together.
    Attributes:
        max_input_chars: longest accepted sentence in characters (Unicode code points).
        max_input_tokens: longest accepted sentence in sentencepiece tokens, or None.
        max_request_sentences, max_request_chars, max_request_tokens: most sentences,
            characters and tokens per request of the served model (:meth:`serve`).
        beam_size, alpha, config: the settings in use and the export's ``config.json``.
    Raises:
        FileNotFoundError, ValueError: as :func:`load_translator`.
    """

    def __init__(self, export_dir: Path, beam_size: int | None = None, alpha: float | None = None,
                 batch_size: int = 128):
        self.init_state, self.step, self.tokenizer, self.config = load_translator(export_dir)
        dec = self.config.get("decoding") or self.config.get("model_config", {}).get("decoding") or {}
        self.beam_size = int(beam_size if beam_size is not None else dec.get("beam_size", 1))
        self.alpha = float(alpha if alpha is not None else dec.get("alpha", 0.0))
        limits = self.config.get("serving") or {}  # exports older than the limit get the default
        self.max_input_chars = int(limits.get("max_input_chars") or DEFAULT_MAX_INPUT_CHARS)
        self.max_input_tokens = limits.get("max_input_tokens")
        self.max_request_sentences = int(limits.get("max_request_sentences")
                                         or DEFAULT_MAX_REQUEST_SENTENCES)
        self.max_request_chars = int(limits.get("max_request_chars") or DEFAULT_MAX_REQUEST_CHARS)
        self.max_request_tokens = int(limits.get("max_request_tokens") or DEFAULT_MAX_REQUEST_TOKENS)
        self.batch_size = batch_size

    def check_lengths(self, sentences: Sequence[str]) -> list[list[int]] | None:
        """Raise :class:`InputTooLongError` naming the first sentence over a limit (index from 0).

        Returns the sentences' token ids when the token limit needed them, else None.
        """
        _first_over([len(text) for text in sentences], self.max_input_chars,
                    "characters; this model translates at most", "characters per sentence "
                    "(max_input_chars). Split the text into sentences and send each as its own input.")
        if self.max_input_tokens is None:
            return None
        ids = self.tokenizer.encode(list(sentences))
        _first_over([len(seq) for seq in ids], self.max_input_tokens,
                    "sentencepiece tokens; this model encodes at most", "tokens per sentence "
                    "(max_input_tokens). Split the text into shorter sentences.")
        return ids

    def check_request(self, sentences: Sequence[str]) -> None:
        """Check one request of the served model against every limit, cheapest first.

        ``sentences`` must be a non-empty list of str; then at most
        ``max_request_sentences`` of them, ``max_request_chars`` characters together,
        each within :meth:`check_lengths`, and ``max_request_tokens`` sentencepiece
        tokens together. Nothing is decoded; the count and type checks run before any
        sentence is read, the token checks after the character checks.

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
                'send {"inputs": ["sentence 1", "sentence 2", ...]}')
        if not sentences:
            raise EmptyRequestError(
                "the request has no sentences (an empty list); send at least one: "
                '{"inputs": ["A man rides a bike."]}')
        n = len(sentences)
        if n > self.max_request_sentences:
            raise RequestTooLargeError(
                f"the request has {n} sentences; this model translates at most "
                f"{self.max_request_sentences} sentences per request "
                f"(serving.max_request_sentences). Split it into "
                f"{-(-n // self.max_request_sentences)} or more requests of at most "
                f"{self.max_request_sentences} sentences each.")
        for i, text in enumerate(sentences):
            if not isinstance(text, str):
                kind = "null" if text is None else type(text).__name__
                raise InvalidRequestError(
                    f"input {i} is {kind}, not a string; send each sentence as a JSON string: "
                    '{"inputs": ["sentence 1", "sentence 2", ...]}')
        chars = sum(len(s) for s in sentences)
        if chars > self.max_request_chars:
            raise RequestTooLargeError(
                f"the request has {chars} characters in its {n} sentences; this model "
                f"translates at most {self.max_request_chars} characters per request "
                f"(serving.max_request_chars). Split it into requests of at most "
                f"{self.max_request_chars} characters (and {self.max_request_sentences} "
                "sentences) each.")
        ids = self.check_lengths(sentences)
        if ids is None:
            ids = self.tokenizer.encode(list(sentences))
        tokens = sum(len(seq) for seq in ids)
        if tokens > self.max_request_tokens:
            raise RequestTooLargeError(
                f"the request has {tokens} sentencepiece tokens in its {n} sentences; this "
                f"model decodes at most {self.max_request_tokens} tokens per request "
                f"(serving.max_request_tokens; text without spaces, digits and rare scripts "
                "take more tokens per character). Split it into requests of fewer sentences.")

    def __call__(self, sentences: Sequence[str]) -> list[str]:
        """Translate ``sentences`` (list of str) → one str per sentence, input order.

        Raises:
            InputTooLongError: a sentence exceeds ``max_input_chars`` or ``max_input_tokens``;
                nothing is decoded then.
        """
        sentences = list(sentences)
        self.check_lengths(sentences)
        return self._decode(sentences)

    def serve(self, sentences: Sequence[str]) -> list[str]:
        """One request of the served model: :meth:`check_request`, then translate like :meth:`__call__`.

        Raises:
            InvalidRequestError (EmptyRequestError, RequestTooLargeError), InputTooLongError:
                as :meth:`check_request`; nothing is decoded then.
        """
        self.check_request(sentences)
        return self._decode(list(sentences))

    def _decode(self, sentences: list[str]) -> list[str]:
        """Translate checked sentences; those without text give "" undecoded
        (:func:`attnlab.decoding.translate` skips them)."""
        return translate_text(self.init_state, self.step, self.tokenizer, sentences,
                              batch_size=self.batch_size, beam_size=self.beam_size, alpha=self.alpha)
