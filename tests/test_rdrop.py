"""R-Drop (attnlab.loss.rdrop_loss, Liang et al. 2021): the symmetric KL by hand and against
torch.distributions, the loss against a reference built from the two halves of the doubled
pass, no KL without dropout, and the switch in a real tiny training run.

Reference for the loss: ``F.cross_entropy`` of each copy's logits and
``torch.distributions.kl_divergence`` of their categorical distributions, combined as the
paper's eq. 3 divided by 2.
"""

import copy
import math
import subprocess

import pytest
import torch
from torch.distributions import Categorical, kl_divergence
from torch.nn import functional as F

from attnlab.data.tokenizer import PAD_ID
from attnlab.errors import ConfigError
from attnlab.lit.translation import TranslationModule
from attnlab.loss import rdrop_loss, sequence_loss, symmetric_kl
from attnlab.models.transformer import Transformer
from helpers.tiny_train import ROOT, env, make_project, train, train_cmd

V = 17


def test_symmetric_kl_by_hand():
    # P = (0.5, 0.5), Q = (0.9, 0.1): KL(P‖Q) = 0.5 ln(5/9) + 0.5 ln 5 = 0.5108256,
    # KL(Q‖P) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.3680642
    p, q = torch.tensor([[0.5, 0.5]]).log(), torch.tensor([[0.9, 0.1]]).log()
    want = 0.5 * math.log(5 / 9) + 0.5 * math.log(5) + 0.9 * math.log(1.8) + 0.1 * math.log(0.2)
    assert symmetric_kl(p, q).item() == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx(0.8788898, abs=1e-6)
    assert symmetric_kl(p, p).item() == 0.0


def test_symmetric_kl_equals_torch_distributions():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 9, generator=g), torch.randn(6, 9, generator=g) * 2
    want = kl_divergence(Categorical(logits=a), Categorical(logits=b)) + kl_divergence(
        Categorical(logits=b), Categorical(logits=a)
    )
    torch.testing.assert_close(symmetric_kl(a.log_softmax(-1), b.log_softmax(-1)), want, rtol=1e-5, atol=1e-6)


def _batch():
    src = torch.tensor([[4, 5, 6, 2], [7, 8, 2, PAD_ID]])
    tgt_in = torch.tensor([[1, 9, 10, 11], [1, 12, PAD_ID, PAD_ID]])
    tgt_out = torch.tensor([[9, 10, 11, 2], [12, 2, PAD_ID, PAD_ID]])
    return {"src": src, "src_valid_lens": torch.tensor([4, 3]), "tgt_in": tgt_in, "tgt_out": tgt_out}


def _net(dropout: float) -> Transformer:
    torch.manual_seed(0)
    return Transformer(V, d_model=16, num_heads=2, num_layers=1, ffn_hidden=32, dropout=dropout)


def test_without_dropout_it_is_the_plain_cross_entropy():
    net, batch = _net(0.0), _batch()
    loss, ce = rdrop_loss(net, batch, 0.1, alpha=5.0)
    want = sequence_loss(net, batch, 0.1)
    torch.testing.assert_close(ce, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)  # both passes equal: KL 0


def test_with_dropout_the_loss_is_eq_3_halved_on_the_two_copies():
    net, batch = _net(0.3), _batch()
    torch.manual_seed(7)
    loss, ce = rdrop_loss(net, batch, 0.1, alpha=5.0)
    # the reference: the same doubled pass (same dropout draws), scored copy by copy
    torch.manual_seed(7)
    twice = {k: torch.cat([v, v]) for k, v in batch.items()}
    logits = net(twice["src"], twice["src_valid_lens"], twice["tgt_in"])  # (4, T, V)
    keep = batch["tgt_out"] != PAD_ID
    first, second = logits[:2][keep], logits[2:][keep]
    y = batch["tgt_out"][keep]
    ce1, ce2 = (F.cross_entropy(z, y, label_smoothing=0.1) for z in (first, second))
    kl = kl_divergence(Categorical(logits=first), Categorical(logits=second)) + kl_divergence(
        Categorical(logits=second), Categorical(logits=first)
    )
    assert kl.mean() > 1e-4  # two dropout masks: two different distributions
    torch.testing.assert_close(ce, (ce1 + ce2) / 2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, (ce1 + ce2) / 2 + 5.0 / 4 * kl.mean(), rtol=1e-5, atol=1e-6)
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_a_negative_alpha_is_refused():
    with pytest.raises(ConfigError, match="R-Drop needs alpha ≥ 0"):
        rdrop_loss(_net(0.1), _batch(), 0.1, alpha=-1.0)
    net = {"_target_": "attnlab.models.transformer.Transformer", "d_model": 8, "num_heads": 2}
    with pytest.raises(ConfigError, match=r"model.rdrop_alpha=-0.5 must be ≥ 0 \(0 trains without R-Drop\)"):
        TranslationModule(net, {"_target_": "torch.optim.Adam", "_partial_": True}, V, rdrop_alpha=-0.5)


@pytest.mark.e2e  # a real training run in a subprocess, as the files of conftest.E2E_FILES
def test_a_tiny_run_trains_with_r_drop(tmp_path):
    """``+model.rdrop_alpha`` reaches the module and its checkpoint; a negative one stops the
    run before training, naming the fix."""
    root = make_project(tmp_path)
    done = train(root, "trainer.max_epochs=1", "+model.rdrop_alpha=5")
    assert done.returncode == 0, done.stderr[-3000:]
    ckpt = torch.load(root / "checkpoints/transformer/best.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["rdrop_alpha"] == 5
    refused = subprocess.run(
        train_cmd(root, "+model.rdrop_alpha=-1"), cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=env(),
    )  # fmt: skip
    assert refused.returncode != 0
    assert "model.rdrop_alpha=-1 must be ≥ 0" in refused.stderr


def test_hard_reinforce_attention_scores_both_copies():
    """Bahdanau with sampled attention: the R-Drop pass sampled locations for the doubled batch,
    and the REINFORCE surrogate of that pass takes the doubled ``tgt_out`` (as training_step
    passes it)."""
    from attnlab.models.bahdanau import Bahdanau

    torch.manual_seed(0)
    net = Bahdanau(V, 8, 8, num_layers=2, dropout=0.2, attention="hard_reinforce").train()
    batch = _batch()
    rdrop_loss(net, batch, 0.1, alpha=5.0)
    twice = torch.cat([batch["tgt_out"], batch["tgt_out"]])
    surrogate, metrics = net.score_function_loss(twice)
    assert torch.isfinite(surrogate) and metrics
    assert net.score_function_loss(twice) is None  # the pass is consumed


OPTIMIZER = {"_target_": "torch.optim.Adam", "_partial_": True}
TRANSFORMER = {"_target_": "attnlab.models.transformer.Transformer", "d_model": 16, "num_heads": 2,
               "num_layers": 1, "ffn_hidden": 32, "dropout": 0.3}  # fmt: skip


def _module(net: dict, alpha: float) -> TranslationModule:
    torch.manual_seed(0)
    module = TranslationModule(net, OPTIMIZER, V, label_smoothing=0.1, rdrop_alpha=alpha).train()
    module.log = lambda *args, **kwargs: None  # no Trainer to log to: the step's value is the test
    return module


def test_training_step_minimizes_the_r_drop_loss():
    """With α > 0 the step's objective is :func:`rdrop_loss` of the batch (same dropout draws), not
    the cross-entropy; with α = 0 it is the plain :func:`sequence_loss`."""
    batch = _batch()
    module = _module(TRANSFORMER, 5.0)
    torch.manual_seed(3)
    objective = module.training_step(batch, 0)
    torch.manual_seed(3)
    want, ce = rdrop_loss(module.net, batch, 0.1, 5.0)
    assert torch.equal(objective, want) and want > ce
    plain = _module(TRANSFORMER, 0.0)
    torch.manual_seed(3)
    objective = plain.training_step(batch, 0)
    torch.manual_seed(3)
    assert torch.equal(objective, sequence_loss(plain.net, batch, 0.1))


def test_training_step_adds_the_surrogate_of_both_copies_for_hard_attention():
    """Bahdanau with sampled attention: the objective is the R-Drop loss plus the REINFORCE
    surrogate of the doubled pass (``tgt_out`` stacked on itself)."""
    net = {"_target_": "attnlab.models.bahdanau.Bahdanau", "embed_size": 8, "num_hiddens": 8,
           "num_layers": 2, "dropout": 0.2, "attention": "hard_reinforce"}  # fmt: skip
    batch = _batch()
    module = _module(net, 5.0)
    reference = copy.deepcopy(module)  # the same weights and REINFORCE baseline
    torch.manual_seed(4)
    objective = module.training_step(batch, 0)
    torch.manual_seed(4)
    loss, _ = rdrop_loss(reference.net, batch, 0.1, 5.0)
    surrogate, _ = reference.net.score_function_loss(torch.cat([batch["tgt_out"], batch["tgt_out"]]))
    torch.testing.assert_close(objective, loss + surrogate, rtol=0, atol=0)


def test_r_drop_without_dropout_is_refused():
    with pytest.raises(ConfigError, match=r"model.rdrop_alpha=5.0 needs dropout: with model.net.dropout=0 "
                       r"the two passes agree .* set model.net.dropout \(e.g. 0.2"):  # fmt: skip
        TranslationModule({**TRANSFORMER, "dropout": 0.0}, OPTIMIZER, V, rdrop_alpha=5.0)
    # sampled attention is random without dropout: allowed
    hard = {"_target_": "attnlab.models.bahdanau.Bahdanau", "embed_size": 8, "num_hiddens": 8,
            "dropout": 0.0, "attention": "hard_reinforce"}  # fmt: skip
    assert TranslationModule(hard, OPTIMIZER, V, rdrop_alpha=5.0).hparams.rdrop_alpha == 5.0
