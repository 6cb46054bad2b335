"""The attention-free seq2seq (D2L 10.7 (zh 9.7)): its GRU by hand, one fixed context, the
decoding interface, its config, and train → evaluate → export → translate on the tiny corpus."""

import inspect
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from attnlab.data.tokenizer import BOS_ID, PAD_ID, load_sentencepiece
from attnlab.export.trace import export_translation
from attnlab.inference.decoding import greedy_decode, translate
from attnlab.models.bahdanau import Bahdanau
from attnlab.models.seq2seq import Seq2Seq
from attnlab.serving.translator import InvalidRequestError, NoAttentionError, Translator, load_translator
from helpers.corpus_fixture import sentences
from helpers.tiny_train import ROOT, TINY, env, make_project

V, E, H = 30, 8, 16


def _net(num_layers=2, seed=0, cls=Seq2Seq):
    torch.manual_seed(seed)
    return cls(V, embed_size=E, num_hiddens=H, num_layers=num_layers, dropout=0.0).eval()


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 6), generator=g)
    valid = torch.tensor([6, 4, 2])
    src[torch.arange(6)[None, :] >= valid[:, None]] = PAD_ID
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, V, (3, 4), generator=g)], dim=1)
    return src, valid, tgt_in


def test_shapes_and_no_attention():
    net, (src, valid, tgt_in) = _net(), _batch()
    assert net(src, valid, tgt_in).shape == (3, 5, V)
    assert net.features(src, valid, tgt_in).shape == (3, 5, H)
    context, hidden = net.init_state(src, valid)
    assert context.shape == (3, H) and hidden.shape == (3, 2, H)
    logits, context2, hidden2 = net.step(tgt_in[:, :1], context, hidden)
    assert logits.shape == (3, V) and hidden2.shape == (3, 2, H)
    assert context2 is context  # handed back untouched: beam search need not reorder it
    assert net.attention_maps(src, valid, tgt_in) == {} and net.attention_layers() == {}
    assert net.kind == "seq2seq" and net.output_layer is net.dense


def _gru_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    """One GRU step by its equations (D2L 10.2 (zh 9.1); torch's gate order r, z, n)."""
    r_x, z_x, n_x = (x @ w_ih.T + b_ih).chunk(3, -1)
    r_h, z_h, n_h = (h @ w_hh.T + b_hh).chunk(3, -1)
    r, z = torch.sigmoid(r_x + r_h), torch.sigmoid(z_x + z_h)
    n = torch.tanh(n_x + r * n_h)
    return (1 - z) * n + z * h


def test_logits_equal_d2ls_decoder_written_out_by_hand():
    """Encoder: the GRU equations over each sentence's valid tokens; decoder: h_0 = the encoder's
    final state, input [embed(y_{t-1}); c] with c = that same state at every step, D2L's
    Seq2SeqDecoder."""
    net, (src, valid, tgt_in) = _net(num_layers=1), _batch()
    enc, dec = net.encoder, net.rnn
    p = lambda rnn: (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
    with torch.no_grad():
        expected = torch.zeros(3, 5, V)
        for i in range(3):
            h = torch.zeros(H)
            for j in range(int(valid[i])):
                h = _gru_cell(enc.embedding.weight[src[i, j]], h, *p(enc.rnn))
            c = h
            for t in range(5):
                h = _gru_cell(torch.cat([net.embedding.weight[tgt_in[i, t]], c]), h, *p(dec))
                expected[i, t] = net.dense.weight @ h + net.dense.bias
        torch.testing.assert_close(net(src, valid, tgt_in), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_step_after_init_state_reproduces_the_teacher_forced_logits(num_layers):
    net, (src, valid, tgt_in) = _net(num_layers), _batch()
    forced = net(src, valid, tgt_in)
    state = net.init_state(src, valid)
    for t in range(tgt_in.shape[1]):
        logits, *state = net.step(tgt_in[:, : t + 1], *state)
        torch.testing.assert_close(logits, forced[:, t], atol=1e-5, rtol=1e-5)


class _NoisyOutputs(nn.Module):
    """The encoder, with its per-token outputs replaced by noise everywhere but at each
    sentence's last valid token; its final state unchanged."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, src, valid_lens):
        outputs, state = self.encoder(src, valid_lens)
        noise = torch.randn(outputs.shape, generator=torch.Generator().manual_seed(5))
        last = torch.arange(src.shape[1])[None, :] == (valid_lens - 1)[:, None]  # (B, S)
        return torch.where(last[..., None], outputs, noise), state


@pytest.mark.parametrize("cls", [Seq2Seq, Bahdanau], ids=["seq2seq", "bahdanau"])
def test_the_decoder_sees_only_the_final_state_of_the_source(cls):
    """No per-step context: noise in the encoder states other than each sentence's last one
    changes nothing. Bahdanau, which attends over them, is the control."""
    net, (src, valid, tgt_in) = _net(cls=cls), _batch()
    before = net(src, valid, tgt_in)
    net.encoder = _NoisyOutputs(net.encoder)
    after = net(src, valid, tgt_in)
    if cls is Seq2Seq:
        assert torch.equal(before, after)
    else:
        assert (before - after).abs().max() > 1e-2


def test_a_sentence_alone_and_in_a_padded_batch_gives_the_same_logits_and_tokens():
    net, (src, valid, tgt_in) = _net(), _batch()
    batched = net(src, valid, tgt_in)
    tokens = greedy_decode(net.init_state, net.step, src, valid, max_len=8)
    for i in range(3):
        n = int(valid[i])
        alone = net(src[i : i + 1, :n], valid[i : i + 1], tgt_in[i : i + 1])
        torch.testing.assert_close(alone[0], batched[i], atol=1e-5, rtol=1e-5)
        one = greedy_decode(net.init_state, net.step, src[i : i + 1, :n], valid[i : i + 1], max_len=8)
        assert one[0].tolist() == tokens[i, : one.shape[1]].tolist()
    # the padded positions themselves carry no information: other pad ids, same logits
    other = src.clone()
    other[src == PAD_ID] = 7
    torch.testing.assert_close(net(other, valid, tgt_in), batched, atol=1e-6, rtol=1e-6)


def test_the_constructor_defaults_are_the_config_and_bahdanau_sizes(monkeypatch):
    from test_config import _compose

    cfg = _compose(["model=seq2seq"], monkeypatch)
    bahdanau = _compose(["model=bahdanau"], monkeypatch)
    assert cfg.model.name == "seq2seq" and cfg.model.net._target_ == "attnlab.models.seq2seq.Seq2Seq"
    sizes = {k: v for k, v in cfg.model.net.items() if k != "_target_"}
    assert sizes == {"embed_size": 256, "num_hiddens": 256, "num_layers": 1, "dropout": 0.0}
    assert sizes == {k: bahdanau.model.net[k] for k in sizes}
    defaults = {k: p.default for k, p in inspect.signature(Seq2Seq).parameters.items() if k in sizes}
    assert defaults == sizes
    assert cfg.model.task == bahdanau.model.task


def test_the_export_decodes_the_same_tokens_and_has_no_attention_function(tiny_spm, tmp_path):
    sp = load_sentencepiece(tiny_spm)
    torch.manual_seed(1)
    net = Seq2Seq(sp.get_piece_size(), 8, 16, 2, 0.0).eval()
    export_translation(net, tiny_spm, tmp_path / "s2s", {"model": "seq2seq"})
    config = json.loads((tmp_path / "s2s/config.json").read_text())
    assert config["cross_attention"] is None
    assert config["engines"] == ["torch"]
    assert set(config["runtime"]["files"]) == {"init_state", "step"}
    assert not list((tmp_path / "s2s").glob("attention.*"))
    init_state, step, tok, _ = load_translator(tmp_path / "s2s")
    texts = [e for e, _, _ in sentences()[:7]] + ["", "A dog."]
    for beam in (1, 4):
        assert translate(init_state, step, tok, texts, 4, beam_size=beam) == translate(
            net.init_state, net.step, sp, texts, 4, beam_size=beam
        )
    translator = Translator(tmp_path / "s2s", beam_size=1)
    with pytest.raises(NoAttentionError, match="has no attention") as e:
        translator.align(["A dog."])
    assert isinstance(e.value, InvalidRequestError)  # the served model answers HTTP 400


@pytest.mark.e2e
def test_train_evaluate_export_and_translate_run_with_model_seq2seq(tmp_path):
    """``python src/train.py model=seq2seq`` a few steps on the tiny corpus (the tiny Transformer's
    settings, :data:`helpers.tiny_train.TINY`, with seq2seq's net), then the other stages."""
    root = make_project(tmp_path)
    settings = [a for a in TINY if a != "model=transformer" and not a.startswith("model.net.")]
    tiny = ["model.net.embed_size=16", "model.net.num_hiddens=32"]

    def stage(script, *args, stdin=None):
        done = subprocess.run(
            [sys.executable, f"src/{script}.py", "model=seq2seq", f"paths.root={root}", *args],
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=300,
            input=stdin,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    # the per-epoch maps and explorer asked for, as by default: a model without attention has none
    maps = "heatmaps.epoch_kinds=[encoder_decoder,alignment]"
    stage("train", *settings, *tiny, maps, "trainer.max_epochs=1", f"hydra.run.dir={root}/outputs/run")
    record = json.loads((root / "runs/seq2seq.json").read_text())
    assert record["run_id"] and (root / "checkpoints/seq2seq/best.ckpt").is_file()
    assert not (root / "plots/seq2seq/explorer.html").exists()
    assert not list((root / "plots/seq2seq").rglob("*.png"))
    common = ["data.vocab_size=150", "model.decoding.beam_size=2"]
    stage("evaluate", *common, f"hydra.run.dir={root}/outputs/eval")
    scores = json.loads((root / "metrics/seq2seq.json").read_text())
    assert scores["num_sentences"] == 4 and 0 <= scores["bleu"] <= 100
    stage(
        "export", *common, "export.ctranslate2=[]", "export.compile=false", f"hydra.run.dir={root}/outputs/x"
    )
    config = json.loads((root / "models/seq2seq/config.json").read_text())
    assert config["model"] == "seq2seq" and config["cross_attention"] is None
    out = stage("translate", *common, f"hydra.run.dir={root}/outputs/t", stdin="A dog sees a ball.\n\n")
    assert out.stdout.split("\n")[1:] == ["", ""]  # one line per sentence; nothing to translate → ""
