"""Translate with an exported model (models/<model>/): torch + sentencepiece, no checkpoint.

    python src/translate.py model=transformer +text="A man's dog runs, and [jumps]."
    python src/translate.py model=transformer +text="A dog." +text="Two girls sing."
    printf 'A dog runs.\nTwo girls sing.\n' | python src/translate.py model=bahdanau
    python src/translate.py model=transformer model.decoding.beam_size=1 +text="…"   # greedy
    python src/translate.py model=transformer +text="A dog runs." +show_attention=true
    python src/translate.py model=transformer engine=ctranslate2_int8 < sentences.txt  # CTranslate2

Sentences reach the model verbatim. Each ``+text=…`` argument (also ``text=…``,
``++text=…``) is one sentence: everything after its first ``=`` exactly as the shell
passed it, taken out of the command line before Hydra reads it, so quotes,
apostrophes, ``=``, commas, brackets, ``true``, ``null``, numbers and leading dashes are
text, never Hydra syntax or types. Without any, sentences are read from stdin, one a
line (UTF-8; a byte that is not is an error naming its line). All other arguments are Hydra
overrides (settings). An input holding several sentences ("A dog runs. Two cats sit.", or a
``+text`` with line breaks) is cut into sentences (:mod:`attnlab.serving.sentences`), each is
translated, and the translations are joined with the input's own spaces and line breaks. One
line out per line in (a ``+text`` keeps its own line breaks); a sentence with nothing to translate
(empty, spaces, invisible characters) gives an empty line; a sentence longer than the
export's limit (config.json → serving.max_input_chars), or one that is not text (a lone
surrogate), is an error, as in the served model.

``+show_attention=true`` also draws the cross attention of every translation printed (the
Transformer's encoder–decoder attention, every layer and head; Bahdanau's alignment): one PNG
per sentence and layer (``sent<i>``: the sentences in order from 0, a line's several sentences
one after another, a line without any counted as one) and one explorer page for all of them,
in the run's Hydra output folder (``outputs/<date>/<time>/attention/``); where is said on
stderr, so stdout stays one line per line in.
"""

import codecs
import os
import re
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from attnlab.console.errors import user_errors
from attnlab.errors import ConfigError
from attnlab.serving.translator import Alignment, Translator

TEXT_ARGUMENT = re.compile(r"\+{0,2}text=", re.DOTALL)
_sentences: list[str] = []  # the +text=… arguments of this command, verbatim


def take_sentences(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split a command line into (Hydra overrides, sentences): every ``[+|++]text=<sentence>``
    argument is a sentence, verbatim (the rest of the argument after ``text=``)."""
    overrides, sentences = [], []
    for arg in argv:
        m = TEXT_ARGUMENT.match(arg)
        (sentences.append(arg[m.end() :]) if m else overrides.append(arg))
    return overrides, sentences


_TO_UTF8 = "convert it to UTF-8 first, e.g. `iconv -f latin1 -t utf-8 in.txt | python src/translate.py …`"


def read_sentences(raw: bytes) -> list[str]:
    """stdin's bytes → one sentence a line, as text mode reads them (``\\n``, ``\\r\\n`` or ``\\r``
    ends a line; no sentence after a final line break), decoded as UTF-8, a leading
    byte-order mark dropped.

    Raises:
        SystemExit: a byte that is not UTF-8 (names the line, the byte and the fix).
    """
    raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line, start = raw.count(b"\n", 0, e.start) + 1, raw.rfind(b"\n", 0, e.start) + 1
        raise SystemExit(
            f"translate: stdin line {line} is not UTF-8: byte {raw[e.start]:#04x} at byte "
            f"{e.start - start + 1} of the line ({e.reason}); {_TO_UTF8}"
        ) from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def check_arguments(sentences: list[str]) -> None:
    """Refuse a ``+text=`` argument that was not UTF-8 (Python keeps such bytes as lone
    surrogates): SystemExit naming the argument and the byte."""
    for i, text in enumerate(sentences, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            c = ord(text[e.start])
            escaped = 0xDC80 <= c <= 0xDCFF  # a byte Python could not decode, kept as U+DC80+byte
            what = f"byte {os.fsencode(chr(c))[0]:#04x}" if escaped else f"U+{c:04X}, a lone surrogate"
            raise SystemExit(
                f"translate: +text argument {i} is not UTF-8: {what} at character {e.start + 1}; {_TO_UTF8}"
            ) from None


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@user_errors("translate")  # a missing or damaged export, a sentence over the limit: one line
def main(cfg: DictConfig) -> None:
    dec = cfg.model.decoding  # the same beam settings as evaluate
    if dec.get("bf16"):
        raise ConfigError(
            "model.decoding.bf16=true is evaluate's (the checkpoint's); an "
            "export decodes in float32 on the torch engine, or use engine=ctranslate2_int8 "
            "for speed"
        )
    if dec.get("ensemble"):
        raise ConfigError(
            "model.decoding.ensemble is evaluate's: translate decodes the one exported model; "
            "score an ensemble with `python src/evaluate.py '+model.decoding.ensemble=[...]'`"
        )
    translator = Translator(
        Path(cfg.paths.models) / cfg.model.name,
        beam_size=dec.beam_size,
        alpha=dec.alpha,
        engine=cfg.engine,
    )
    check_arguments(_sentences)
    sentences = _sentences or read_sentences(sys.stdin.buffer.read())
    if not cfg.get("show_attention"):
        for line in translator(sentences):
            print(line)
        return
    from attnlab.analysis.alignments import show_alignments  # matplotlib and bokeh: only when asked

    alignments = translator.align(sentences)  # the seq2seq baseline: NoAttentionError
    for t in alignments:
        print(t.translation)
    out_dir = Path(HydraConfig.get().runtime.output_dir) / "attention"
    # one figure per sentence, numbered in order; a line without a sentence keeps its number
    nothing = Alignment("", [], [], "", torch.zeros(0, 0, 0, 0))
    pieces = [
        p
        for t, s in zip(alignments, sentences)
        for p in list(zip(t.sentences, t.alignments)) or [(s, nothing)]
    ]
    pngs, page = show_alignments(
        [s for s, _ in pieces], [a for _, a in pieces], out_dir, f"{cfg.model.name}: your sentences"
    )
    if page is None:
        print("attention: nothing was translated, so there is nothing to draw", file=sys.stderr)
    else:
        print(
            f"attention: {len(pngs)} PNG in {out_dir} (sent<i>_<kind>_layer<l>.png), explorer: {page}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.argv[1:], _sentences = take_sentences(sys.argv[1:])
    main()
