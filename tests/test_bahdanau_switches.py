"""Bahdanau's two attention switches (issue 32): ``model.net.scoring=additive|dot`` and
``model.net.attention=soft|hard_reinforce|hard_gumbel``.

The defaults are held against the model as it was before the switches: ``Bahdanau`` of commit
``BEFORE`` (read with ``git show``, run as a module), built with the same seed, must give
bitwise the same parameters, outputs, gradients and translations. The other settings are held
against values computed here by hand (the scaled dot-product softmax, the arg-max location) and
run through the real apps: train a few steps, evaluate, export.
"""

import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from attnlab.data.tokenizer import BOS_ID, PAD_ID, load_sentencepiece
from attnlab.export import ctranslate2 as ct2
from attnlab.export.trace import export_translation
from attnlab.inference.decoding import greedy_decode, translate
from attnlab.lit.translation import TranslationModule
from attnlab.loss import sequence_loss
from attnlab.models import build_net
from attnlab.models.bahdanau import Bahdanau
from attnlab.serving.translator import load_translator
from helpers.corpus_fixture import sentences
from helpers.tiny_train import copy_project, env, history, make_project, mlflow_client, runs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "65e40db3ae7a3e74666e7c5ff939647c3f6bb921"  # the last commit before the switches
V = 40
# The three settings that are not the default, covering each value of each switch once and
# each code path at inference (soft dot; hard additive; hard dot).
SWITCHED = [
    {"scoring": "dot", "attention": "soft"},
    {"scoring": "additive", "attention": "hard_reinforce"},
    {"scoring": "dot", "attention": "hard_gumbel"},
]
IDS = ["dot-soft", "additive-hard_reinforce", "dot-hard_gumbel"]
# Through the apps: two runs cover each value off its default (a training run costs a minute)
APP_SWITCHED = [
    {"scoring": "dot", "attention": "hard_reinforce"},
    {"scoring": "additive", "attention": "hard_gumbel"},
]
APP_IDS = ["dot-hard_reinforce", "additive-hard_gumbel"]


def _batch(seed=0, B=3, S=7, T=5):
    g = torch.Generator().manual_seed(seed)
    valid = torch.tensor([S, 4, 2][:B])
    src = torch.randint(4, V, (B, S), generator=g)
    src[torch.arange(S)[None] >= valid[:, None]] = PAD_ID
    tgt = torch.randint(4, V, (B, T + 1), generator=g)
    tgt[:, 0] = BOS_ID
    tgt[2, T - 1 :] = PAD_ID  # a shorter target
    return {"src": src, "src_valid_lens": valid, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


def _net(seed=0, **switches):
    torch.manual_seed(seed)
    return Bahdanau(V, 8, 16, 2, 0.1, **switches)


# --- the defaults: bitwise the model before the switches -------------------------------------


@pytest.fixture(scope="module")
def before_class():
    """``Bahdanau`` as it was at commit ``BEFORE``."""
    shown = subprocess.run(
        ["git", "show", f"{BEFORE}:src/attnlab/models/bahdanau.py"], cwd=ROOT, capture_output=True, text=True
    )
    if shown.returncode:
        pytest.skip(f"commit {BEFORE} is not in this clone (a shallow one?): {shown.stderr.strip()}")
    module = types.ModuleType("bahdanau_before_switches")
    exec(compile(shown.stdout, f"{BEFORE[:7]}:bahdanau.py", "exec"), module.__dict__)
    return module.Bahdanau


def _yaml_net(**sizes):
    """conf/model/bahdanau.yaml's ``net`` (switches at their defaults), sizes replaced."""
    net = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/bahdanau.yaml").net)
    return {**net, **sizes}


@pytest.mark.parametrize("how", ["constructor", "explicit defaults", "conf yaml"])
def test_the_default_switches_are_bitwise_the_model_before_them(before_class, how):
    sizes = {"embed_size": 8, "num_hiddens": 16, "num_layers": 2, "dropout": 0.1}
    torch.manual_seed(0)
    old = before_class(V, **sizes)
    torch.manual_seed(0)
    if how == "conf yaml":
        net = build_net(_yaml_net(**sizes), vocab_size=V, pad_id=PAD_ID)
    else:
        net = Bahdanau(
            V, **sizes, **({"scoring": "additive", "attention": "soft"} if how != "constructor" else {})
        )
    # the same parameters, created in the same order, with the same seeded values
    assert [(n, p.shape) for n, p in old.named_parameters()] == [
        (n, p.shape) for n, p in net.named_parameters()
    ]
    assert all(torch.equal(a, b) for a, b in zip(old.parameters(), net.parameters()))
    assert list(old.state_dict()) == list(net.state_dict())
    # training mode (dropout on, the same random stream): outputs and gradients
    batch = _batch()
    outs = []
    for model in (old, net):
        torch.manual_seed(7)
        loss = sequence_loss(model, batch, 0.1)
        loss.backward()
        outs.append((loss, model(batch["src"], batch["src_valid_lens"], batch["tgt_in"])))
    assert torch.equal(outs[0][0], outs[1][0])
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(old.parameters(), net.parameters()))
    # eval mode: teacher forcing, the alignment and greedy decoding step by step
    old.eval(), net.eval()
    args = (batch["src"], batch["src_valid_lens"], batch["tgt_in"])
    assert torch.equal(old(*args), net(*args))
    assert torch.equal(old.attention_maps(*args)["alignment"][0], net.attention_maps(*args)["alignment"][0])
    ys_old = greedy_decode(old.init_state, old.step, batch["src"], batch["src_valid_lens"], 6)
    assert torch.equal(
        ys_old, greedy_decode(net.init_state, net.step, batch["src"], batch["src_valid_lens"], 6)
    )
    for a, b in zip(old.init_state(*args[:2]), net.init_state(*args[:2])):
        assert torch.equal(a, b)


def test_the_yaml_documents_each_switch_and_the_defaults_agree():
    text = (ROOT / "conf/model/bahdanau.yaml").read_text()
    net = _yaml_net()
    for key in ("scoring", "attention", "reinforce_weight", "entropy_weight", "gumbel_tau"):
        (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:")]
        assert "#" in line, f"{key} has no comment"
    assert (net["scoring"], net["attention"]) == ("additive", "soft")


# --- scoring=dot: softmax(q kᵀ/√d) v, by hand --------------------------------------------------


@torch.no_grad()
def test_dot_scoring_is_the_scaled_dot_product_softmax_by_hand():
    """The first decoding step of ``scoring=dot``: the query is the decoder's initial top-layer
    state s₀ (the encoder's), the keys and values the encoder outputs h_j; α = softmax over the
    valid j of s₀·h_j/√16 (NumPy, float64), c = Σ α_j h_j, and the step's logits are the output
    layer of the GRU run on [c; embed(<bos>)] from s₀."""
    net = _net(scoring="dot").eval()
    assert not list(net.attention.parameters())  # dot scoring adds no weights
    batch = _batch()
    enc, valid, hidden, keys = net.init_state(batch["src"], batch["src_valid_lens"])
    assert torch.equal(keys, enc)
    q, h = hidden[:, -1].double().numpy(), enc.double().numpy()  # (B, 16), (B, S, 16)
    ys = torch.full((3, 1), BOS_ID)
    logits = net.step(ys, enc, valid, hidden, keys)[0]
    weights = net.attention.attention_weights[:, 0]  # (B, S), set by the step
    for b, n in enumerate(valid.tolist()):
        s = h[b, :n] @ q[b] / np.sqrt(16)
        alpha = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        np.testing.assert_allclose(weights[b, :n].numpy(), alpha, rtol=1e-5, atol=1e-7)
        assert weights[b, n:].eq(0).all()
        context = torch.tensor(alpha @ h[b, :n], dtype=torch.float32).view(1, 1, 16)
        x = torch.cat((context, net.embedding(ys[b : b + 1])), -1)
        out, _ = net.rnn(x, hidden[b : b + 1].transpose(0, 1).contiguous())
        torch.testing.assert_close(logits[b], net.dense(out[0, 0]), rtol=1e-5, atol=1e-6)


# --- hard attention: arg-max at inference, sampled in training -----------------------------------


def _scores_by_hand(net, query, keys):
    """(B, S) float64 scores of each switch's formula, from the module's weights."""
    q, k = query.double(), keys.double()
    if net.scoring == "dot":
        return torch.einsum("bh,bsh->bs", q, k) / np.sqrt(q.shape[-1])
    a = net.attention
    Wq, wv = a.W_q.weight.double(), a.w_v.weight.double()[0]
    return torch.tanh((q @ Wq.T)[:, None] + k) @ wv  # keys are W_k h_j already


@pytest.mark.parametrize("scoring", ["additive", "dot"])
@pytest.mark.parametrize("attention", ["hard_reinforce", "hard_gumbel"])
def test_hard_attention_takes_the_arg_max_location_at_inference(scoring, attention):
    """Greedy decoding step by step: at every step the attention is the one-hot of the arg-max
    over the valid keys of the scores (by hand), the context is that encoder state, and two
    runs decode the same tokens (no sampling in eval mode)."""
    net = _net(scoring=scoring, attention=attention).eval()
    batch = _batch(seed=1)
    state = net.init_state(batch["src"], batch["src_valid_lens"])
    ys = torch.full((3, 1), BOS_ID)
    for _ in range(4):
        enc, valid, hidden, keys = state
        scores = _scores_by_hand(net, hidden[:, -1], keys)
        scores[torch.arange(enc.shape[1])[None] >= valid[:, None]] = -np.inf
        logits, *state = net.step(ys, *state)
        expected = torch.nn.functional.one_hot(scores.argmax(-1), enc.shape[1]).float()
        assert torch.equal(net.attention.attention_weights[:, 0], expected)
        ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], 1)
    again = greedy_decode(net.init_state, net.step, batch["src"], batch["src_valid_lens"], 6)
    assert torch.equal(
        again, greedy_decode(net.init_state, net.step, batch["src"], batch["src_valid_lens"], 6)
    )


@pytest.mark.parametrize("attention", ["hard_reinforce", "hard_gumbel"])
def test_training_attends_to_one_sampled_valid_location_repeatable_by_seed(attention):
    net = _net(attention=attention)
    batch = _batch()
    args = (batch["src"], batch["src_valid_lens"], batch["tgt_in"])
    torch.manual_seed(3)
    w = net.attention_maps(*args)["alignment"][0][:, 0]  # (B, T, S), training mode: sampled
    assert set(w.unique().tolist()) == {0.0, 1.0} and torch.equal(w.sum(-1), torch.ones(3, 5))
    for b, n in enumerate(batch["src_valid_lens"].tolist()):
        assert w[b, :, n:].eq(0).all()  # never padding
    torch.manual_seed(3)
    assert torch.equal(net.attention_maps(*args)["alignment"][0][:, 0], w)
    draws = {tuple(net.attention_maps(*args)["alignment"][0][0, 0].argmax(-1).tolist()) for _ in range(30)}
    assert len(draws) > 1  # sampled, not the arg-max


def _attention_grads(net, loss):
    net.zero_grad()
    loss.backward()
    return {n: p.grad for n, p in net.attention.named_parameters()}


def test_hard_reinforce_trains_the_scorer_only_through_its_surrogate():
    """Cross-entropy alone gives the scoring MLP no gradient (the sampled one-hot has none);
    the REINFORCE surrogate does; hard_gumbel's straight-through weights give it one directly."""
    batch = _batch()
    net = _net(attention="hard_reinforce")
    loss = sequence_loss(net, batch, 0.1)
    surrogate, metrics = net.score_function_loss(batch["tgt_out"])
    grads = _attention_grads(net, loss + 0 * surrogate)
    assert all(g is None or g.eq(0).all() for g in grads.values())
    loss = sequence_loss(net, batch, 0.1)
    surrogate, _ = net.score_function_loss(batch["tgt_out"])
    grads = _attention_grads(net, loss + surrogate)
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())
    assert set(metrics) == {
        "reinforce_reward",
        "reinforce_baseline",
        "attention_entropy",
        "reinforce_grad_var",
    }
    assert metrics["reinforce_reward"] < 0 and metrics["reinforce_grad_var"] >= 0
    assert net.score_function_loss(batch["tgt_out"]) is None  # the pass is consumed
    gumbel = _net(attention="hard_gumbel")
    grads = _attention_grads(gumbel, sequence_loss(gumbel, batch, 0.1))
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())


@pytest.mark.parametrize("switches", [{}, {"attention": "hard_gumbel"}, {"scoring": "dot"}])
def test_only_hard_reinforce_in_training_has_a_surrogate(switches):
    batch = _batch()
    net = _net(**switches)
    sequence_loss(net, batch, 0.1)
    assert net.score_function_loss(batch["tgt_out"]) is None
    reinforce = _net(attention="hard_reinforce").eval()
    sequence_loss(reinforce, batch, 0.1)
    assert reinforce.score_function_loss(batch["tgt_out"]) is None  # eval: arg-max, nothing sampled


def _module(**switches):
    net = {"_target_": "attnlab.models.bahdanau.Bahdanau", "embed_size": 8, "num_hiddens": 16, **switches}
    return TranslationModule(net, {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 1e-3}, V)


def test_the_training_step_adds_the_surrogate_for_hard_reinforce_and_nothing_otherwise():
    batch = _batch()
    with warnings.catch_warnings():  # self.log outside a Trainer warns and logs nothing
        warnings.simplefilter("ignore")
        for module in (
            _module(),
            _module(scoring="dot", attention="hard_gumbel"),
            TranslationModule({"_target_": "attnlab.models.transformer.Transformer", "d_model": 16}, {}, V),
        ):
            torch.manual_seed(2)
            step = module.training_step(batch, 0)
            torch.manual_seed(2)
            assert torch.equal(step, sequence_loss(module.net, batch, 0.1))
        module = _module(attention="hard_reinforce", reinforce_weight=0.5, entropy_weight=0.1)
        module.net.baseline.value.fill_(-20.0)
        torch.manual_seed(2)
        step = module.training_step(batch, 0)
        module.net.baseline.value.fill_(-20.0)
        torch.manual_seed(2)
        ce = sequence_loss(module.net, batch, 0.1)
        surrogate, _ = module.net.score_function_loss(batch["tgt_out"])
    assert torch.equal(step, ce + surrogate) and surrogate != 0


@pytest.mark.parametrize(
    "switches, message",
    [
        ({"scoring": "cosine"}, r"model.net.scoring='cosine' is not a scoring; choose one of additive, dot"),
        ({"attention": "hard"}, r"model.net.attention='hard' is not an attention; choose one of soft, hard_"),
        ({"entropy_weight": -0.1}, r"model.net.entropy_weight must be ≥ 0, got -0.1"),
        ({"gumbel_tau": 0.0}, r"model.net.gumbel_tau must be > 0, got 0.0"),
    ],
)
def test_a_bad_switch_is_refused_naming_it_and_the_choices(switches, message):
    with pytest.raises(ValueError, match=message):
        Bahdanau(V, **switches)


# --- export: every switch decodes the same as the checkpoint; CTranslate2 refuses ---------------


@pytest.mark.parametrize("switches", SWITCHED, ids=IDS)
def test_the_export_decodes_the_same_tokens_with_each_switch(switches, tiny_spm, tmp_path):
    sp = load_sentencepiece(tiny_spm)
    torch.manual_seed(1)
    net = Bahdanau(sp.get_piece_size(), 8, 16, 2, 0.0, **switches).eval()
    with warnings.catch_warnings():  # TorchScript's deprecation (Bahdanau's GRU stays on it)
        warnings.simplefilter("ignore", DeprecationWarning)
        export_translation(net, tiny_spm, tmp_path / "m", {"model": "bahdanau"})
    init_state, step, tok, _ = load_translator(tmp_path / "m")
    texts = [e for e, _, _ in sentences()[:7]] + ["A dog."]
    for beam in (1, 3):
        assert translate(init_state, step, tok, texts, 4, beam_size=beam) == translate(
            net.init_state, net.step, sp, texts, 4, beam_size=beam
        )
    with pytest.raises(TypeError, match="CTranslate2 cannot run attnlab's Bahdanau model"):
        ct2.export_ctranslate2(net, tiny_spm, tmp_path / "ct2")
    assert not ct2.supports(net)


# --- the real apps: train a few steps, evaluate, export ------------------------------------------

TINY = [
    "model=bahdanau",
    "device=cpu",
    "model.net.embed_size=16",
    "model.net.num_hiddens=32",
    "model.max_tokens=40",
    "data.vocab_size=150",
    "data.val_bleu_sentences=4",
    "trainer.enable_progress_bar=false",
    "trainer.max_epochs=1",
    "heatmaps.sentences=[0]",
    "heatmaps.epoch_kinds=[]",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("switches"))


def _app(script, root, switches, *extra, stage):
    overrides = [f"model.net.{k}={v}" for k, v in switches.items()]
    cmd = [sys.executable, f"src/{script}", *TINY, *overrides, f"paths.root={root}", *extra]
    cmd.append(f"hydra.run.dir={root}/outputs/{stage}")
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400, env=env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.e2e
@pytest.mark.parametrize("switches", APP_SWITCHED, ids=APP_IDS)
def test_each_switch_trains_evaluates_and_exports_through_the_apps(switches, corpus, tmp_path):
    root = copy_project(corpus, tmp_path / "project")  # its own checkpoints and MLflow store
    _app("train.py", root, switches, stage="train")
    (run,) = runs(mlflow_client(root))
    assert run.data.params["model/net/attention"] == switches["attention"]
    assert run.data.params["model/net/scoring"] == switches["scoring"]
    reinforce = {"reinforce_reward", "reinforce_baseline", "attention_entropy", "reinforce_grad_var"}
    if switches["attention"] == "hard_reinforce":
        assert reinforce <= set(run.data.metrics)
        [(_, var)] = history(mlflow_client(root), run.info.run_id, "reinforce_grad_var")  # one epoch
        assert var > 0
    else:
        assert not reinforce & set(run.data.metrics)
    _app("evaluate.py", root, switches, stage="evaluate")
    scores = json.loads((root / "metrics/bahdanau.json").read_text())
    assert scores["num_sentences"] == 4 and 0 <= scores["bleu"] <= 100
    _app("export.py", root, switches, stage="export")
    config = json.loads((root / "models/bahdanau/config.json").read_text())
    assert config["model_config"]["net"]["attention"] == switches["attention"]
    assert config["runtime"]["format"] == "torchscript" and config["engines"] == ["torch"]
    from attnlab.checkpoint import load_net
    from attnlab.data.corpora import read_lines

    net = load_net(root / "checkpoints/bahdanau/best.ckpt", expected_kind="bahdanau")
    assert (net.scoring, net.attention_kind) == (switches["scoring"], switches["attention"])
    init_state, step, tok, _ = load_translator(root / "models/bahdanau")
    sources = read_lines(root / "data/tokenized/multi30k-en-fr/test.src.txt")
    expected = translate(net.init_state, net.step, tok, sources, beam_size=5, alpha=1.0)
    assert translate(init_state, step, tok, sources, beam_size=5, alpha=1.0) == expected
