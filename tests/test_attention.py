"""attnlab.models.attention against hand-computed numbers (D2L 11.3 (zh 10.3), 11.5 (zh 10.5),
11.6 (zh 10.6)).

The hard-attention tests at the end (Xu et al. 2015, "Show, Attend and
Tell", sec. 4.1; D2L 11.1 (zh 10.1)) compute the best-scoring valid key in plain
Python floats, independently of the library, and expect exactly its value
vector back.
"""

import math

import pytest
import torch

from attnlab.models.attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    masked_hardmax,
    masked_softmax,
)
from attnlab.models.positional_encoding import PositionalEncoding
from attnlab.models.transformer import AddNorm, PositionWiseFFN

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_masked_softmax_matches_hand_computation():
    X = torch.tensor([[[1.0, 2.0, 3.0]]])
    w = masked_softmax(X, torch.tensor([2]))
    e1, e2 = math.e, math.e**2
    assert w[0, 0].tolist() == pytest.approx([e1 / (e1 + e2), e2 / (e1 + e2), 0.0], abs=1e-7)


def test_masked_positions_are_exactly_zero_and_rows_sum_to_one():
    torch.manual_seed(0)
    X = torch.randn(3, 4, 6)
    valid = torch.tensor([1, 4, 6])
    w = masked_softmax(X, valid)
    for b, n in enumerate(valid.tolist()):
        assert torch.all(w[b, :, n:] == 0.0)
        assert torch.allclose(w[b].sum(-1), torch.ones(4))


def test_zero_valid_length_gives_zero_weights_not_nan():
    X = torch.randn(2, 3, 5)
    w = masked_softmax(X, torch.tensor([0, 2]))
    assert not torch.isnan(w).any()
    assert torch.all(w[0] == 0.0)
    assert torch.allclose(w[1].sum(-1), torch.ones(3))


def test_per_query_valid_lens_make_a_causal_mask():
    X = torch.zeros(1, 3, 3)
    w = masked_softmax(X, torch.tensor([[1, 2, 3]]))
    expected = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]])
    assert torch.allclose(w[0], expected)


def test_masked_softmax_rejects_3d_valid_lens():
    with pytest.raises(ValueError, match="valid_lens must have shape"):
        masked_softmax(torch.zeros(1, 2, 2), torch.ones(1, 2, 2, dtype=torch.long))


def test_dot_product_attention_hand_computed():
    q = torch.tensor([[[1.0, 0.0]]])
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    v = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    out = DotProductAttention()(q, k, v)
    w0 = 1 / (1 + math.exp(-1 / math.sqrt(2)))  # softmax([1/√2, 0])[0]
    assert out[0, 0].tolist() == pytest.approx([w0 * 1 + (1 - w0) * 3, w0 * 2 + (1 - w0) * 4], abs=1e-6)


def test_additive_attention_hand_computed():
    att = AdditiveAttention(key_size=1, query_size=1, num_hiddens=1)
    for lin in (att.W_k, att.W_q, att.w_v):
        torch.nn.init.ones_(lin.weight)
    q = torch.tensor([[[0.0]]])
    k = torch.tensor([[[0.0], [1.0], [5.0]]])
    v = torch.tensor([[[10.0], [20.0], [99.0]]])
    out = att(q, k, v, torch.tensor([2]))  # scores tanh(0)=0, tanh(1); third key masked
    w1 = math.exp(math.tanh(1)) / (1 + math.exp(math.tanh(1)))
    assert out.item() == pytest.approx(10 * (1 - w1) + 20 * w1, abs=1e-5)
    assert att.attention_weights[0, 0, 2].item() == 0.0


def test_multihead_fused_path_equals_weights_path():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, num_heads=4).eval()
    q, kv = torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    for valid in (None, torch.tensor([7, 3, 1]), torch.randint(1, 8, (3, 5))):
        a = mha(q, kv, kv, valid, need_weights=True)
        assert mha.attention_weights.shape == (3, 4, 5, 7)
        b = mha(q, kv, kv, valid, need_weights=False)
        assert torch.allclose(a, b, atol=1e-5)


def test_multihead_each_sample_uses_its_own_mask():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, num_heads=2).eval()
    q, kv = torch.randn(2, 1, 8), torch.randn(2, 4, 8)
    mha(q, kv, kv, torch.tensor([1, 3]))
    w = mha.attention_weights  # (B, H, Q, K)
    assert torch.all(w[0, :, :, 1:] == 0) and torch.all(w[1, :, :, 3:] == 0)
    assert torch.all(w[1, :, :, :3] > 0)


def test_multihead_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="not divisible"):
        MultiHeadAttention(d_model=10, num_heads=4)


def test_positional_encoding_values():
    d = 8
    pe = PositionalEncoding(d, dropout=0.0)
    P = pe(torch.zeros(1, 3, d))[0]
    assert P[0].tolist() == pytest.approx([0, 1] * 4)
    for j in range(d // 2):
        angle = 2 / 10000 ** (2 * j / d)  # position 2
        assert P[2, 2 * j].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert P[2, 2 * j + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positional_encoding_odd_d_model_sin_even_cos_odd():
    pe = PositionalEncoding(5, dropout=0.0)
    P = pe(torch.zeros(1, 2, 5))[0]
    assert P[1, 4].item() == pytest.approx(math.sin(1 / 10000 ** (4 / 5)), abs=1e-6)
    assert P[1, 3].item() == pytest.approx(math.cos(1 / 10000 ** (2 / 5)), abs=1e-6)


def test_positional_encoding_too_long_raises():
    with pytest.raises(ValueError, match="max_len"):
        PositionalEncoding(4, max_len=3)(torch.zeros(1, 4, 4))


def test_ffn_and_addnorm_shapes_and_norm():
    torch.manual_seed(0)
    X = torch.randn(2, 3, 4)
    Y = PositionWiseFFN(4, 8)(X)
    assert Y.shape == (2, 3, 4)
    Z = AddNorm(4, 0.0).eval()(X, Y)
    assert torch.allclose(Z.mean(-1), torch.zeros(2, 3), atol=1e-6)
    assert torch.allclose(Z.var(-1, unbiased=False), torch.ones(2, 3), atol=1e-3)


# --------------------------------------------------------------------------- hard attention


def test_masked_hardmax_hand_computed():
    X = torch.tensor(
        [
            [
                [3.0, 1.0, 3.0, 9.0],  # tie between keys 0 and 2; key 3 (9.0) masked
                [0.0, 2.0, 2.0, 2.0],  # three-way tie → lowest index, key 1
                [5.0, 4.0, 3.0, 2.0],
            ]
        ]
    )  # no valid key → all zeros
    assert masked_hardmax(X, torch.tensor([[3, 4, 0]])).tolist() == [
        [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    ]
    assert masked_hardmax(X, torch.tensor([2])).tolist() == [[[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]]]
    assert masked_hardmax(X, None).tolist() == [[[0, 0, 0, 1], [0, 1, 0, 0], [1, 0, 0, 0]]]
    assert masked_hardmax(X.double(), None).dtype == torch.float64
    with pytest.raises(ValueError, match="valid_lens must have shape"):
        masked_hardmax(X, torch.ones(1, 3, 1, dtype=torch.long))


def _best_valid_key(scores, n):
    """Index of the largest of scores[:n], the lowest index on ties; None when n == 0."""
    best = None
    for j in range(n):
        if best is None or scores[j] > scores[best]:
            best = j
    return best


def _lens(valid, B, Q):
    return [[int(valid[b] if valid.dim() == 1 else valid[b, i]) for i in range(Q)] for b in range(B)]


HARD_VALID = [torch.tensor([5, 1, 0]), torch.tensor([[1, 5, 3, 0], [2, 2, 4, 5], [0, 1, 5, 3]])]


@pytest.mark.parametrize("valid", HARD_VALID, ids=["per_sample", "per_query"])
def test_hard_dot_product_attention_returns_value_of_best_valid_key(valid):
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(3, 4, 6, generator=g),
        torch.randn(3, 5, 6, generator=g),
        torch.randn(3, 5, 2, generator=g),
    )
    att = DotProductAttention(hard=True)
    out = att(q, k, v, valid)
    for b, row in enumerate(_lens(valid, 3, 4)):
        for i, n in enumerate(row):
            scores = [
                sum(a * c for a, c in zip(q[b, i].tolist(), k[b, j].tolist())) / math.sqrt(6)
                for j in range(5)
            ]
            best = _best_valid_key(scores, n)
            expected_w = [0.0] * 5 if best is None else [float(j == best) for j in range(5)]
            assert att.attention_weights[b, i].tolist() == expected_w
            assert torch.equal(out[b, i], torch.zeros(2) if best is None else v[b, best])


@pytest.mark.parametrize("valid", HARD_VALID, ids=["per_sample", "per_query"])
def test_hard_additive_attention_returns_value_of_best_valid_key(valid):
    torch.manual_seed(1)
    att = AdditiveAttention(key_size=3, query_size=4, num_hiddens=5, hard=True)
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(3, 4, 4, generator=g),
        torch.randn(3, 5, 3, generator=g),
        torch.randn(3, 5, 2, generator=g),
    )
    out = att(q, k, v, valid)
    Wq, Wk, wv = (m.weight.detach().double() for m in (att.W_q, att.W_k, att.w_v))
    for b, row in enumerate(_lens(valid, 3, 4)):
        for i, n in enumerate(row):
            # a(q, k) = w_vᵀ tanh(W_q q + W_k k), in float64 (D2L eq. 11.3.7)
            scores = [float(wv @ torch.tanh(Wq @ q[b, i].double() + Wk @ k[b, j].double())) for j in range(5)]
            best = _best_valid_key(scores, n)
            assert torch.equal(out[b, i], torch.zeros(2) if best is None else v[b, best])
            assert att.attention_weights[b, i].sum() == (0.0 if best is None else 1.0)


@pytest.mark.parametrize("need_weights", [True, False])
def test_hard_multihead_attention_picks_one_key_per_head(need_weights):
    torch.manual_seed(2)
    H, d, dh = 2, 6, 3
    mha = MultiHeadAttention(d, H, hard=True)
    g = torch.Generator().manual_seed(2)
    q, kv = torch.randn(2, 3, d, generator=g), torch.randn(2, 4, d, generator=g)
    valid = torch.tensor([[4, 2, 0], [1, 3, 4]])
    out = mha(q, kv, kv, valid, need_weights=need_weights)
    w = mha.attention_weights  # kept even with need_weights=False: the fused kernel has no hard mode
    assert w.shape == (2, H, 3, 4)
    with torch.no_grad():
        qh, kh, vh = mha.W_q(q), mha.W_k(kv), mha.W_v(kv)
        for b, row in enumerate(_lens(valid, 2, 3)):
            for i, n in enumerate(row):
                heads = []
                for h in range(H):
                    cols = slice(h * dh, (h + 1) * dh)
                    scores = [float(qh[b, i, cols] @ kh[b, j, cols]) for j in range(4)]
                    best = _best_valid_key(scores, n)
                    assert w[b, h, i].tolist() == [float(j == best) for j in range(4)]
                    heads.append(torch.zeros(dh) if best is None else vh[b, best, cols])
                torch.testing.assert_close(out[b, i], mha.W_o(torch.cat(heads)), atol=1e-6, rtol=1e-6)


def test_hard_attention_gradient_reaches_only_the_chosen_values():
    """Scores get no gradient (argmax); d out / d v[b, j] = Σ_i w[b, i, j] · upstream[b, i]."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 4, generator=g).requires_grad_() for _ in range(3))
    valid = torch.tensor([3, 1])
    upstream = torch.randn(2, 3, 4, generator=g)
    att = DotProductAttention(hard=True)
    (att(q, k, v, valid) * upstream).sum().backward()
    assert q.grad is None and k.grad is None
    w = att.attention_weights
    assert torch.equal(v.grad, w.transpose(1, 2) @ upstream)
    assert torch.all(v.grad[1, 1:] == 0)  # sample 1 may only choose key 0
    # gradcheck agrees: away from ties the finite-difference derivative w.r.t. q and k is 0.
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b_, c: att(a, b_, c, valid), (q64, k64, v64))

    torch.manual_seed(3)
    add = AdditiveAttention(4, 4, 5, hard=True)
    v2 = v.detach().clone().requires_grad_()
    add(q.detach(), k.detach(), v2, valid).sum().backward()
    assert all(p.grad is None for p in add.parameters())  # the scoring MLP is not trained
    assert v2.grad.abs().sum() > 0

    mha = MultiHeadAttention(4, 2, bias=True, hard=True)
    mha(q.detach(), k.detach(), v.detach(), valid).sum().backward()
    assert mha.W_q.weight.grad is None and mha.W_k.weight.grad is None
    assert mha.W_v.weight.grad.abs().sum() > 0 and mha.W_o.weight.grad.abs().sum() > 0
