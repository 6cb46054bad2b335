"""src/translate.py's command line: `+text=` sentences are taken verbatim, the rest is Hydra's."""

import importlib.util
import os
from pathlib import Path

import pytest

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


def test_stdin_is_read_as_text_mode_reads_it_and_a_byte_that_is_not_utf8_names_its_line():
    read = _translate_module().read_sentences
    assert read(b"") == []
    assert read(b"A dog.") == ["A dog."]
    assert read(b"A dog.\n\nTwo cats.\n") == ["A dog.", "", "Two cats."]
    assert read(b"A\r\nB\rC\n") == ["A", "B", "C"]  # Windows and old Mac line ends
    assert read("\ufeffUn caf\u00e9.\n".encode()) == ["Un caf\u00e9."]  # a byte-order mark dropped
    assert read('\u2028 \u00a0\t"x"\n'.encode()) == ['\u2028 \u00a0\t"x"']  # else verbatim
    with pytest.raises(SystemExit) as e:
        read(b"A dog runs.\nA caf\xe9 is open.\n")  # Latin-1
    assert str(e.value).startswith(
        "translate: stdin line 2 is not UTF-8: byte 0xe9 at byte 6 of the line (invalid continuation "
        "byte); convert it to UTF-8 first, e.g. `iconv -f latin1 -t utf-8 in.txt"
    ), e.value


def test_a_text_argument_that_is_not_utf8_is_refused_naming_it():
    check = _translate_module().check_arguments
    check(["A dog.", "Un café, \u2028 😀"])  # text: accepted
    undecodable = os.fsdecode(b"A caf\xe9.")  # what Python makes of a Latin-1 argument
    with pytest.raises(
        SystemExit, match=r"^translate: \+text argument 2 is not UTF-8: byte 0xe9 at character 6;"
    ):
        check(["A dog.", undecodable])
    with pytest.raises(
        SystemExit, match=r"argument 1 is not UTF-8: U\+D800, a lone surrogate at character 3;"
    ):
        check(["A \ud800 dog."])
