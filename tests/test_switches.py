"""The Transformer's switches (issue "Answer why by experiment"): ``model.net.scaled``,
``model.net.positional_encoding`` and ``model.net.norm_first``.

- At their defaults they build the model of the commit before them (post-norm, sinusoid, 1/√d,
  as D2L), bit for bit: parameters, outputs, gradients, decoding steps and attention maps.
- ``scaled=false`` is softmax(Q Kᵀ) V, checked against the formula in float64 and against
  ``torch.nn.MultiheadAttention`` with W_q multiplied by √d (same scores, scaled back).
- ``positional_encoding=none`` makes the encoder permutation-equivariant; the sinusoid does not.
- ``positional_encoding=learned`` is a trained parameter, saved in the state dict.
- ``norm_first=true`` is ``torch.nn.TransformerEncoderLayer(norm_first=True)`` per block.
- Every combination decodes incrementally (KV cache) exactly as it scores teacher-forced.
- A config with every switch off its default trains, evaluates and exports (torch.export and
  CTranslate2) through the real stage scripts; CTranslate2 scores each switch as attnlab does
  (tests/test_ctranslate2.py).
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab.models.attention import DotProductAttention, MultiHeadAttention
from attnlab.models.positional_encoding import (
    LearnedPositionalEncoding,
    NoPositionalEncoding,
    PositionalEncoding,
    build_positional_encoding,
)
from attnlab.models.transformer import Transformer, TransformerEncoderBlock

V, D, H, FF = 40, 16, 4, 24
SWITCHES = [
    dict(scaled=s, positional_encoding=p, norm_first=n)
    for s, p, n in itertools.product((True, False), ("sinusoidal", "learned", "none"), (False, True))
]


def _net(seed=0, **switches) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(V, D, H, 2, FF, dropout=0.0, tie_embeddings=True, max_len=32, **switches).eval()


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=g)
    valid = torch.tensor([7, 4, 2])
    src[1, 4:] = src[2, 2:] = 0
    tgt_in = torch.randint(4, V, (3, 5), generator=g)
    return src, valid, tgt_in


BEFORE = "65e40db"  # the last commit before the switches
# Builds a seeded Transformer with the package on sys.path[0] and saves what it computes: the
# state, a training step's outputs and gradients (dropout on), eval outputs, a decoding step, maps.
_PROBE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from attnlab.models.transformer import Transformer
torch.manual_seed(0)
net = Transformer(50, 16, 4, 2, 24, dropout=0.1, max_len=32)
g = torch.Generator().manual_seed(1)
src, tgt = torch.randint(4, 50, (3, 7), generator=g), torch.randint(4, 50, (3, 5), generator=g)
valid = torch.tensor([7, 4, 2])
torch.manual_seed(5)
out_train = net.train()(src, valid, tgt)
out_train.sum().backward()
net.eval()
with torch.no_grad():
    out = net(src, valid, tgt)
    step, *_ = net.step(tgt[:, :1], *net.init_state(src, valid))
    maps = net.attention_maps(src, valid, tgt)
torch.save({"state": net.state_dict(), "train": out_train.detach(), "out": out, "step": step, "maps": maps,
            "grads": [p.grad for p in net.parameters()]}, sys.argv[2])
"""


def _probe(src_dir: Path, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(src_dir), str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def test_the_defaults_build_the_model_before_the_switches_bitwise(tmp_path):
    """The same seeded Transformer, built by this tree and by the package at ``BEFORE`` (exported
    with ``git archive``): equal state, training outputs and gradients, eval outputs, decoding
    step and attention maps, bit for bit."""
    ROOT = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "cat-file", "-e", f"{BEFORE}^{{commit}}"], cwd=ROOT).returncode:
        pytest.skip(f"commit {BEFORE} is not in this clone (a shallow checkout)")
    archive = subprocess.run(["git", "archive", BEFORE, "src"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    before, now = _probe(tmp_path / "src", tmp_path / "before.pt"), _probe(ROOT / "src", tmp_path / "now.pt")
    assert list(before["state"]) == list(now["state"])
    assert all(torch.equal(a, b) for a, b in zip(before["state"].values(), now["state"].values()))
    for key in ("train", "out", "step"):
        assert torch.equal(before[key], now[key]), key
    assert all(torch.equal(a, b) for a, b in zip(before["grads"], now["grads"], strict=True))
    for kind, layers in before["maps"].items():
        assert all(torch.equal(a, b) for a, b in zip(layers, now["maps"][kind], strict=True)), kind
    # and naming the defaults changes nothing
    plain, explicit = _net(), _net(scaled=True, positional_encoding="sinusoidal", norm_first=False)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), explicit.state_dict().values()))
    assert type(plain.pos_encoding) is PositionalEncoding and "pos_encoding.P" not in plain.state_dict()
    assert isinstance(plain.encoder_norm, nn.Identity) and isinstance(plain.decoder_norm, nn.Identity)


def test_unscaled_dot_product_is_softmax_of_raw_scores():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64), None
    v = torch.randn(2, 5, 4, dtype=torch.float64)
    valid = torch.tensor([5, 2])
    out = DotProductAttention(scaled=False)(q, k, v, valid)
    for b in range(2):
        n = int(valid[b])
        weights = torch.softmax(q[b] @ k[b, :n].T, dim=-1)  # no 1/√d
        torch.testing.assert_close(out[b], weights @ v[b, :n], rtol=1e-12, atol=1e-12)
    scaled = DotProductAttention()(q, k, v, valid)
    assert not torch.allclose(out, scaled)  # the switch changes the weights


@pytest.mark.parametrize("need_weights", [True, False])
def test_unscaled_multihead_equals_torch_mha_with_queries_times_sqrt_d(need_weights):
    torch.manual_seed(0)
    ours = MultiHeadAttention(D, H, bias=True, scaled=False).eval()
    theirs = nn.MultiheadAttention(D, H, bias=True, batch_first=True).eval()
    root_d = math.sqrt(D // H)  # torch divides q·k by √d; W_q·√d undoes it
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight * root_d, ours.W_k.weight, ours.W_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias * root_d, ours.W_k.bias, ours.W_v.bias]))
        theirs.out_proj.load_state_dict(ours.W_o.state_dict())
        q, kv = torch.randn(2, 3, D), torch.randn(2, 6, D)
        valid = torch.tensor([6, 3])
        padding = torch.arange(6)[None, :] >= valid[:, None]
        expected, _ = theirs(q, kv, kv, key_padding_mask=padding)
        got = ours(q, kv, kv, valid, need_weights=need_weights)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_without_positions_the_encoder_is_permutation_equivariant():
    src = torch.randint(4, V, (2, 7), generator=torch.Generator().manual_seed(3))
    valid = torch.tensor([7, 7])
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    for kind, equivariant in (("none", True), ("sinusoidal", False), ("learned", False)):
        net = _net(positional_encoding=kind)
        with torch.no_grad():
            permuted_out = net.encode(src[:, perm], valid)
            out_permuted = net.encode(src, valid)[:, perm]
        same = torch.allclose(permuted_out, out_permuted, atol=1e-5)
        assert same is equivariant, kind
    # the decoder, too, sees the source as a set: the logits do not change
    net, tgt_in = _net(positional_encoding="none"), torch.tensor([[1, 9, 12], [1, 5, 5]])
    with torch.no_grad():
        torch.testing.assert_close(
            net(src[:, perm], valid, tgt_in), net(src, valid, tgt_in), atol=1e-5, rtol=0
        )


def test_learned_positions_are_a_trained_saved_parameter():
    net = _net(positional_encoding="learned")
    assert isinstance(net.pos_encoding, LearnedPositionalEncoding)
    assert "pos_encoding.P" in net.state_dict() and net.pos_encoding.P.shape == (1, 32, D)
    assert net.pos_encoding.P.std().item() == pytest.approx(D**-0.5, rel=0.1)  # N(0, 1/√d) init
    src, valid, tgt_in = _batch()
    net.train()
    net(src, valid, tgt_in).sum().backward()
    grad = net.pos_encoding.P.grad
    assert grad is not None and grad[0, :7].abs().sum() > 0  # the positions used get gradient
    assert torch.all(grad[0, 7:] == 0)  # positions no sentence reaches get none
    assert isinstance(_net(positional_encoding="none").pos_encoding, NoPositionalEncoding)


def test_an_unknown_positional_encoding_names_the_choices():
    with pytest.raises(ValueError, match=r"positional_encoding='rotary'.*sinusoidal, learned, none"):
        build_positional_encoding("rotary", D)
    with pytest.raises(ValueError, match="model.net.positional_encoding"):
        _net(positional_encoding="rotary")


def test_pre_norm_block_equals_torch_encoder_layer_with_norm_first():
    torch.manual_seed(0)
    ours = TransformerEncoderBlock(D, H, FF, dropout=0.0, norm_first=True).eval()
    theirs = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=True).eval()
    with torch.no_grad():
        for ln in (ours.addnorm1.ln, ours.addnorm2.ln):  # non-trivial norms: a swap would show
            ln.weight.normal_()
            ln.bias.normal_()
        a = ours.attention
        theirs.self_attn.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        theirs.self_attn.in_proj_bias.zero_()
        theirs.self_attn.out_proj.weight.copy_(a.W_o.weight)
        theirs.self_attn.out_proj.bias.zero_()
        theirs.linear1.load_state_dict(ours.ffn.dense1.state_dict())
        theirs.linear2.load_state_dict(ours.ffn.dense2.state_dict())
        theirs.norm1.load_state_dict(ours.addnorm1.ln.state_dict())
        theirs.norm2.load_state_dict(ours.addnorm2.ln.state_dict())
        X, valid = torch.randn(3, 6, D), torch.tensor([6, 3, 1])
        padding = torch.arange(6)[None, :] >= valid[:, None]
        expected = theirs(X, src_key_padding_mask=padding)
        for need_weights in (False, True):
            torch.testing.assert_close(ours(X, valid, need_weights), expected, atol=1e-5, rtol=1e-5)
    # pre-norm ends each stack with a layer norm
    net = _net(norm_first=True)
    assert isinstance(net.encoder_norm, nn.LayerNorm) and isinstance(net.decoder_norm, nn.LayerNorm)


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_incremental_decoding_equals_teacher_forcing_for_every_switch(switches):
    net = _net(**switches)
    src, valid, tgt_in = _batch()
    with torch.no_grad():
        expected = net(src, valid, tgt_in)  # (B, T, V)
        state = net.init_state(src, valid)
        for t in range(tgt_in.shape[1]):
            logits, *state = net.step(tgt_in[:, : t + 1], *state)
            torch.testing.assert_close(logits, expected[:, t], atol=1e-5, rtol=1e-5)
        # a sentence alone scores as it does inside the padded batch
        alone = net(src[1:2, :4], valid[1:2], tgt_in[1:2])
    torch.testing.assert_close(alone, expected[1:2], atol=1e-5, rtol=1e-5)


@pytest.mark.e2e
def test_every_switch_off_its_default_trains_evaluates_and_exports(tmp_path):
    from helpers.tiny_train import ROOT, env, make_project, train

    root = make_project(tmp_path)
    switches = [
        "model.net.scaled=false",
        "model.net.positional_encoding=learned",
        "model.net.norm_first=true",
    ]
    done = train(root, "trainer.max_epochs=1", *switches)
    assert done.returncode == 0, done.stderr[-3000:]
    for script in ("evaluate", "export"):
        extra = ["export.compile=false", "export.ctranslate2=[float32]"] if script == "export" else []
        out = subprocess.run(
            [
                sys.executable,
                f"src/{script}.py",
                "model=transformer",
                "device=cpu",
                "model.net.d_model=32",
                "model.net.ffn_hidden=64",
                "data.vocab_size=150",
                f"paths.root={root}",
                f"hydra.run.dir={root}/outputs/{script}",
                *switches,
                *extra,
            ],
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    scores = json.loads((root / "metrics/transformer.json").read_text())
    assert scores["num_sentences"] == 4 and 0 <= scores["bleu"] <= 100
    config = json.loads((root / "models/transformer/config.json").read_text())
    assert (
        config["model_config"]["net"]["scaled"] is False
        and config["model_config"]["net"]["norm_first"] is True
    )
    assert config["model_config"]["net"]["positional_encoding"] == "learned"
    # the exported program translates as the checkpoint does (teacher-forced scores compared
    # by the export stage itself; here: the folder loads and answers)
    translated = subprocess.run(
        [sys.executable, "src/translate.py", "model=transformer", f"paths.root={root}", "+text=A dog runs."],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr[-3000:]
