"""Alignments of your own sentences (issue 15, part 4): ``Translator.align``, the served model's
``alignments`` param and ``src/translate.py +show_attention=true``.

The reference is the checkpoint itself, eager: its own decoding (:func:`attnlab.inference.decoding.translate`)
and its own teacher-forced pass (``net.attention_maps``), never the export's code path.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.analysis.explorer import decode_weights, read_data
from attnlab.data.special_tokens import BOS_ID, EOS_ID
from attnlab.data.tokenizer import load_sentencepiece, train_sentencepiece
from attnlab.export.trace import export_translation
from attnlab.inference.decoding import translate
from attnlab.models.bahdanau import Bahdanau
from attnlab.models.transformer import Transformer
from attnlab.serving.translator import Translator
from helpers.serve_harness import PAIRS, learned_transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [PAIRS[0][0], "", 'A dog, "Rex", jumps — naïve café ½.', PAIRS[5][0], "  \u200b "]
DECODING = {"beam_size": 3, "alpha": 1.0}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """model name → (eager net, export folder, tokenizer): a trained 1-layer Transformer, a
    random 2-layer 4-head one and a random Bahdanau, each exported with beam 3."""
    tmp = tmp_path_factory.mktemp("alignments")
    sp = train_sentencepiece([s for pair in PAIRS for s in pair], tmp / "spm", vocab_size=120)
    torch.manual_seed(1)
    nets = {
        "transformer": learned_transformer(sp),
        "transformer_2x4": Transformer(sp.get_piece_size(), 32, 4, 2, 64, 0.0).eval(),
        "bahdanau": Bahdanau(sp.get_piece_size(), 24, 32).eval(),
    }
    tok = load_sentencepiece(tmp / "spm.model")
    return {
        name: (
            net,
            export_translation(net, tmp / "spm.model", tmp / name, {"model": name, "decoding": DECODING}, 80),
            tok,
        )
        for name, net in nets.items()
    }


def _reference(net, tok, sentence):
    """(output ids, (L, H, T, S) cross attention) of the eager checkpoint."""
    out = translate(net.init_state, net.step, tok, [sentence], **DECODING)[0]
    src, valid = tok.encode_sources([sentence])
    maps = net.attention_maps(src, valid, torch.tensor([[BOS_ID] + out]))
    kind = "encoder_decoder" if "encoder_decoder" in maps else "alignment"
    return out, kind, torch.stack(maps[kind], 1)[0]


@pytest.mark.parametrize("name", ["transformer", "transformer_2x4", "bahdanau"])
def test_alignment_rows_are_output_tokens_summing_to_one_and_equal_the_checkpoints_forward(exports, name):
    net, export_dir, tok = exports[name]
    translator = Translator(export_dir)
    translations = translator.align(SENTENCES)
    assert [t.translation for t in translations] == translator(SENTENCES)
    assert [t.sentences for t in translations] == [[s.strip()] if s.strip() else [] for s in SENTENCES]
    for t in translations:
        assert [a.translation for a in t.alignments] == t.translations
    for sentence, a in [(s, a) for t in translations for s, a in zip(t.sentences, t.alignments)]:
        if sentence.strip(" \u200b") == "":  # nothing to translate: nothing decoded, no rows
            assert a.translation == "" and a.target_tokens == [] and a.weights.shape[2:] == (0, 0)
            continue
        out, kind, expected = _reference(net, tok, sentence)
        assert a.kind == kind
        assert a.target_tokens == [tok.id_to_piece(i) for i in out + [EOS_ID]]  # one row per token
        src, _ = tok.encode_sources([sentence])
        assert a.source_tokens == [tok.id_to_piece(int(i)) for i in src[0]]
        L, H = (
            (len(net.decoder_blocks), net.decoder_blocks[0].attention2.num_heads)
            if kind == "encoder_decoder"
            else (1, 1)
        )
        assert a.weights.shape == (L, H, len(out) + 1, src.shape[1])
        assert (a.weights >= 0).all()
        torch.testing.assert_close(a.weights.sum(-1), torch.ones(L, H, len(out) + 1), atol=1e-5, rtol=0)
        torch.testing.assert_close(a.weights, expected, atol=1e-6, rtol=0)


def test_a_sentence_aligns_the_same_alone_and_in_a_batch(exports):
    translator = Translator(exports["transformer_2x4"][1])
    together = [a for t in translator.align(SENTENCES) for a in t.alignments]
    for sentence, a in zip([s for s in SENTENCES if s.strip()], together):
        (alone,) = translator.align([sentence])[0].alignments
        assert alone.target_tokens == a.target_tokens
        assert torch.equal(alone.weights, a.weights)


def test_served_answer_is_json_with_the_last_layers_head_mean(exports):
    translator = Translator(exports["transformer_2x4"][1])
    answers = translator.serve(SENTENCES[:1], alignments=True)
    (a,) = translator.align(SENTENCES[:1])[0].alignments
    assert json.loads(json.dumps(answers)) == answers  # plain JSON
    (whole,) = answers
    (answer,) = whole["sentences"]  # one sentence: one entry, its source as sent
    assert whole["translation"] == answer["translation"] == a.translation
    assert answer["source"] == SENTENCES[0] and answer["attention_kind"] == "encoder_decoder"
    assert answer["target_tokens"] == a.target_tokens and answer["source_tokens"] == a.source_tokens
    torch.testing.assert_close(torch.tensor(answer["alignment"]), a.weights[-1].mean(0))
    torch.testing.assert_close(torch.tensor(answer["attention"]), a.weights)
    assert translator.serve(SENTENCES[:1]) == [a.translation]  # not asked: strings, as before


def test_an_export_without_attention_names_the_command_that_exports_it_again(exports, tmp_path):
    old = shutil.copytree(exports["transformer"][1], tmp_path / "old")
    config = json.loads((old / "config.json").read_text())
    (old / config["runtime"]["files"]["attention"]).unlink()
    translator = Translator(old)
    assert translator(SENTENCES[:1]) == Translator(exports["transformer"][1])(SENTENCES[:1])
    with pytest.raises(
        FileNotFoundError,
        match=r"attention.pt2 not found: this export predates "
        r"alignments.*python src/export.py model=transformer",
    ):
        translator.align(SENTENCES[:1])


def test_translate_py_show_attention_prints_the_translation_and_draws_its_attention(exports, tmp_path):
    _, export_dir, _ = exports["transformer"]  # trained: no near-tie for another thread count to flip
    shutil.copytree(export_dir, tmp_path / "models" / "transformer")
    sentences = [SENTENCES[0], "", SENTENCES[2]]
    run = subprocess.run(
        [
            sys.executable,
            "src/translate.py",
            "model=transformer",
            f"paths.root={tmp_path}",
            f"hydra.run.dir={tmp_path / 'out'}",
            *(f"+text={s}" for s in sentences),
            "+show_attention=true",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    translator = Translator(export_dir)
    alignments = translator.align(sentences)
    assert run.stdout.splitlines() == translator(sentences)
    folder = tmp_path / "out" / "attention"
    assert f"explorer: {folder / 'explorer.html'}" in run.stderr
    assert sorted(p.name for p in folder.glob("*.png")) == [
        f"sent{i}_encoder_decoder_layer1.png" for i in (0, 2)
    ]  # the 1-layer model
    data = read_data((folder / "explorer.html").read_text())
    (epoch,) = data["epochs"]
    assert [s["source"] for s in epoch["sentences"]] == [sentences[0], sentences[2]]
    for page, (a,) in zip(epoch["sentences"], [alignments[0].alignments, alignments[2].alignments]):
        kind = page["kinds"]["encoder_decoder"]
        assert kind["queries"] == a.target_tokens and kind["keys"] == a.source_tokens
        for layer, entry in enumerate(kind["layers"]):  # stored as uint16 fixed point
            assert abs(decode_weights(entry) - a.weights[layer].double().numpy()).max() < 1e-5
