"""src/translate.py's command line: `+text=` sentences are taken verbatim, the rest is Hydra's."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _translate_module():
    spec = importlib.util.spec_from_file_location("translate_app", ROOT / "src/translate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_text_arguments_are_sentences_verbatim_and_the_rest_are_overrides():
    take = _translate_module().take_sentences
    argv = [
        "model=transformer",
        "+text=A man's dog, [x] = true",
        "model.decoding.beam_size=1",
        "text=null",
        "++text=  -x  ",
        "+text=",
        "+text=+text=1e3",
        "+text=a\nb",
    ]
    assert take(argv) == (
        ["model=transformer", "model.decoding.beam_size=1"],
        ["A man's dog, [x] = true", "null", "  -x  ", "", "+text=1e3", "a\nb"],
    )
    assert take(["textual=1", "+texts=2", "model=nw"]) == (["textual=1", "+texts=2", "model=nw"], [])
