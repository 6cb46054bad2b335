"""Properties every attention layer in attnlab.models.attention must have, checked on seeded inputs.

The reference here is the definition of masked attention (D2L 11.3.2.1 (zh 10.3.1),
D2L 11.5 (zh 10.5); Vaswani et al. 2017, eq. 1 and 3.2.3) and our documented rule for a
query with no valid key (its weights are all 0, so its output is the zero
vector; for MultiHeadAttention that is W_o·0 = W_o's bias). Each property is
checked for DotProductAttention, AdditiveAttention and MultiHeadAttention,
the latter on both its paths (need_weights=True: explicit weights;
need_weights=False: fused scaled_dot_product_attention), and for the hard
(arg-max) variants where the property still holds.

"Unchanged" means bitwise equal (``torch.equal``) when the two runs do the
same arithmetic on the same shapes; when the batch or the order changes,
kernels may sum in another order, so a float32 tolerance of 1e-6 is used.
"""

import pytest
import torch

from attnlab.models.attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    masked_softmax,
)

D = 8  # feature size of queries, keys and values in this file
TIGHT = {"atol": 1e-6, "rtol": 1e-6}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Attn:
    """One attention layer under test: ``attn(q, k, v, valid)`` → (B, Q, D), plus its weights."""

    def __init__(self, name, module, **call_kwargs):
        self.name, self.module, self.call_kwargs = name, module.eval(), call_kwargs

    def __call__(self, q, k, v, valid=None):
        return self.module(q, k, v, valid, **self.call_kwargs)

    @property
    def has_weights(self):
        return self.module.attention_weights is not None

    def weights(self):
        """Last weights as (B, H, Q, K) (H = 1 for single-head layers)."""
        w = self.module.attention_weights
        return w if w.dim() == 4 else w[:, None]

    def __repr__(self):
        return self.name


def _layers(hard=False):
    """The soft (or hard) layers under test; parameters from seed 0, global RNG left alone."""
    sfx = "_hard" if hard else ""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layers = [
            Attn("dot" + sfx, DotProductAttention(hard=hard)),
            Attn("additive" + sfx, AdditiveAttention(D, D, 6, hard=hard)),
            Attn("mha_weights" + sfx, MultiHeadAttention(D, 2, hard=hard), need_weights=True),
        ]
        if not hard:  # hard MHA always takes the explicit path: the fused kernel has no hard mode
            layers.append(Attn("mha_fused", MultiHeadAttention(D, 2), need_weights=False))
    return layers


def _biased_layers():
    """MultiHeadAttention with biases: a query with no valid key then outputs W_o's bias."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return [
            Attn("mha_weights_bias", MultiHeadAttention(D, 2, bias=True), need_weights=True),
            Attn("mha_fused_bias", MultiHeadAttention(D, 2, bias=True), need_weights=False),
            Attn("mha_weights_bias_hard", MultiHeadAttention(D, 2, bias=True, hard=True)),
        ]


LAYERS = _layers()
ALL_LAYERS = LAYERS + _layers(hard=True)
IDS = [a.name for a in ALL_LAYERS]
SOFT_IDS = [a.name for a in LAYERS]
WEIGHTED = [a for a in ALL_LAYERS if a.name != "mha_fused"]  # the fused path keeps no weights
BIASED = _biased_layers()


def _inputs(seed, B=3, Q=4, K=5):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, Q, D, generator=g),
        torch.randn(B, K, D, generator=g),
        torch.randn(B, K, D, generator=g),
    )


# --------------------------------------------------------------------------- weights


@pytest.mark.parametrize("attn", WEIGHTED, ids=[a.name for a in WEIGHTED])
def test_weights_are_distributions_over_valid_keys(attn):
    """Weights ≥ 0, exactly 0 on masked keys, and each row sums to 1 over its valid keys."""
    q, k, v = _inputs(1)
    for valid in (torch.tensor([5, 2, 1]), torch.tensor([[1, 2, 3, 4], [5, 5, 1, 2], [3, 3, 3, 3]])):
        attn(q, k, v, valid)
        w = attn.weights()  # (B, H, Q, K)
        lens = valid if valid.dim() == 2 else valid[:, None].expand(-1, q.shape[1])
        assert torch.all(w >= 0)
        for b in range(w.shape[0]):
            for i in range(w.shape[2]):
                n = int(lens[b, i])
                assert torch.all(w[b, :, i, n:] == 0.0)
                torch.testing.assert_close(w[b, :, i, :n].sum(-1), torch.ones(w.shape[1]), **TIGHT)


@pytest.mark.parametrize("attn", ALL_LAYERS, ids=IDS)
def test_masked_keys_and_values_do_not_matter(attn):
    """Overwriting keys/values past each sample's valid length leaves the output bitwise equal."""
    q, k, v = _inputs(2)
    valid = torch.tensor([5, 2, 1])
    out = attn(q, k, v, valid)
    k2, v2 = k.clone(), v.clone()
    g = torch.Generator().manual_seed(3)
    for b, n in enumerate(valid.tolist()):
        k2[b, n:] = 100 * torch.randn(k.shape[1] - n, D, generator=g)
        v2[b, n:] = 100 * torch.randn(k.shape[1] - n, D, generator=g)
    assert torch.equal(attn(q, k2, v2, valid), out)


@pytest.mark.parametrize("attn", ALL_LAYERS + BIASED, ids=IDS + [a.name for a in BIASED])
def test_query_without_valid_key_returns_zero_vector(attn):
    """valid length 0 (per sample or per query) → weights 0 and output 0 (W_o's bias for MHA), no NaN."""
    bias = getattr(getattr(attn.module, "W_o", None), "bias", None)
    zero = torch.zeros(D) if bias is None else bias.detach()
    q, k, v = _inputs(5)
    per_sample = torch.tensor([0, 3, 5])
    per_query = torch.tensor([[0, 1, 0, 2], [5, 0, 5, 5], [0, 0, 0, 0]])
    for valid in (per_sample, per_query):
        out = attn(q, k, v, valid)
        assert not torch.isnan(out).any()
        lens = valid if valid.dim() == 2 else valid[:, None].expand(-1, q.shape[1])
        empty = lens == 0  # (B, Q)
        for b, i in empty.nonzero().tolist():
            assert torch.equal(out[b, i], zero), (b, i)
            if attn.has_weights:
                assert torch.all(attn.weights()[b, :, i] == 0.0)
        assert torch.all(out[~empty].abs().sum(-1) > 0)  # the others did attend to something


@pytest.mark.parametrize("attn", ALL_LAYERS, ids=IDS)
def test_fully_padded_sample_leaves_other_samples_outputs_and_gradients_unchanged(attn):
    """Batch [padded (len 0), a, b] vs batch [a, b]: same outputs, same input and parameter gradients."""
    q, k, v = _inputs(6)
    valid = torch.tensor([0, 3, 5])
    upstream = torch.randn(q.shape[0], q.shape[1], D, generator=torch.Generator().manual_seed(7))

    def run(sl):
        inputs = [x[sl].clone().requires_grad_() for x in (q, k, v)]
        attn.module.zero_grad(set_to_none=True)
        out = attn(*inputs, valid[sl])
        (out * upstream[sl]).sum().backward()  # the loss covers the padded sample too
        params = {
            n: p.grad.clone() if p.grad is not None else None for n, p in attn.module.named_parameters()
        }
        return out.detach(), [x.grad for x in inputs], params

    out_all, grads_all, params_all = run(slice(None))
    out_alone, grads_alone, params_alone = run(slice(1, None))
    assert torch.isfinite(out_all).all()
    torch.testing.assert_close(out_all[1:], out_alone, **TIGHT)
    for g_all, g_alone in zip(grads_all, grads_alone):
        if g_all is None:  # hard attention: queries/keys only feed the arg-max, no gradient
            assert g_alone is None
            continue
        assert torch.isfinite(g_all).all()
        assert torch.all(g_all[0] == 0.0)  # nothing flows into the padded sample
        torch.testing.assert_close(g_all[1:], g_alone, **TIGHT)
    for name, g_all in params_all.items():
        if g_all is None:  # hard attention: parameters that only feed the scores get no gradient
            assert params_alone[name] is None, name
            continue
        assert torch.isfinite(g_all).all(), name
        torch.testing.assert_close(g_all, params_alone[name], **TIGHT)


@pytest.mark.parametrize("attn", ALL_LAYERS, ids=IDS)
def test_causal_mask_output_at_t_ignores_later_inputs(attn):
    """Self-attention with per-query valid_lens [1..T]: output[:, :t+1] is unchanged when
    X[:, t+1:] changes."""
    B, T = 2, 5
    X = torch.randn(B, T, D, generator=torch.Generator().manual_seed(8))
    causal = torch.arange(1, T + 1).expand(B, T)
    out = attn(X, X, X, causal)
    for t in range(T - 1):
        X2 = X.clone()
        X2[:, t + 1 :] = torch.randn(B, T - t - 1, D, generator=torch.Generator().manual_seed(9 + t))
        out2 = attn(X2, X2, X2, causal)
        assert torch.equal(out2[:, : t + 1], out[:, : t + 1]), t
        assert not torch.equal(out2[:, t + 1 :], out[:, t + 1 :])  # the change is visible later


@pytest.mark.parametrize("attn", LAYERS, ids=SOFT_IDS)
def test_self_attention_without_positions_is_permutation_equivariant(attn):
    """attn(PX, PX, PX) = P attn(X, X, X) for a permutation P of the sequence (no mask)."""
    X = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(10))
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    out = attn(X, X, X)
    w = attn.weights().clone() if attn.has_weights else None
    out_p = attn(X[:, perm], X[:, perm], X[:, perm])
    torch.testing.assert_close(out_p, out[:, perm], **TIGHT)
    if w is not None:  # weights permute along both the query and the key axis
        torch.testing.assert_close(attn.weights(), w[:, :, perm][:, :, :, perm], **TIGHT)


def test_multihead_per_head_weights_match_single_heads_and_average():
    """(B, H, Q, K) weights: head h equals masked_softmax of that head's slice of W_q q · W_k k."""
    torch.manual_seed(11)
    H, dh = 4, D // 4
    mha = MultiHeadAttention(D, H, bias=True).eval()
    q, k, v = _inputs(12)
    valid = torch.tensor([[1, 2, 3, 4], [5, 5, 1, 2], [3, 3, 3, 3]])
    mha(q, k, v, valid)
    w = mha.attention_weights
    assert w.shape == (3, H, 4, 5)
    with torch.no_grad():
        qh, kh = mha.W_q(q), mha.W_k(k)
        for h in range(H):
            cols = slice(h * dh, (h + 1) * dh)
            scores = qh[..., cols] @ kh[..., cols].transpose(1, 2) / dh**0.5
            torch.testing.assert_close(w[:, h], masked_softmax(scores, valid), **TIGHT)
    # The mean over heads is a distribution too (what torch returns with average_attn_weights=True,
    # compared against torch itself in test_attention_reference.py).
    torch.testing.assert_close(w.mean(1).sum(-1), torch.ones(3, 4), **TIGHT)


@pytest.mark.parametrize("attn", ALL_LAYERS, ids=IDS)
def test_valid_lens_per_sample_equals_the_same_lens_repeated_per_query(attn):
    q, k, v = _inputs(13)
    valid = torch.tensor([5, 2, 1])
    out = attn(q, k, v, valid)
    w = attn.weights().clone() if attn.has_weights else None
    out_q = attn(q, k, v, valid[:, None].expand(-1, q.shape[1]))
    assert torch.equal(out_q, out)
    if w is not None:
        assert torch.equal(attn.weights(), w)


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("per_query", [False, True])
def test_multihead_each_sample_uses_its_own_mask(per_query, need_weights, hard):
    """With 4 heads and 4 samples of different lengths, sample b's output equals running b alone."""
    torch.manual_seed(14)
    mha = MultiHeadAttention(D, 4, hard=hard).eval()
    q, k, v = _inputs(15, B=4, Q=3, K=6)
    valid = torch.tensor([6, 1, 4, 2])
    if per_query:
        valid = torch.tensor([[1, 2, 3], [6, 5, 4], [2, 2, 6], [3, 1, 1]])
    out = mha(q, k, v, valid, need_weights=need_weights)
    for b in range(4):
        alone = mha(q[b : b + 1], k[b : b + 1], v[b : b + 1], valid[b : b + 1], need_weights=need_weights)
        torch.testing.assert_close(out[b : b + 1], alone, **TIGHT)
