"""attnlab.loss: the chunked output layer + label-smoothed cross-entropy.

Reference: PyTorch's ``F.cross_entropy(F.linear(h, W, b), y, label_smoothing=ε)``
(and a by-hand float64 formula); values and gradients must agree.
"""

import math

import pytest
import torch
from torch.nn import functional as F

from attnlab.data.tokenizer import PAD_ID
from attnlab.loss import linear_cross_entropy, sequence_loss
from attnlab.models.bahdanau import Bahdanau
from attnlab.models.transformer import Transformer


def _grads(fn, *tensors):
    for t in tensors:
        t.grad = None
    loss = fn()
    loss.backward()
    return loss.detach(), [t.grad.clone() for t in tensors]


def test_by_hand_two_tokens_three_classes():
    # z = h Wᵀ with W = I: logits are the rows of h. ε = 0.3, V = 3.
    h = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    y = torch.tensor([1, 2])
    eps = 0.3
    lse0 = math.log(math.e + math.e**2 + 1.0)
    want0 = lse0 - 0.7 * 2.0 - 0.1 * 3.0  # −(1−ε) z_y − (ε/V) Σ z
    want1 = math.log(3.0)  # uniform logits: every target distribution costs log V
    got = linear_cross_entropy(h, torch.eye(3), None, y, eps)
    assert got.item() == pytest.approx((want0 + want1) / 2, abs=1e-6)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_equals_torch_cross_entropy_values_and_gradients(bias, eps, chunk):
    g = torch.Generator().manual_seed(chunk)
    h = torch.randn(50, 16, generator=g, requires_grad=True)
    w = torch.randn(40, 16, generator=g, requires_grad=True)
    b = torch.randn(40, generator=g, requires_grad=True) if bias else None
    y = torch.randint(0, 40, (50,), generator=g)
    params = [h, w] + ([b] if bias else [])
    ref, ref_grads = _grads(lambda: F.cross_entropy(F.linear(h, w, b), y, label_smoothing=eps), *params)
    got, got_grads = _grads(lambda: linear_cross_entropy(h, w, b, y, eps, chunk_size=chunk), *params)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    for a, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-7)


def test_gradients_match_a_float64_reference():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.tensor([0, 4, 2, 2, 1, 3])
    # the function computes in float32: its gradients, cast back, match float64 autograd to ~1e-6
    loss = linear_cross_entropy(h, w, b, y, 0.1, chunk_size=4)
    loss.backward()
    ref = F.cross_entropy(F.linear(h, w, b), y, label_smoothing=0.1)
    gh, gw, gb = torch.autograd.grad(ref, (h, w, b))
    torch.testing.assert_close(h.grad, gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, gw, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad, gb, rtol=1e-5, atol=1e-6)


def test_tied_embedding_gradients_add_up():
    """A Transformer with tied embeddings: the weight gets the embedding's and the output's share."""
    torch.manual_seed(0)
    net = Transformer(30, d_model=16, num_heads=2, num_layers=1, ffn_hidden=32, dropout=0.0)
    batch = {
        "src": torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]]),
        "src_valid_lens": torch.tensor([4, 3]),
        "tgt_in": torch.tensor([[1, 10, 11], [1, 12, PAD_ID]]),
        "tgt_out": torch.tensor([[10, 11, 2], [12, 2, PAD_ID]]),
    }
    params = list(net.parameters())
    ref, ref_grads = _grads(
        lambda: F.cross_entropy(
            net(batch["src"], batch["src_valid_lens"], batch["tgt_in"]).flatten(0, 1),
            batch["tgt_out"].flatten(),
            ignore_index=PAD_ID,
            label_smoothing=0.1,
        ),
        *params,
    )
    got, got_grads = _grads(lambda: sequence_loss(net, batch, 0.1, chunk_size=2), *params)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    for a, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)


def test_bahdanau_features_feed_its_output_layer():
    torch.manual_seed(0)
    net = Bahdanau(20, embed_size=8, num_hiddens=8, dropout=0.0).eval()
    src, valid = torch.tensor([[4, 5, 2], [6, 2, 0]]), torch.tensor([3, 2])
    tgt_in, tgt_out = torch.tensor([[1, 7, 8], [1, 9, PAD_ID]]), torch.tensor([[7, 8, 2], [9, 2, PAD_ID]])
    logits = net(src, valid, tgt_in)
    torch.testing.assert_close(net.output_layer(net.features(src, valid, tgt_in)), logits)
    want = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
    got = sequence_loss(net, {"src": src, "src_valid_lens": valid, "tgt_in": tgt_in, "tgt_out": tgt_out})
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bf16_autocast_keeps_the_loss_in_float32():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(20, 8, generator=g)
    w = torch.randn(12, 8, generator=g)
    y = torch.randint(0, 12, (20,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(h.bfloat16(), w, None, y, 0.1)
    assert got.dtype == torch.float32
    want = F.cross_entropy(F.linear(h.bfloat16().float(), w), y, label_smoothing=0.1)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bad_input_is_named():
    h, w, y = torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="h \\(N, d\\), weight \\(V, d\\)"):
        linear_cross_entropy(h, torch.zeros(5, 3), None, y)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        linear_cross_entropy(h, w, None, y, 1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_cross_entropy(h, w, None, y, 0.1, chunk_size=0)


def _mm_calls(fn) -> int:
    from torch.profiler import profile

    with profile() as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key in ("aten::mm", "aten::addmm", "aten::addmm_"))


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_without_grad_only_the_logits_are_computed(mode):
    """Validation runs under inference mode: one matmul per chunk (the logits), none for gradients."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(40, 8, generator=g, requires_grad=True)
    w = torch.randn(12, 8, generator=g, requires_grad=True)
    y = torch.randint(0, 12, (40,), generator=g)
    want = F.cross_entropy(F.linear(h, w), y, label_smoothing=0.1)
    with mode():
        assert _mm_calls(lambda: linear_cross_entropy(h, w, None, y, 0.1, chunk_size=16)) == 3
        got = linear_cross_entropy(h, w, None, y, 0.1, chunk_size=16)
    torch.testing.assert_close(got, want.detach(), rtol=1e-6, atol=1e-6)
    # with gradients: logits, grad_h and grad_w per chunk
    assert _mm_calls(lambda: linear_cross_entropy(h, w, None, y, 0.1, chunk_size=16)) == 9


def test_upstream_gradient_scale_and_a_frozen_weight():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(10, 4, generator=g, requires_grad=True)
    w = torch.randn(6, 4, generator=g)  # frozen: no gradient wanted
    y = torch.randint(0, 6, (10,), generator=g)
    (3.0 * linear_cross_entropy(h, w, None, y, 0.1, chunk_size=3)).backward()
    (want,) = torch.autograd.grad(3.0 * F.cross_entropy(F.linear(h, w), y, label_smoothing=0.1), h)
    torch.testing.assert_close(h.grad, want, rtol=1e-5, atol=1e-7)
    assert w.grad is None


def test_no_tokens_gives_nan_loss_and_zero_gradients_like_torch():
    h = torch.zeros(0, 4, requires_grad=True)
    w = torch.randn(6, 4, requires_grad=True)
    loss = linear_cross_entropy(h, w, None, torch.zeros(0, dtype=torch.long), 0.1)
    ref = F.cross_entropy(F.linear(h, w), torch.zeros(0, dtype=torch.long), label_smoothing=0.1)
    assert math.isnan(loss.item()) and math.isnan(ref.item())
    loss.backward()
    assert torch.count_nonzero(w.grad) == 0
