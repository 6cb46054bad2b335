"""Hard attention: one attended location, sampled, with two ways to train it.

Soft attention (D2L 11.1 (zh 10.1), 11.3 (zh 10.3)) returns the weighted mean Σ_s α_s v_s of
the values. Hard attention returns one value v_s̃, the location s̃ drawn from the attention
distribution p(s | a) = masked_softmax(scores), so the choice has no gradient of its own. Xu et
al. 2015, "Show, Attend and Tell", section 4.1, train it by the score function (REINFORCE):
with L_s = Σ_s p(s | a) log p(y | s, a), a lower bound of log p(y | a), and N sampled location
sequences s̃ⁿ,

    ∂L_s/∂W ≈ 1/N Σ_n [ ∂log p(y | s̃ⁿ, a)/∂W
                        + λ_r (log p(y | s̃ⁿ, a) − b) ∂log p(s̃ⁿ | a)/∂W
                        + λ_e ∂H[s̃ⁿ]/∂W ],          b ← 0.9 b + 0.1 log p(y | s̃, a),

where log p(s̃ⁿ | a) = Σ_t log p(s̃ⁿ_t | a) sums over the decoding steps, H[s̃ⁿ] = Σ_t H[p(· | a)]
is the entropy of the location distributions (the bonus that keeps them from collapsing early),
and b is a moving-average baseline (it lowers the variance; any b that does not depend on s̃
keeps the estimate unbiased). :func:`sample_location` draws s̃ and keeps log p(s̃_t | a) and
H_t; :func:`score_function_loss` is the surrogate whose gradient is the last two terms (the
first is the ordinary cross-entropy's).

The other way (Jang et al. 2017, "Categorical Reparameterization with Gumbel-Softmax";
Maddison et al. 2017): :func:`straight_through_gumbel` returns the one-hot of
arg-max(scores + g), g ~ Gumbel(0, 1), in the forward pass and passes back the gradient of
softmax((scores + g) / τ), a biased but low-variance estimate.

At inference both take the arg-max location: :func:`attnlab.models.attention.masked_hardmax`.
Padding keys (past each valid length) are never chosen, by any of these functions.

Shape letters: B batch, Q queries (decoding steps), K keys (source positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.models.attention import masked_hardmax, masked_softmax

__all__ = [
    "LocationSample",
    "MovingAverageBaseline",
    "gumbel_noise",
    "sample_location",
    "score_function_loss",
    "sentence_log_likelihood",
    "straight_through_gumbel",
]


def gumbel_noise(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel(0, 1) noise of ``like``'s shape, dtype and device: −log E, E ~ Exp(1).

    E is kept ≥ the dtype's smallest normal number, so the noise is finite (≤ 87.3 in float32):
    ``exponential_`` can return 0, whose −log is +inf (and inf − inf = NaN in a softmax).
    """
    e = torch.empty_like(like).exponential_(generator=generator)
    return -e.clamp_min_(torch.finfo(e.dtype).tiny).log()


def _masked_log_probs(scores: torch.Tensor, valid_lens: torch.Tensor | None):
    """(log p (B, Q, K) with −inf at padding keys, key mask (B, Q, K), has_key (B, Q)).

    A query with no valid key gets log p = 0 everywhere (finite, so no NaN reaches a gradient);
    its callers zero what they return for it.
    """
    if valid_lens is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    else:
        if valid_lens.dim() == 1:
            valid_lens = valid_lens[:, None].expand(-1, scores.shape[-2])
        mask = torch.arange(scores.shape[-1], device=scores.device) < valid_lens[..., None]
    has_key = mask.any(-1)  # (B, Q)
    masked = scores.masked_fill(~mask & has_key[..., None], float("-inf"))
    masked = masked.masked_fill(~has_key[..., None], 0.0)
    return masked.log_softmax(-1), mask, has_key


@dataclass
class LocationSample:
    """Sampled locations of Q queries and what REINFORCE needs of them.

    Attributes:
        weights: (B, Q, K) float, one-hot on s̃ (all zero for a query without valid keys);
            no gradient.
        log_prob: (B, Q) float, log p(s̃ | a), differentiable w.r.t. the scores.
        entropy: (B, Q) float, H[p(· | a)] = −Σ_s p log p over the valid keys, differentiable.
        score_grad_sq: (B, Q) float, ‖∂log p(s̃ | a)/∂scores‖² = ‖onehot(s̃) − p‖², no gradient
            (:func:`score_function_loss` reports the estimator's variance from it).
    """

    weights: torch.Tensor
    log_prob: torch.Tensor
    entropy: torch.Tensor
    score_grad_sq: torch.Tensor

    @staticmethod
    def cat(samples: list[LocationSample]) -> LocationSample:
        """The samples of consecutive decoding steps as one, along Q."""
        return LocationSample(
            *(torch.cat([getattr(s, f) for s in samples], 1) for f in LocationSample.__dataclass_fields__)
        )


def sample_location(
    scores: torch.Tensor, valid_lens: torch.Tensor | None, generator: torch.Generator | None = None
) -> LocationSample:
    """Draw one key per query from p(s | a) = masked_softmax(scores) (Xu et al. 2015, sec. 4.1).

    The draw is the Gumbel-max trick: s̃ = arg-max over the valid keys of scores + g,
    g ~ Gumbel(0, 1) (:func:`gumbel_noise`), which is exactly a sample of the softmax; the
    arg-max is :func:`~attnlab.models.attention.masked_hardmax`, so padding keys are never drawn.

    Args:
        scores: (B, Q, K) float attention scores (logits).
        valid_lens: ``None``, (B,) or (B, Q) int: keys past it are padding.
        generator: the random source of the noise (``None``: torch's global one).
    Returns:
        :class:`LocationSample`; a query with no valid key gets zero weights, log-prob and entropy.
    """
    log_p, mask, has_key = _masked_log_probs(scores, valid_lens)
    weights = masked_hardmax(scores.detach() + gumbel_noise(scores, generator), valid_lens)  # (B, Q, K)
    chosen = weights.argmax(-1, keepdim=True)  # (B, Q, 1)
    zero = torch.zeros((), dtype=log_p.dtype, device=log_p.device)
    log_prob = torch.where(has_key, log_p.gather(-1, chosen).squeeze(-1), zero)  # (B, Q)
    p = log_p.exp() * has_key[..., None]  # (B, Q, K), 0 at padding keys
    entropy = -(p * log_p.masked_fill(~mask, 0.0)).sum(-1)  # (B, Q)
    with torch.no_grad():
        score_grad_sq = ((weights - p) ** 2).sum(-1)  # (B, Q)
    return LocationSample(weights, log_prob, entropy, score_grad_sq)


class _StraightThrough(torch.autograd.Function):
    """Forward: ``hard`` exactly; backward: the incoming gradient goes to ``soft`` unchanged."""

    @staticmethod
    def forward(ctx, hard, soft):
        return hard.clone()

    @staticmethod
    def backward(ctx, grad):
        return None, grad


def straight_through_gumbel(
    scores: torch.Tensor,
    valid_lens: torch.Tensor | None,
    tau: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Straight-through Gumbel-softmax weights (Jang et al. 2017, sec. 2.2, "Straight-Through").

    Forward: the one-hot of arg-max over the valid keys of scores + g (a sample of
    masked_softmax(scores), as in :func:`sample_location`), exactly 0 and 1. Backward: the
    gradient of y = masked_softmax((scores + g) / τ) with the same g. Unlike
    ``F.gumbel_softmax(hard=True)``, padding keys are masked (never chosen, no gradient) and
    the forward values are exact (``hard − soft.detach() + soft`` can round 1 to 1 − 2⁻²⁴).

    Args:
        scores: (B, Q, K) float; valid_lens: ``None``, (B,) or (B, Q) int.
        tau: temperature τ > 0 of the backward softmax.
        generator: the random source of g (``None``: torch's global one).
    Returns:
        (B, Q, K) weights of ``scores``' dtype; all zero (and no gradient) for a query with
        no valid key.
    Raises:
        ValueError: ``tau`` ≤ 0.
    """
    if not tau > 0:
        raise ValueError(f"the Gumbel-softmax temperature must be > 0, got tau={tau}")
    noisy = scores + gumbel_noise(scores, generator)  # (B, Q, K)
    soft = masked_softmax(noisy / tau, valid_lens)
    hard = masked_hardmax(noisy, valid_lens)
    return _StraightThrough.apply(hard, soft)


class MovingAverageBaseline(nn.Module):
    """b ← m b + (1 − m) r̄, the baseline of Xu et al. 2015, sec. 4.1 (m = 0.9 there).

    ``value`` (a 0-dim float32 buffer, so it is saved and restored with the checkpoint)
    starts as NaN, and the first :meth:`update` sets it to that batch's mean reward: a start at
    0 would make the first advantages the whole log-likelihood (tens of nats).
    """

    value: torch.Tensor

    def __init__(self, momentum: float = 0.9):
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"baseline momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.register_buffer("value", torch.tensor(float("nan")))

    @torch.no_grad()
    def update(self, reward_mean: torch.Tensor) -> None:
        """Fold a batch's mean reward (0-dim) into the average."""
        r = reward_mean.to(self.value)
        new = r if torch.isnan(self.value) else self.momentum * self.value + (1 - self.momentum) * r
        self.value.copy_(new)


@torch.no_grad()
def sentence_log_likelihood(
    features: torch.Tensor,
    output_layer: nn.Linear,
    tgt_out: torch.Tensor,
    keep: torch.Tensor,
    chunk: int = 512,
) -> torch.Tensor:
    """log p(y | s̃, a) of each sentence: Σ_t log softmax(output_layer(features_t))[y_t] over kept tokens.

    Args:
        features: (B, T, d) float, the output layer's inputs of a teacher-forced pass.
        output_layer: d → V.
        tgt_out: (B, T) int64 targets; keep: (B, T) bool, the tokens to count (not padding).
        chunk: tokens per chunk (the largest temporary is chunk × V floats).
    Returns:
        (B,) float32, no gradient; computed in float32 with autocast off.
    """
    rows = keep.nonzero()[:, 0]  # sentence of each kept token
    h, y = features[keep], tgt_out[keep]  # (N, d), (N,)
    ll = torch.zeros(features.shape[0], dtype=torch.float32, device=features.device)
    weight, bias = output_layer.weight.float(), output_layer.bias
    with torch.autocast(features.device.type, enabled=False):
        for start in range(0, h.shape[0], chunk):
            z = nn.functional.linear(
                h[start : start + chunk].float(), weight, None if bias is None else bias.float()
            )
            token_ll = z.log_softmax(-1).gather(1, y[start : start + chunk, None]).squeeze(1)
            ll.index_add_(0, rows[start : start + chunk], token_ll)
    return ll


def score_function_loss(
    reward: torch.Tensor,
    sample: LocationSample,
    keep: torch.Tensor,
    baseline: MovingAverageBaseline,
    reinforce_weight: float,
    entropy_weight: float,
    num_tokens: int | torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The surrogate whose gradient is Xu et al.'s REINFORCE and entropy terms, and its metrics.

        surrogate = −1/N_tok Σ_n [ λ_r (r_n − b) Σ_t log p(s̃_{n,t} | a) + λ_e Σ_t H_{n,t} ]

    summed over the kept steps t; r_n = log p(yⁿ | s̃ⁿ, a) is a constant (no gradient), b the
    baseline *before* this batch updates it. Divided by N_tok, the number of target tokens, like
    the token-mean cross-entropy it is added to, so the three terms keep Xu et al.'s proportions.
    Its value is not a loss (its gradient is what counts); afterwards ``baseline`` is updated
    with the batch's mean r_n.

    Args:
        reward: (B,) float, r_n (:func:`sentence_log_likelihood`).
        sample: the pass's :class:`LocationSample`, (B, T) fields.
        keep: (B, T) bool, the steps that predict a real target token.
        baseline: the moving average b.
        reinforce_weight, entropy_weight: λ_r, λ_e ≥ 0.
        num_tokens: N_tok (> 0).
    Returns:
        (surrogate (0-dim), metrics): ``reinforce_reward`` (mean r_n, nats per sentence),
        ``reinforce_baseline`` (b used), ``attention_entropy`` (mean H_t per kept step, nats) and
        ``reinforce_grad_var``: the variance (unbiased, over the B sentences) of the norm of each
        sentence's score-function gradient with respect to the attention scores,
        ‖g_n‖ = λ_r |r_n − b| (Σ_t ‖onehot(s̃_{n,t}) − p_{n,t}‖²)^½ (every parameter's REINFORCE
        gradient passes through these scores). 0 for a batch of one sentence.
    """
    mask = keep.to(sample.log_prob.dtype)
    b = reward.mean() if torch.isnan(baseline.value) else baseline.value.to(reward)
    advantage = (reward - b).detach()  # (B,)
    log_prob = (sample.log_prob * mask).sum(1)  # (B,) log p(s̃ⁿ | a)
    entropy = (sample.entropy * mask).sum(1)  # (B,) H[s̃ⁿ]
    surrogate = -(reinforce_weight * advantage * log_prob + entropy_weight * entropy).sum() / num_tokens
    with torch.no_grad():
        grad_norm = reinforce_weight * advantage.abs() * (sample.score_grad_sq * mask).sum(1).sqrt()
        metrics = {
            "reinforce_reward": reward.mean(),
            "reinforce_baseline": b.detach().clone(),
            "attention_entropy": entropy.sum() / mask.sum().clamp_min(1),
            "reinforce_grad_var": grad_norm.var() if grad_norm.numel() > 1 else grad_norm.new_zeros(()),
        }
    baseline.update(reward.mean())
    return surrogate, metrics
