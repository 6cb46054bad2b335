"""Translate with an exported model (models/<model>/): torch + sentencepiece, no checkpoint.

    python src/translate.py model=transformer +text="A man's dog runs, and [jumps]."
    python src/translate.py model=transformer +text="A dog." +text="Two girls sing."
    printf 'A dog runs.\nTwo girls sing.\n' | python src/translate.py model=bahdanau
    python src/translate.py model=transformer model.decoding.beam_size=1 +text="…"   # greedy

Sentences reach the model verbatim. Each ``+text=…`` argument (also ``text=…``,
``++text=…``) is one sentence: everything after its first ``=`` exactly as the shell
passed it, taken out of the command line before Hydra reads it, so quotes,
apostrophes, ``=``, commas, brackets, ``true``, ``null``, numbers and leading dashes are
text, never Hydra syntax or types. Without any, sentences are read from stdin, one a
line. All other arguments are Hydra overrides (settings). One line out per sentence
in; a sentence with nothing to translate (empty, spaces, invisible characters) gives an
empty line; a sentence longer than the export's limit (config.json →
serving.max_input_chars) is an error, as in the served model.
"""
import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.export.translator import Translator

TEXT_ARGUMENT = re.compile(r"\+{0,2}text=", re.DOTALL)
_sentences: list[str] = []  # the +text=… arguments of this command, verbatim


def take_sentences(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split a command line into (Hydra overrides, sentences): every ``[+|++]text=<sentence>``
    argument is a sentence, verbatim (the rest of the argument after ``text=``)."""
    overrides, sentences = [], []
    for arg in argv:
        m = TEXT_ARGUMENT.match(arg)
        (sentences.append(arg[m.end():]) if m else overrides.append(arg))
    return overrides, sentences


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    dec = cfg.model.decoding  # the same beam settings as evaluate
    translator = Translator(Path(cfg.paths.models) / cfg.model.name,
                            beam_size=dec.beam_size, alpha=dec.alpha)
    sentences = _sentences or [line.rstrip("\r\n") for line in sys.stdin]
    for line in translator(sentences):
        print(line)


if __name__ == "__main__":
    sys.argv[1:], _sentences = take_sentences(sys.argv[1:])
    main()
