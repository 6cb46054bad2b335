"""attnlab.attention against hand-computed numbers (D2L 11.3, 11.5, 11.6)."""
import math

import pytest
import torch

from attnlab.attention import (AdditiveAttention, AddNorm, DotProductAttention, MultiHeadAttention,
                               PositionalEncoding, PositionWiseFFN, masked_softmax)


def test_masked_softmax_matches_hand_computation():
    X = torch.tensor([[[1.0, 2.0, 3.0]]])
    w = masked_softmax(X, torch.tensor([2]))
    e1, e2 = math.e, math.e ** 2
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
