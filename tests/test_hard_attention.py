"""Hard attention's pieces (:mod:`attnlab.models.hard_attention`, issue 32): the sampled location,
the REINFORCE surrogate of Xu et al. 2015 (sec. 4.1), the straight-through Gumbel-softmax.

Expected values are computed here by hand in float64 NumPy (softmax, its entropy, the score
function onehot(s̃) − p), or by the exact expectation a Monte Carlo estimate must reach.
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from attnlab.models.attention import masked_softmax
from attnlab.models.hard_attention import (
    LocationSample,
    MovingAverageBaseline,
    gumbel_noise,
    sample_location,
    score_function_loss,
    sentence_log_likelihood,
    straight_through_gumbel,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- the sampled location ------------------------------------------------------------------


def test_sampled_locations_follow_the_attention_distribution():
    """20,000 draws of one query over 5 keys, the last one padding with the highest score: the
    counts of the 4 valid keys fit N·softmax(scores[:4]) (chi-square), padding is never drawn,
    and the same counts reject a uniform distribution (so the test can tell)."""
    n = 20_000
    scores = torch.tensor([1.0, -0.5, 0.3, 2.0, 9.0])
    sample = sample_location(
        scores.expand(n, 1, 5).contiguous(), torch.full((n,), 4), torch.Generator().manual_seed(0)
    )
    counts = sample.weights.sum((0, 1)).numpy()
    assert counts[4] == 0 and counts.sum() == n
    expected = n * _softmax(np.array([1.0, -0.5, 0.3, 2.0]))
    assert stats.chisquare(counts[:4], expected).pvalue > 0.01
    assert stats.chisquare(counts[:4], np.full(4, n / 4)).pvalue < 1e-12


def test_a_sample_is_one_hot_on_a_valid_key_with_its_log_prob_and_entropy():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 6, 7, generator=g)
    scores[..., 3:] += 50.0  # padding of the short rows scores far above the valid keys
    valid = torch.tensor([7, 3, 1, 5])
    sample = sample_location(scores, valid, g)
    w = sample.weights
    assert set(w.unique().tolist()) == {0.0, 1.0} and torch.equal(w.sum(-1), torch.ones(4, 6))
    for b, n in enumerate(valid.tolist()):
        assert w[b, :, n:].sum() == 0  # never a padding key
        z = scores[b, :, :n].double().numpy()
        p = _softmax(z)
        chosen = w[b].argmax(-1).numpy()
        np.testing.assert_allclose(sample.log_prob[b], np.log(p[np.arange(6), chosen]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(sample.entropy[b], -(p * np.log(p)).sum(-1), rtol=1e-5, atol=1e-6)
        onehot = np.eye(n)[chosen]
        np.testing.assert_allclose(sample.score_grad_sq[b], ((onehot - p) ** 2).sum(-1), rtol=1e-5, atol=1e-6)


def test_a_query_without_valid_keys_gets_nothing_and_finite_gradients():
    scores = torch.randn(2, 3, 4, requires_grad=True)
    sample = sample_location(scores, torch.tensor([0, 2]))
    assert sample.weights[0].eq(0).all() and sample.log_prob[0].eq(0).all() and sample.entropy[0].eq(0).all()
    (sample.log_prob.sum() + sample.entropy.sum()).backward()
    assert torch.isfinite(scores.grad).all()
    assert scores.grad[0].eq(0).all() and scores.grad[1, :, 2:].eq(0).all()  # nothing for padding


def test_gumbel_noise_has_the_gumbel_mean_and_variance():
    """Gumbel(0, 1): mean γ (Euler–Mascheroni), variance π²/6; 200,000 draws, 5 standard errors."""
    g = gumbel_noise(torch.empty(200_000, dtype=torch.float64), torch.Generator().manual_seed(0))
    se = math.sqrt(math.pi**2 / 6 / g.numel())
    assert abs(g.mean().item() - np.euler_gamma) < 5 * se
    assert g.var().item() == pytest.approx(math.pi**2 / 6, rel=0.02)


# --- REINFORCE -------------------------------------------------------------------------------


def test_the_surrogate_gradient_is_the_hand_computed_score_function_estimate():
    """B = 2 sentences, T = 2 steps (sentence 1's second step is padding), K = 3 keys. The
    gradient of the surrogate w.r.t. the scores is, per kept step,
    −1/N_tok [λ_r (r_n − b)(onehot(s̃) − p) + λ_e ∂H/∂z],  ∂H/∂z_k = −p_k (log p_k + H),
    and 0 at the padded step; b then moves to 0.9 b + 0.1 mean(r)."""
    lam_r, lam_e, b = 0.7, 0.2, -3.0
    z0 = np.array([[[0.2, -1.0, 0.5], [1.5, 0.0, -0.3]], [[-0.4, 0.9, 0.1], [0.3, 0.3, 0.3]]])
    scores = torch.tensor(z0, requires_grad=True)
    sample = sample_location(scores, None, torch.Generator().manual_seed(5))
    keep = torch.tensor([[True, True], [True, False]])
    reward = torch.tensor([-2.0, -5.5], dtype=torch.float64)
    baseline = MovingAverageBaseline()
    baseline.value.fill_(b)
    surrogate, metrics = score_function_loss(reward, sample, keep, baseline, lam_r, lam_e, 3)
    surrogate.backward()

    p = _softmax(z0)
    H = -(p * np.log(p)).sum(-1, keepdims=True)
    onehot = sample.weights.numpy()
    advantage = (reward.numpy() - b)[:, None, None]
    grad = -(lam_r * advantage * (onehot - p) + lam_e * (-p * (np.log(p) + H))) / 3
    grad[1, 1] = 0.0
    np.testing.assert_allclose(scores.grad.numpy(), grad, rtol=1e-12, atol=1e-15)

    norms = lam_r * np.abs(advantage[:, 0, 0]) * np.sqrt((((onehot - p) ** 2).sum(-1) * keep.numpy()).sum(1))
    assert metrics["reinforce_grad_var"].item() == pytest.approx(np.var(norms, ddof=1), rel=1e-10)
    assert metrics["reinforce_baseline"].item() == b and metrics["reinforce_reward"].item() == -3.75
    assert metrics["attention_entropy"].item() == pytest.approx((H[0, 0] + H[0, 1] + H[1, 0])[0] / 3)
    assert baseline.value.item() == pytest.approx(0.9 * b + 0.1 * -3.75)


def test_the_score_function_estimate_is_unbiased_whatever_the_baseline():
    """One query, K = 4 keys, reward f(s) a fixed function of the drawn key: the mean over
    40,000 draws of the estimator (f(s̃) − b)(onehot(s̃) − p) reaches the exact gradient
    ∇_z Σ_s p_s f(s) = p ⊙ (f − pᵀf) for b = 0 and b = 2 (within 4 standard errors)."""
    n, f = 40_000, torch.tensor([1.0, 3.0, -2.0, 0.5], dtype=torch.float64)
    z0 = torch.tensor([0.3, -0.2, 0.8, 0.0], dtype=torch.float64)
    p = torch.softmax(z0, 0)
    exact = p * (f - (p * f).sum())
    for b in (0.0, 2.0):
        z = z0.clone().requires_grad_()
        sample = sample_location(z.expand(n, 1, 4), None, torch.Generator().manual_seed(1))
        reward = (sample.weights[:, 0] * f).sum(-1)
        baseline = MovingAverageBaseline()
        baseline.value.fill_(b)
        surrogate, _ = score_function_loss(
            reward, sample, torch.ones(n, 1, dtype=torch.bool), baseline, 1.0, 0.0, n
        )
        (-surrogate).backward()  # the ascent direction: the estimate of ∇ E[f]
        per_draw = (reward - b)[:, None] * (sample.weights[:, 0] - p)
        se = per_draw.std(0) / math.sqrt(n)
        assert torch.all((z.grad - exact).abs() < 4 * se), (b, z.grad, exact, se)


def test_the_moving_average_baseline_starts_at_the_first_mean_and_is_saved():
    baseline = MovingAverageBaseline(0.9)
    assert torch.isnan(baseline.value)
    baseline.update(torch.tensor(-10.0))
    assert baseline.value.item() == -10.0
    baseline.update(torch.tensor(-20.0))
    assert baseline.value.item() == pytest.approx(0.9 * -10.0 + 0.1 * -20.0)
    assert baseline.state_dict()["value"].item() == pytest.approx(-11.0)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        MovingAverageBaseline(1.0)


def test_sentence_log_likelihood_sums_each_sentences_token_log_probs():
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(5, 11)
    features = torch.randn(3, 4, 5, generator=g)
    tgt = torch.randint(0, 11, (3, 4), generator=g)
    keep = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    got = sentence_log_likelihood(features, layer, tgt, keep, chunk=3)  # chunks cut across sentences
    token = -torch.nn.functional.cross_entropy(layer(features).flatten(0, 1), tgt.flatten(), reduction="none")
    expected = (token.view(3, 4) * keep).sum(1)
    torch.testing.assert_close(got, expected.detach())
    assert not got.requires_grad


def test_location_samples_of_steps_concatenate_along_the_queries():
    steps = [sample_location(torch.randn(2, 1, 3), None) for _ in range(4)]
    whole = LocationSample.cat(steps)
    assert whole.weights.shape == (2, 4, 3) and whole.log_prob.shape == (2, 4)
    assert torch.equal(whole.entropy[:, 2], steps[2].entropy[:, 0])


# --- the straight-through Gumbel-softmax ----------------------------------------------------


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_straight_through_gumbel_is_one_hot_forward_and_the_softmax_gradient_backward(tau):
    """Forward: exactly the one-hot of arg-max over the valid keys of scores + g (g from the same
    seed); backward: the Jacobian of y = softmax((scores + g)/τ) applied to the upstream gradient
    w, (1/τ) y ⊙ (w − yᵀw), by hand, and 0 at padding keys (scored far above the rest)."""
    z0 = torch.randn(3, 2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    z0[0, :, 3:] = 100.0
    valid = torch.tensor([3, 5, 1])
    scores = z0.clone().requires_grad_()
    out = straight_through_gumbel(scores, valid, tau, torch.Generator().manual_seed(4))
    g = gumbel_noise(z0, torch.Generator().manual_seed(4))
    noisy = (z0 + g).numpy()
    w = torch.randn(3, 2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    (out * w).sum().backward()
    for b, n in enumerate(valid.tolist()):
        onehot = np.eye(5)[noisy[b, :, :n].argmax(-1)]
        np.testing.assert_array_equal(out[b].detach().numpy(), onehot)  # exact 0s and 1s
        y = _softmax(noisy[b, :, :n] / tau)
        wb = w[b, :, :n].numpy()
        grad = y * (wb - (y * wb).sum(-1, keepdims=True)) / tau
        np.testing.assert_allclose(scores.grad[b, :, :n].numpy(), grad, rtol=1e-12, atol=1e-15)
        assert scores.grad[b, :, n:].eq(0).all()


def test_straight_through_gumbel_equals_the_torch_softmax_gradient_with_the_same_noise():
    """The same check against autograd of attnlab's own masked_softmax (float32)."""
    z0 = torch.randn(4, 3, 6)
    valid = torch.tensor([6, 2, 4, 1])
    a, b = z0.clone().requires_grad_(), z0.clone().requires_grad_()
    w = torch.randn(4, 3, 6)
    (straight_through_gumbel(a, valid, 0.7, torch.Generator().manual_seed(9)) * w).sum().backward()
    g = gumbel_noise(z0, torch.Generator().manual_seed(9))
    (masked_softmax((b + g) / 0.7, valid) * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_straight_through_gumbel_refuses_a_temperature_that_is_not_positive():
    with pytest.raises(ValueError, match="temperature must be > 0, got tau=0"):
        straight_through_gumbel(torch.zeros(1, 1, 2), None, 0)
