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
line. All other arguments are Hydra overrides (settings). One line out per sentence
in; a sentence with nothing to translate (empty, spaces, invisible characters) gives an
empty line; a sentence longer than the export's limit (config.json →
serving.max_input_chars) is an error, as in the served model.

``+show_attention=true`` also draws the cross attention of every translation printed (the
Transformer's encoder–decoder attention, every layer and head; Bahdanau's alignment): one PNG
per sentence and layer and one explorer page for all of them, in the run's Hydra output
folder (``outputs/<date>/<time>/attention/``); where is said on stderr, so stdout stays one
line per sentence.
"""

import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from attnlab.serving.translator import NoAttentionError, Translator

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


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    dec = cfg.model.decoding  # the same beam settings as evaluate
    if dec.get("bf16"):
        raise SystemExit(
            "translate: model.decoding.bf16=true is evaluate's (the checkpoint's); an "
            "export decodes in float32 on the torch engine, or use engine=ctranslate2_int8 "
            "for speed"
        )
    try:
        translator = Translator(
            Path(cfg.paths.models) / cfg.model.name,
            beam_size=dec.beam_size,
            alpha=dec.alpha,
            engine=cfg.engine,
        )
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"translate: {e}") from None
    sentences = _sentences or [line.rstrip("\r\n") for line in sys.stdin]
    if not cfg.get("show_attention"):
        for line in translator(sentences):
            print(line)
        return
    from attnlab.analysis.alignments import show_alignments  # matplotlib and bokeh: only when asked

    try:
        alignments = translator.align(sentences)
    except NoAttentionError as e:  # model=seq2seq has no attention to show
        raise SystemExit(f"translate: {e}") from None
    for a in alignments:
        print(a.translation)
    out_dir = Path(HydraConfig.get().runtime.output_dir) / "attention"
    pngs, page = show_alignments(sentences, alignments, out_dir, f"{cfg.model.name}: your sentences")
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
