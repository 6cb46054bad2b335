"""attnlab.models.attention against independent references, on a seeded sweep of shapes and masks.

References (none of them uses attnlab code):

* ``torch.nn.functional.scaled_dot_product_attention`` with a boolean mask;
* softmax(score) V written out below in float64, one query at a time over
  its valid keys only, with score q·k/√d (Vaswani et al. 2017, eq. 1; D2L
  eq. 11.3.6) or w_vᵀ tanh(W_q q + W_k k) pair by pair (D2L eq. 11.3.7);
* ``torch.nn.MultiheadAttention(batch_first=True)`` with our W_q/W_k/W_v
  copied into ``in_proj_weight`` and W_o into ``out_proj``
  (Vaswani et al. 3.2.2; D2L 11.5 (zh 10.5));
* ``torch.nn.TransformerEncoderLayer`` (post-norm, ReLU, dropout 0) with our
  attention, FFN and layer-norm weights copied in (D2L 11.7.2 (zh 10.7.2), 11.7.3 (zh 10.7.3));
* ``torch.autograd.gradcheck``: finite differences in float64.

Masks: ``valid_lens`` (B,) means "query q of sample b may see keys
0..valid_lens[b]-1"; (B, Q) gives one length per query. PyTorch's masks are
built from that rule here, element by element. Lengths are ≥ 1 in the
equivalence sweeps because the references disagree among themselves (and
across PyTorch versions) on a query with no valid key; our rule for that
case (zero output) is tested in test_attention_properties.py.
"""

import math
import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from attnlab.models.attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    masked_softmax,
)
from attnlab.models.transformer import TransformerEncoderBlock

SEEDS = list(range(9))  # seed % 3 picks the mask kind: none, (B,), (B, Q)
MASK_KINDS = ("none", "per_sample", "per_query")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rand_valid_lens(g, kind, B, Q, K, low=1):
    """valid_lens of the given kind, lengths drawn uniformly from [low, K]."""
    if kind == "none":
        return None
    shape = (B,) if kind == "per_sample" else (B, Q)
    return torch.randint(low, K + 1, shape, generator=g)


def _allowed(valid_lens, B, Q, K):
    """Bool (B, Q, K), True where query q of sample b may attend to key k (built element-wise)."""
    allowed = torch.ones(B, Q, K, dtype=torch.bool)
    if valid_lens is None:
        return allowed
    for b in range(B):
        for q in range(Q):
            n = int(valid_lens[b] if valid_lens.dim() == 1 else valid_lens[b, q])
            allowed[b, q, n:] = False
    return allowed


def _reference_attention(scores, values, allowed):
    """float64 softmax of ``scores`` (B, Q, K) over each query's allowed keys, times values.

    Returns (out (B, Q, d_v), weights (B, Q, K)), both float64.
    """
    v = values.detach().double()
    B, Q, K = scores.shape
    out = torch.zeros(B, Q, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(B, Q, K, dtype=torch.float64)
    for b in range(B):
        for i in range(Q):
            idx = allowed[b, i].nonzero().flatten()
            w = torch.exp(scores[b, i, idx] - scores[b, i, idx].max())
            w = w / w.sum()
            weights[b, i, idx] = w
            out[b, i] = w @ v[b, idx]
    return out, weights


def _dot_scores(queries, keys):
    """q·k / √d in float64 (Vaswani et al. eq. 1), (B, Q, K)."""
    q, k = queries.detach().double(), keys.detach().double()
    return q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])


def _additive_scores(att, queries, keys):
    """w_vᵀ tanh(W_q q + W_k k) in float64, pair by pair (D2L eq. 11.3.7), (B, Q, K)."""
    Wq, Wk, wv = (m.weight.detach().double() for m in (att.W_q, att.W_k, att.w_v))
    q, k = queries.detach().double(), keys.detach().double()
    B, Q, K = q.shape[0], q.shape[1], k.shape[1]
    scores = torch.empty(B, Q, K, dtype=torch.float64)
    for b in range(B):
        for i in range(Q):
            for j in range(K):
                scores[b, i, j] = wv[0] @ torch.tanh(Wq @ q[b, i] + Wk @ k[b, j])
    return scores


def _case(seed):
    """Random (B, Q, K, d, d_v) in small ranges, inputs and valid_lens ≥ 1, all from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    B, Q, K, d, dv = (int(torch.randint(1, hi + 1, (), generator=g)) for hi in (4, 6, 7, 8, 5))
    kind = MASK_KINDS[seed % 3]
    valid = _rand_valid_lens(g, kind, B, Q, K)
    q = torch.randn(B, Q, d, generator=g)
    k = torch.randn(B, K, d, generator=g)
    v = torch.randn(B, K, dv, generator=g)
    return q, k, v, valid


# --------------------------------------------------------------------------- DotProductAttention


@pytest.mark.parametrize("seed", SEEDS)
def test_dot_product_equals_sdpa_and_float64_reference(seed):
    q, k, v, valid = _case(seed)
    B, Q, K = q.shape[0], q.shape[1], k.shape[1]
    allowed = _allowed(valid, B, Q, K)
    att = DotProductAttention().eval()
    out = att(q, k, v, valid)

    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)

    ref_out, ref_w = _reference_attention(_dot_scores(q, k), v, allowed)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(att.attention_weights.double(), ref_w, atol=1e-6, rtol=1e-5)

    # In float64 ours agrees with the loop reference to rounding error.
    out64 = att(q.double(), k.double(), v.double(), valid)
    torch.testing.assert_close(out64, ref_out, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_additive_equals_float64_reference(seed):
    q, k, v, valid = _case(seed)
    B, Q, K = q.shape[0], q.shape[1], k.shape[1]
    k = torch.cat([k, k[..., :1]], dim=-1)  # d_k = d_q + 1: the two projections differ in shape
    torch.manual_seed(seed)
    att = AdditiveAttention(key_size=k.shape[-1], query_size=q.shape[-1], num_hiddens=5).eval()
    ref_out, ref_w = _reference_attention(_additive_scores(att, q, k), v, _allowed(valid, B, Q, K))
    out = att(q, k, v, valid)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(att.attention_weights.double(), ref_w, atol=1e-6, rtol=1e-5)
    # Precomputed keys (the decoder's cache) give the same result.
    torch.testing.assert_close(att(q, k, v, valid, projected_keys=att.project_keys(k)), out, atol=0, rtol=0)


# --------------------------------------------------------------------------- MultiHeadAttention


def _torch_mha_like(ours: MultiHeadAttention, d_model: int, num_heads: int) -> nn.MultiheadAttention:
    """torch.nn.MultiheadAttention holding ``ours``'s weights (zero biases where ours has none)."""
    theirs = nn.MultiheadAttention(d_model, num_heads, bias=True, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        theirs.out_proj.weight.copy_(ours.W_o.weight)
        if ours.W_q.bias is None:
            theirs.in_proj_bias.zero_()
            theirs.out_proj.bias.zero_()
        else:
            theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
            theirs.out_proj.bias.copy_(ours.W_o.bias)
    return theirs


def _torch_masks(valid, allowed, num_heads):
    """valid_lens → (key_padding_mask (B, K), attn_mask (B·H, Q, K)); True = may NOT attend."""
    if valid is None:
        return {}
    if valid.dim() == 1:
        return {"key_padding_mask": ~allowed[:, 0, :]}
    # 3-D attn_mask is indexed sample-major: row b·H + h is sample b, head h.
    per_head = torch.stack([allowed[b] for b in range(allowed.shape[0]) for _ in range(num_heads)])
    return {"attn_mask": ~per_head}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_multihead_equals_torch_multihead_attention(seed, bias):
    g = torch.Generator().manual_seed(100 + seed)
    H = (1, 2, 4)[seed % 3]
    E = H * int(torch.randint(1, 5, (), generator=g))
    B, Q, K = (int(torch.randint(1, hi + 1, (), generator=g)) for hi in (3, 5, 6))
    valid = _rand_valid_lens(g, MASK_KINDS[(seed // 3) % 3], B, Q, K)
    q, k, v = (
        torch.randn(B, Q, E, generator=g),
        torch.randn(B, K, E, generator=g),
        torch.randn(B, K, E, generator=g),
    )
    torch.manual_seed(seed)
    ours = MultiHeadAttention(E, H, dropout=0.0, bias=bias).eval()
    if bias:  # nn.Linear's default bias init is fine, but make sure none is zero by accident
        for lin in (ours.W_q, ours.W_k, ours.W_v, ours.W_o):
            nn.init.normal_(lin.bias)
    theirs = _torch_mha_like(ours, E, H)
    masks = _torch_masks(valid, _allowed(valid, B, Q, K), H)

    with torch.no_grad():
        ref_out, ref_w = theirs(q, k, v, need_weights=True, average_attn_weights=False, **masks)
        _, ref_avg = theirs(q, k, v, need_weights=True, average_attn_weights=True, **masks)
        out_w = ours(q, k, v, valid, need_weights=True)
        weights = ours.attention_weights
        out_fused = ours(q, k, v, valid, need_weights=False)

    torch.testing.assert_close(out_w, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_fused, ref_out, atol=1e-5, rtol=1e-5)
    assert weights.shape == (B, H, Q, K) == ref_w.shape
    torch.testing.assert_close(weights, ref_w, atol=1e-6, rtol=1e-5)  # per head
    torch.testing.assert_close(weights.mean(dim=1), ref_avg, atol=1e-6, rtol=1e-5)  # averaged


# --------------------------------------------------------------------------- Transformer encoder block


def _torch_encoder_layer_like(ours: TransformerEncoderBlock, d_model, num_heads, ffn_hidden):
    theirs = nn.TransformerEncoderLayer(
        d_model, num_heads, ffn_hidden, dropout=0.0, activation="relu", batch_first=True, norm_first=False
    ).eval()
    mha = _torch_mha_like(ours.attention, d_model, num_heads)
    theirs.self_attn.load_state_dict(mha.state_dict())
    theirs.linear1.load_state_dict(ours.ffn.dense1.state_dict())
    theirs.linear2.load_state_dict(ours.ffn.dense2.state_dict())
    theirs.norm1.load_state_dict(ours.addnorm1.ln.state_dict())
    theirs.norm2.load_state_dict(ours.addnorm2.ln.state_dict())
    return theirs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_encoder_block_equals_torch_transformer_encoder_layer(seed):
    """Post-norm block ≡ nn.TransformerEncoderLayer with src_key_padding_mask from valid_lens.

    What is compared, and why:
    * the layer's slow path (autograd on) and its fused fast path
      (``_transformer_encoder_layer_fwd``, taken in eval mode under no_grad):
      every position. Both ours and torch let a padded query attend to the
      valid keys, so padded rows are defined and equal too;
    * ``nn.TransformerEncoder(enable_nested_tensor=True)`` under no_grad packs
      the batch into a nested tensor and writes 0 at padded positions, which
      is not a value our block (nor the plain layer) computes: there only the
      valid positions are compared.
    """
    torch.manual_seed(seed)
    E, H, FF, B, S = 8, (2, 4, 8)[seed], 12, 3, 6  # even H: torch uses nested tensors only then
    ours = TransformerEncoderBlock(E, H, FF, dropout=0.0).eval()
    with torch.no_grad():  # non-trivial layer norms, so swapping norm1/norm2 would show
        for ln in (ours.addnorm1.ln, ours.addnorm2.ln):
            ln.weight.normal_()
            ln.bias.normal_()
    theirs = _torch_encoder_layer_like(ours, E, H, FF)
    X = torch.randn(B, S, E)
    valid = torch.tensor([S, 3, 1])
    padding = ~_allowed(valid, B, 1, S)[:, 0, :]  # (B, S), True = padding

    expected_slow = theirs(X, src_key_padding_mask=padding)  # autograd on → slow path
    with torch.no_grad():
        expected_fast = theirs(X, src_key_padding_mask=padding)
    for need_weights in (False, True):
        got = ours(X, valid, need_weights=need_weights)
        torch.testing.assert_close(got, expected_slow, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, expected_fast, atol=1e-5, rtol=1e-5)

    encoder = nn.TransformerEncoder(theirs, num_layers=1, enable_nested_tensor=True).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*nested tensors.*")  # "prototype" notice
        nested = encoder(X, src_key_padding_mask=padding)
    valid_positions = ~padding
    torch.testing.assert_close(ours(X, valid)[valid_positions], nested[valid_positions], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- gradients


def _gradcheck_module(module, inputs, kwargs):
    """gradcheck w.r.t. the float inputs and every parameter of ``module`` (float64)."""
    module = module.double().eval()
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]
    inputs = [x.double().requires_grad_() for x in inputs]
    n_in = len(inputs)

    def f(*args):
        return functional_call(module, dict(zip(names, args[n_in:])), tuple(args[:n_in]), kwargs)

    assert torch.autograd.gradcheck(f, (*inputs, *params), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_masked_softmax():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    for valid in (None, torch.tensor([5, 2, 0]), torch.tensor([[1, 2, 3, 0], [5, 5, 1, 4], [0, 0, 2, 3]])):
        assert torch.autograd.gradcheck(lambda x, valid=valid: masked_softmax(x, valid), (X,))


@pytest.mark.parametrize(
    "valid",
    [None, torch.tensor([4, 1]), torch.tensor([[1, 2, 3], [4, 0, 2]])],
    ids=["none", "per_sample", "per_query"],
)
def test_gradcheck_dot_product_attention(valid):
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(2, 3, 4, generator=g),
        torch.randn(2, 4, 4, generator=g),
        torch.randn(2, 4, 3, generator=g),
    )
    _gradcheck_module(DotProductAttention(), [q, k, v], {"valid_lens": valid})


@pytest.mark.parametrize(
    "valid",
    [None, torch.tensor([4, 1]), torch.tensor([[1, 2, 3], [4, 0, 2]])],
    ids=["none", "per_sample", "per_query"],
)
def test_gradcheck_additive_attention(valid):
    g = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(2, 3, 3, generator=g),
        torch.randn(2, 4, 2, generator=g),
        torch.randn(2, 4, 3, generator=g),
    )
    torch.manual_seed(2)
    _gradcheck_module(
        AdditiveAttention(key_size=2, query_size=3, num_hiddens=4), [q, k, v], {"valid_lens": valid}
    )


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize(
    "valid",
    [None, torch.tensor([4, 1]), torch.tensor([[1, 2, 3], [4, 0, 2]])],
    ids=["none", "per_sample", "per_query"],
)
def test_gradcheck_multihead_attention(valid, need_weights):
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 3, 4, generator=g),
        torch.randn(2, 4, 4, generator=g),
        torch.randn(2, 4, 4, generator=g),
    )
    torch.manual_seed(3)
    _gradcheck_module(
        MultiHeadAttention(4, 2, bias=True), [q, k, v], {"valid_lens": valid, "need_weights": need_weights}
    )
