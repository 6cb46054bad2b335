"""Several sentences in one input (issue 37, part 1): each is translated, none is dropped, and
the input's own separators and line breaks are kept.

The reference for a cut is written by hand; the reference for a translation is the same
translator given each sentence alone.
"""

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.data.tokenizer import train_sentencepiece
from attnlab.export.trace import export_translation
from attnlab.serving.sentences import Split, split_sentences
from attnlab.serving.translator import InputTooLongError, Translator
from helpers.serve_harness import PAIRS, learned_transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
A, B, C = PAIRS[0][0], PAIRS[5][0], PAIRS[9][0]  # single training sentences, each ending in "."


def _whole(split: Split) -> str:
    return "".join(g + s for g, s in zip(split.gaps, [*split.sentences, ""]))


@pytest.mark.parametrize(
    "text, sentences, gaps",
    [
        (
            "A man rides a bike.\nTwo dogs play in the snow.",
            ["A man rides a bike.", "Two dogs play in the snow."],
            ["", "\n", ""],
        ),
        ("A dog runs. Two cats sit.", ["A dog runs.", "Two cats sit."], ["", " ", ""]),
        ("Stop! Why? Go.", ["Stop!", "Why?", "Go."], ["", " ", " ", ""]),
        (
            "a line without a full stop\nanother one",
            ["a line without a full stop", "another one"],
            ["", "\n", ""],
        ),
        (
            "One.\r\nTwo.\rThree.\vFour.\fFive.",
            ["One.", "Two.", "Three.", "Four.", "Five."],
            ["", "\r\n", "\r", "\v", "\f", ""],
        ),
        ("x\x1cy\x1dz\x1ew", ["x", "y", "z", "w"], ["", "\x1c", "\x1d", "\x1e", ""]),
        (
            "One\x85Two\u2028Three\u2029Four",
            ["One", "Two", "Three", "Four"],
            ["", "\x85", "\u2028", "\u2029", ""],
        ),
        ("  First.   \n\n  Second.  ", ["First.", "Second."], ["  ", "   \n\n  ", "  "]),
        ("Dr. Smith paid $3.50 today. He left.", ["Dr. Smith paid $3.50 today.", "He left."], ["", " ", ""]),
        ('He said "Go." Then he left.', ['He said "Go."', "Then he left."], ["", " ", ""]),
        ("Wait… what? Yes.", ["Wait… what?", "Yes."], ["", " ", ""]),  # lower case: no new sentence
        ("", [], [""]),
        (" \n\t ", [], [" \n\t "]),
        ("A dog runs", ["A dog runs"], ["", ""]),
    ],
)
def test_an_input_is_cut_into_sentences_and_everything_between_them_is_kept(text, sentences, gaps):
    split = split_sentences(text, "en")
    assert (split.sentences, split.gaps) == (sentences, gaps)
    assert _whole(split) == text


def test_chinese_sentences_end_at_chinese_punctuation():
    split = split_sentences("我昨天买了三本书。你呢？好的！", "zh")
    assert split.sentences == ["我昨天买了三本书。", "你呢？", "好的！"]
    assert split.gaps == ["", "", "", ""]


def test_no_character_of_any_text_is_lost():
    """Random text from a palette of letters, spaces, every line break, sentence ends and odd
    Unicode: the cut always reassembles to the input, and no sentence holds a line break or
    starts or ends with whitespace."""
    palette = list("ab .!?。\n\r\v\f\t\"'") + [
        "\r\n",
        "\x85",
        "\u2028",
        "\u2029",
        "\u200b",
        "é",
        "…",
        "Dr.",
        " U.S. ",
    ]
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice(palette) for _ in range(rng.randrange(0, 40)))
        split = split_sentences(text, rng.choice(["en", "fr", "zh"]))
        assert _whole(split) == text
        assert len(split.gaps) == len(split.sentences) + 1
        for s in split.sentences:
            assert s and s == s.strip() and not any(b in s for b in "\n\r\v\f\x85\u2028\u2029")


def test_join_puts_the_translations_between_the_same_separators():
    split = split_sentences("  One.  Two.\n\nThree.\n", "en")
    assert split.join(["Un.", "Deux.", "Trois."]) == "  Un.  Deux.\n\nTrois.\n"
    assert split_sentences(" \n ", "en").join([]) == ""  # nothing to translate: "", as before
    with pytest.raises(ValueError, match="2 translations for 3 sentences"):
        split.join(["Un.", "Deux."])


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    """A trained 1-layer Transformer of the fixture pairs, exported with beam 3."""
    tmp = tmp_path_factory.mktemp("sentences")
    sp = train_sentencepiece([s for pair in PAIRS for s in pair], tmp / "spm", vocab_size=120)
    torch.manual_seed(1)
    net = learned_transformer(sp)
    config = {"model": "transformer", "decoding": {"beam_size": 3, "alpha": 1.0}, "data": {"src_lang": "en"}}
    return Translator(export_translation(net, tmp / "spm.model", tmp / "transformer", config, 80))


def test_every_sentence_of_an_input_is_translated_as_if_alone(translator):
    alone = dict(zip([A, B, C], translator([A, B, C])))
    assert all(alone.values())  # the reference translations are not empty
    inputs = [f"{A} {B}", f"{A}\n{B}\r\n\r\n{C}\n", f"  {C}  ", A, f"{A}\u2028{B}", ""]
    assert translator(inputs) == [
        f"{alone[A]} {alone[B]}",
        f"{alone[A]}\n{alone[B]}\r\n\r\n{alone[C]}\n",
        f"  {alone[C]}  ",
        alone[A],
        f"{alone[A]}\u2028{alone[B]}",
        "",
    ]
    details = translator.serve([f"{A} {B}", ""], details=True)
    assert details == [
        {
            "translation": f"{alone[A]} {alone[B]}",
            "sentences": [{"source": A, "translation": alone[A]}, {"source": B, "translation": alone[B]}],
        },
        {"translation": "", "sentences": []},
    ]
    assert translator.serve([f"{A} {B}"]) == [f"{alone[A]} {alone[B]}"]  # not asked: strings


def test_the_alignments_of_an_input_are_those_of_its_sentences_alone(translator):
    (whole,) = translator.align([f"{A} {B}"])
    assert whole.sentences == [A, B] and len(whole.alignments) == 2
    for sentence, got in zip([A, B], whole.alignments):
        ((want,),) = [t.alignments for t in translator.align([sentence])]
        assert got.target_tokens == want.target_tokens and torch.equal(got.weights, want.weights)
    (answer,) = translator.serve([f"{A} {B}"], alignments=True)
    assert [s["source"] for s in answer["sentences"]] == [A, B]
    assert [s["target_tokens"] for s in answer["sentences"]] == [a.target_tokens for a in whole.alignments]


def test_the_length_limit_is_per_sentence_and_names_it(translator):
    assert translator.max_input_chars == 80  # the fixture's export
    long = "a " * 40 + "dog."  # 84 characters
    assert len(translator([(A + " ") * 20])[0]) > 80  # 20 short sentences (399 characters): fine
    with pytest.raises(InputTooLongError, match=r"^input 1, sentence 1 has 84 characters; .* at most 80 "):
        translator([A, f"{A} {long} {B}"])


def test_translate_py_translates_every_sentence_of_a_line_and_of_a_text_argument(translator, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(translator.export_dir, models / "transformer")
    alone = dict(zip([A, B, C], translator([A, B, C])))
    run = [
        sys.executable,
        "src/translate.py",
        "model=transformer",
        f"paths.models={models}",
        f"hydra.run.dir={tmp_path}",
    ]
    stdin = subprocess.run(
        run, input=f"{A} {B}\n{C}\n", cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert stdin.returncode == 0, stdin.stderr[-2000:]
    assert stdin.stdout == f"{alone[A]} {alone[B]}\n{alone[C]}\n"
    text = subprocess.run([*run, f"+text={A}\n{B}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr[-2000:]
    assert text.stdout == f"{alone[A]}\n{alone[B]}\n"  # the argument's line break, kept


def test_no_multi30k_validation_or_test_sentence_is_cut(mirror_dir):
    """translate.py and the served model cut inputs; evaluate scores the corpus's lines whole.
    On the real corpora they agree: none of Multi30k's English val and test lines holds two
    sentences (3 of its 29,000 training lines do)."""
    import gzip

    for split, cut in [("val", 0), ("test_2016_flickr", 0), ("test_2017_flickr", 0), ("train", 3)]:
        lines = gzip.decompress((mirror_dir / f"multi30k/{split}.en.gz").read_bytes()).decode().splitlines()
        assert sum(len(split_sentences(line, "en").sentences) > 1 for line in lines) == cut, split
