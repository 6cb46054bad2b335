"""Models: Nadaraya–Watson by hand, seq2seq shapes, causality, decoding, export equivalence."""

import json
import logging
import math
import warnings

import pytest
import torch

from attnlab.data.synthetic import synthetic_regression, true_function
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.export.program import can_compile
from attnlab.export.trace import export_translation
from attnlab.inference.decoding import greedy_decode, translate
from attnlab.models.bahdanau import Bahdanau
from attnlab.models.nadaraya_watson import NadarayaWatson, leave_one_out
from attnlab.models.transformer import Transformer
from attnlab.serving.translator import load_translator
from helpers.corpus_fixture import sentences

# --- Nadaraya–Watson ----------------------------------------------------------


def test_nw_gaussian_weights_equal_softmax_of_squared_distance():
    x = torch.tensor([0.0, 1.0, 3.0])
    y = torch.tensor([1.0, 2.0, 4.0])
    nw = NadarayaWatson(parametric=False)
    out = nw(torch.tensor([1.5]), x, y)
    logits = [-((1.5 - xi) ** 2) / 2 for xi in (0.0, 1.0, 3.0)]
    z = sum(math.exp(v) for v in logits)
    w = [math.exp(v) / z for v in logits]
    assert nw.attention_weights[0].tolist() == pytest.approx(w, abs=1e-7)
    assert out.item() == pytest.approx(sum(wi * yi for wi, yi in zip(w, (1, 2, 4))), abs=1e-6)


def test_nw_parametric_width_scales_distance():
    nw = NadarayaWatson(parametric=True, init_w=2.0)
    nw(torch.tensor([0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]))
    # softmax([0, -(1·2)²/2]) = softmax([0, -2])
    assert nw.attention_weights[0, 1].item() == pytest.approx(1 / (1 + math.exp(2)), abs=1e-7)
    assert nw.w.requires_grad and not NadarayaWatson(parametric=False).w.requires_grad


def test_leave_one_out_excludes_each_query():
    x = torch.tensor([1.0, 2.0, 3.0])
    keys, values = leave_one_out(x, x * 10)
    assert keys.tolist() == [[2.0, 3.0], [1.0, 3.0], [1.0, 2.0]]
    assert values.tolist() == [[20.0, 30.0], [10.0, 30.0], [10.0, 20.0]]


def test_synthetic_data_is_d2ls():
    d = synthetic_regression(seed=3)
    assert d["x_train"].shape == (50,) and torch.all(d["x_train"][1:] >= d["x_train"][:-1])
    assert d["x_train"].min() >= 0 and d["x_train"].max() < 5
    assert d["x_test"].tolist() == pytest.approx([i * 0.1 for i in range(50)], abs=1e-6)
    assert torch.allclose(d["y_test"], 2 * torch.sin(d["x_test"]) + d["x_test"] ** 0.8)
    resid = d["y_train"] - true_function(d["x_train"])
    assert 0.3 < resid.std().item() < 0.7  # noise N(0, 0.5²)


# --- seq2seq models -----------------------------------------------------------


def _models(vocab=30):
    torch.manual_seed(0)
    return [
        Transformer(vocab, d_model=16, num_heads=2, num_layers=2, ffn_hidden=32, dropout=0.0),
        Bahdanau(vocab, embed_size=8, num_hiddens=16, num_layers=2, dropout=0.0),
    ]


@pytest.mark.parametrize("net", _models(), ids=["transformer", "bahdanau"])
def test_seq2seq_shapes_and_attention_maps(net):
    src = torch.randint(4, 30, (2, 5))
    valid = torch.tensor([5, 3])
    tgt_in = torch.randint(4, 30, (2, 4))
    assert net(src, valid, tgt_in).shape == (2, 4, 30)
    maps = net.eval().attention_maps(src, valid, tgt_in)
    for _kind, layers in maps.items():
        for w in layers:
            assert w.shape[0] == 2 and w.shape[-1] in (4, 5)
            assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
            if w.shape[-1] == 5:  # attention over the source never reaches sample 1's padding
                assert torch.all(w[1, ..., 3:] == 0)


@pytest.mark.parametrize("net", _models(), ids=["transformer", "bahdanau"])
def test_decoder_is_causal(net):
    net.eval()
    src, valid = torch.randint(4, 30, (1, 5)), torch.tensor([5])
    a = torch.tensor([[BOS_ID, 7, 8, 9]])
    b = torch.tensor([[BOS_ID, 7, 20, 21]])
    la, lb = net(src, valid, a), net(src, valid, b)
    assert torch.allclose(la[:, :2], lb[:, :2], atol=1e-6)
    assert not torch.allclose(la[:, 2:], lb[:, 2:])


@pytest.mark.parametrize("net", _models(), ids=["transformer", "bahdanau"])
def test_greedy_step_matches_teacher_forcing(net):
    """Each greedy token is the arg-max of a teacher-forced pass over the decoded prefix."""
    net.eval()
    src, valid = torch.randint(4, 30, (3, 6)), torch.tensor([6, 4, 2])
    ys = greedy_decode(net.init_state, net.step, src, valid, max_len=5)
    prefix = torch.cat([torch.full((3, 1), BOS_ID), ys[:, :-1]], dim=1)
    tf = net(src, valid, prefix).argmax(-1)
    for i in range(3):
        out = ys[i].tolist()
        out = out[: out.index(EOS_ID) + 1] if EOS_ID in out else out  # a random model may emit <bos>
        assert tf[i, : len(out)].tolist() == out


def test_greedy_pads_after_eos():
    class Fixed:
        """Emits 5, then <eos> for sample 0; 6 forever for sample 1 (its state: which sample a
        row is, so each row's logits come from its own row, as decoding requires)."""

        def init_state(self, src, valid):
            return (torch.arange(src.shape[0]),)

        def step(self, ys, sample):
            logits = torch.zeros(ys.shape[0], 10)
            t = ys.shape[1]
            logits[sample == 0, 5 if t == 1 else EOS_ID] = 1
            logits[sample == 1, 6] = 1
            return logits, sample

    f = Fixed()
    ys = greedy_decode(
        f.init_state, f.step, torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 3]), max_len=4
    )
    assert ys.tolist() == [[5, EOS_ID, PAD_ID, PAD_ID], [6, 6, 6, 6]]


@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
def test_export_decodes_the_same_tokens(kind, tiny_spm, tmp_path):
    from attnlab.data.tokenizer import load_sentencepiece

    sp = load_sentencepiece(tiny_spm)
    V = sp.get_piece_size()
    torch.manual_seed(1)
    net = (Transformer(V, 16, 2, 2, 32, 0.0) if kind == "transformer" else Bahdanau(V, 8, 16, 2, 0.0)).eval()
    export_translation(net, tiny_spm, tmp_path / kind, {"model": kind})
    init_state, step, tok, cfg = load_translator(tmp_path / kind)
    assert cfg["model"] == kind and cfg["task"] == "translation"
    texts = [e for e, _, _ in sentences()[:7]] + ["", "A dog."]
    assert translate(init_state, step, tok, texts, batch_size=4) == translate(
        net.init_state, net.step, sp, texts, batch_size=4
    )


def _export_recording_warnings(net, spm, folder, **kwargs) -> tuple[dict, list]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_translation(net, spm, folder, {"model": type(net).__name__}, **kwargs)
    return json.loads((folder / "config.json").read_text())["runtime"], caught


def test_the_transformer_exports_with_torch_export_and_bahdanau_keeps_torchscript_saying_why(
    tiny_spm, tmp_path
):
    V = 120
    runtime, caught = _export_recording_warnings(
        Transformer(V, 16, 2, 2, 32, 0.0).eval(), tiny_spm, tmp_path / "t"
    )
    assert runtime == {
        "format": "torch.export",
        "compiled": {},
        "files": {"init_state": "init_state.pt2", "step": "step.pt2", "attention": "attention.pt2"},
    }
    assert not list((tmp_path / "t").glob("*.pt"))
    assert not [w for w in caught if "torch.jit" in str(w.message)]  # nothing deprecated is used
    # torch.export unrolls aten::gru over the example's source length (and cannot trace packed
    # sequences): Bahdanau stays on TorchScript, whose deprecation warning is not silenced.
    runtime, caught = _export_recording_warnings(Bahdanau(V, 8, 16, 2, 0.0).eval(), tiny_spm, tmp_path / "b")
    assert runtime["format"] == "torchscript" and runtime["why_torchscript"].startswith("torch.export: ")
    assert sorted(p.name for p in (tmp_path / "b").glob("*.pt")) == [
        "attention.pt",
        "init_state.pt",
        "step.pt",
    ]
    assert any(
        issubclass(w.category, DeprecationWarning) and "torch.jit.trace" in str(w.message) for w in caught
    )


@pytest.mark.skipif(not can_compile(), reason="AOTInductor builds target x86-64 with AVX2")
def test_the_aotinductor_step_decodes_the_checkpoints_tokens(tiny_spm, tmp_path, caplog):
    from attnlab.data.tokenizer import load_sentencepiece

    sp = load_sentencepiece(tiny_spm)
    torch.manual_seed(2)
    net = Transformer(sp.get_piece_size(), 16, 2, 2, 32, 0.0).eval()
    runtime, _ = _export_recording_warnings(net, tiny_spm, tmp_path / "t", compile=True)
    assert runtime["compiled"] == {"step": "step.aoti.pt2"} and runtime["isa"] == "avx2"
    with caplog.at_level(logging.WARNING):
        init_state, step, tok, _ = load_translator(tmp_path / "t")
    # torch compares the package's ISA (AVX2, on purpose) with this CPU's widest; no warning
    assert not [r for r in caplog.records if "mismatch" in r.getMessage()], caplog.text
    assert not isinstance(step, torch.nn.Module)  # the compiled package, not the program
    texts = [e for e, _, _ in sentences()[:12]] + ["", "A dog, «naïve» café."]
    for beam in (1, 4):
        assert translate(init_state, step, tok, texts, batch_size=5, beam_size=beam, alpha=1.0) == translate(
            net.init_state, net.step, sp, texts, batch_size=5, beam_size=beam, alpha=1.0
        )


def test_only_the_expected_isa_mismatch_is_hidden():
    """torch's record as _load_aoti makes it: the AVX2 package on an AVX-512 CPU is expected
    and dropped; a mismatch of another key or of an ISA the package was not built for shows."""
    from attnlab.export.program import ExpectedIsaMismatch

    def record(*args):
        return logging.LogRecord(
            "torch.export.pt2_archive._package",
            logging.WARNING,
            __file__,
            1,
            "Device information mismatch for %s: %s vs %s. This could cause "
            "some issues when loading the AOTInductor compiled artifacts.",
            args,
            None,
        )

    quiet = ExpectedIsaMismatch()
    assert quiet.filter(record("AOTI_CPU_ISA", "AVX512", "AVX2")) is False
    assert quiet.filter(record("AOTI_CPU_ISA", "AVX2", "AVX512")) is True
    assert quiet.filter(record("AOTI_DEVICE_KEY", "cpu", "cuda")) is True
    other = logging.LogRecord("x", logging.WARNING, __file__, 1, "something else %s", ("AVX2",), None)
    assert quiet.filter(other) is True


def test_load_translator_missing_folder_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="src/export.py"):
        load_translator(tmp_path / "nothing")


def test_load_net_rebuilds_a_checkpoint_without_lightning(tmp_path):
    from attnlab.checkpoint import CheckpointError, load_net

    torch.manual_seed(0)
    net = Transformer(30, 16, 2, 1, 32, 0.0).eval()
    hp = {
        "net": {
            "_target_": "attnlab.models.transformer.Transformer",
            "d_model": 16,
            "num_heads": 2,
            "num_layers": 1,
            "ffn_hidden": 32,
            "dropout": 0.0,
        },
        "vocab_size": 30,
    }
    torch.save(
        {"hyper_parameters": hp, "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}},
        tmp_path / "best.ckpt",
    )
    loaded = load_net(tmp_path / "best.ckpt", expected_kind="transformer")
    src, valid, tgt = torch.randint(4, 30, (2, 5)), torch.tensor([5, 2]), torch.randint(4, 30, (2, 3))
    assert torch.equal(loaded(src, valid, tgt), net(src, valid, tgt))
    with pytest.raises(CheckpointError, match="holds a transformer model, not bahdanau"):
        load_net(tmp_path / "best.ckpt", expected_kind="bahdanau")
    with pytest.raises(CheckpointError, match="not found"):
        load_net(tmp_path / "missing.ckpt")


def test_bf16_autocast_computes_the_loss_in_float32():
    """trainer.precision=bf16-mixed: matmuls run in bfloat16 under autocast, the loss stays float32."""
    from attnlab.lit.translation import TranslationModule

    torch.manual_seed(0)
    net_cfg = {
        "_target_": "attnlab.models.transformer.Transformer",
        "d_model": 16,
        "num_heads": 2,
        "num_layers": 1,
        "ffn_hidden": 32,
        "dropout": 0.0,
    }
    m = TranslationModule(net_cfg, {"_target_": "torch.optim.Adam", "_partial_": True}, vocab_size=30)
    batch = {
        "src": torch.randint(4, 30, (3, 5)),
        "src_valid_lens": torch.tensor([5, 4, 2]),
        "tgt_in": torch.randint(4, 30, (3, 4)),
        "tgt_out": torch.randint(4, 30, (3, 4)),
    }
    fp32 = m._loss(batch, 0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m.net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
        loss = m._loss(batch, 0.1)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert torch.isfinite(loss) and abs(loss.item() - fp32.item()) < 0.05 * fp32.item()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


# --- loading trusts nothing: only attnlab's model classes are built ------------------------
def _crafted_checkpoint(path, net_config):
    torch.save({"hyper_parameters": {"net": net_config, "vocab_size": 30}, "state_dict": {}}, path)
    return path


@pytest.mark.parametrize(
    "make_config",
    [
        lambda marker: {"_target_": "subprocess.call", "args": ["touch", str(marker)]},
        lambda marker: {
            "_target_": "attnlab.models.transformer.Transformer",
            "d_model": 16,
            "num_heads": {"_target_": "subprocess.call", "args": ["touch", str(marker)]},
        },
        lambda marker: {"_target_": "attnlab.models.transformer.Transformer", "_args_": [str(marker)]},
        lambda marker: ["subprocess.call", "touch", str(marker)],
    ],
    ids=["foreign-target", "nested-target", "hydra-special-key", "not-a-mapping"],
)
def test_a_crafted_checkpoint_is_refused_before_anything_it_names_runs(tmp_path, make_config):
    """A checkpoint from elsewhere can name any callable as its model: load_net and
    TranslationModule.load_from_checkpoint refuse it, naming it, and run nothing."""
    from attnlab.checkpoint import CheckpointError, load_net
    from attnlab.errors import ConfigError
    from attnlab.lit.translation import TranslationModule
    from attnlab.models import UnknownModelError

    marker = tmp_path / "pwned"
    ckpt = _crafted_checkpoint(tmp_path / "evil.ckpt", make_config(marker))
    with pytest.raises(CheckpointError, match="attnlab.models.transformer.Transformer") as e:
        load_net(ckpt)
    assert str(ckpt) in str(e.value)
    with pytest.raises(ConfigError, match="attnlab.models.transformer.Transformer") as e:  # the user's
        TranslationModule(
            make_config(marker), {"_target_": "torch.optim.Adam", "_partial_": True}, vocab_size=30
        )
    assert isinstance(e.value.__cause__, UnknownModelError)
    assert not marker.exists()


def test_a_checkpoint_naming_an_unknown_module_imports_nothing(tmp_path):
    import subprocess
    import sys

    ckpt = _crafted_checkpoint(tmp_path / "evil.ckpt", {"_target_": "attnlab_evil_payload.boom"})
    code = (
        "import sys\nfrom attnlab.checkpoint import CheckpointError, load_net\n"
        f"try:\n    load_net({str(ckpt)!r})\nexcept CheckpointError as e:\n    print(e)\n"
        "print('imported' if 'attnlab_evil_payload' in sys.modules else 'not imported')"
    )
    (tmp_path / "attnlab_evil_payload.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').close()\nboom = print\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
        check=True,
    )
    assert "_target_='attnlab_evil_payload.boom', which is not one of attnlab's models" in out.stdout
    assert out.stdout.strip().endswith("not imported") and not (tmp_path / "ran").exists()
