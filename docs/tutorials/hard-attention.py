# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Soft and hard attention: why hard attention needs reinforcement learning
#
# *English* · [中文](../../tutorials/hard-attention.zh/)
#
# *Dive into Deep Learning* section **11.1 "Queries, Keys, and Values"** contrasts two ways of
# using attention weights: **soft** attention returns a weighted mean of all values, so every key
# contributes and everything is differentiable; when exactly one weight is 1 and the others 0,
# the lookup **selects** one key and returns its value alone, as a database query does: that is
# **hard** attention. (The Chinese edition's 10.1 注意力提示 introduces the same idea of cues that
# select what to attend to; it has no section on hard attention.) Xu et al. 2015, "Show, Attend and
# Tell", section 4, trains both: the deterministic soft attention (4.2) by backpropagation, and
# the stochastic hard attention (4.1) with the REINFORCE (score-function) estimator, because a
# selection has no gradient. Jang et al. 2017 and Maddison et al. 2017 later gave a second way,
# the (straight-through) Gumbel-softmax. This page works through all of it with attnlab's own
# code (`attnlab.models.masked_softmax`, `masked_hardmax` and `attnlab.models.hard_attention`),
# and every claim below is computed on the page and checked with an `assert`; the site runs the
# page when it is built, and the tests run it too (`tests/test_tutorials.py`), so a claim that
# stops being true fails CI.
#
# You will:
#
# 1. compare soft weights with the arg-max one-hot on one query, and their outputs;
# 2. see why the one-hot choice passes no gradient to the scores;
# 3. estimate that missing gradient with REINFORCE, and shrink its variance with a baseline;
# 4. use the straight-through Gumbel-softmax instead, and measure what it trades;
# 5. train a toy "which key holds the answer" model four ways (soft, arg-max, REINFORCE,
#    Gumbel) and watch which of them learn;
# 6. find the same switches in attnlab's Bahdanau translation model.
#
# See also the [attention cues tutorial](../../tutorials/cues/) for section 11.1's vocabulary.
#
# **Running time.** The page times itself: its last cell prints how long the run shown here
# took (the full mode). The fast mode (`ATTNLAB_TUTORIAL_FAST=1`, what CI runs) draws fewer
# samples, trains fewer steps on fewer seeds and checks the same assertions. No GPU, data set or
# trained model is needed. To run it yourself: `python docs/tutorials/hard-attention.py`, or
# open it in Jupyter with [jupytext](https://jupytext.readthedocs.io/).

# %%
import math
import os
import time

import matplotlib.pyplot as plt
import torch
from scipy import stats
from torch import nn

from attnlab.analysis.provenance import git_commit
from attnlab.models import masked_hardmax, masked_softmax
from attnlab.models.hard_attention import (
    MovingAverageBaseline,
    gumbel_noise,
    sample_location,
    score_function_loss,
    straight_through_gumbel,
)

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # fewer samples and seeds, same assertions
torch.manual_seed(0)
torch.set_num_threads(1)  # the tensors here are tiny: one thread is the fastest
print("mode:", "fast" if FAST else "full")

# %% [markdown]
# ## 1. Soft weights and a one-hot choice
#
# One query, five keys. The scores $a(\mathbf q, \mathbf k_i)$ are given; each key's value is a
# point in the plane. Soft attention weights the values by $\boldsymbol\alpha =
# \operatorname{softmax}(\mathbf a)$; hard attention at inference puts weight 1 on the
# best-scoring key, `masked_hardmax`, and 0 elsewhere.

# %%
values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 1.0], [0.5, -1.0]])  # (K, 2)
scores = torch.tensor([[[0.3, 1.0, 1.2, -0.5, 0.1]]])  # (batch 1, query 1, K = 5 keys)
soft = masked_softmax(scores, None)  # (1, 1, 5)
hard = masked_hardmax(scores, None)
soft_out, hard_out = soft @ values, hard @ values  # (1, 1, 2) each
print("soft weights:", soft[0, 0].numpy().round(3), "-> output", soft_out[0, 0].numpy().round(3))
print("hard weights:", hard[0, 0].numpy(), "-> output", hard_out[0, 0].numpy())

# %%
assert torch.all(soft > 0) and torch.allclose(soft.sum(-1), torch.ones(1, 1))  # every key counts
assert torch.allclose(soft, torch.softmax(scores, -1))
best = scores[0, 0].argmax().item()
assert best == 2 and hard[0, 0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]  # exactly one-hot on the arg-max
assert torch.equal(hard_out[0, 0], values[best])  # hard: the chosen value itself
assert torch.allclose(soft_out[0, 0], (soft[0, 0, :, None] * values).sum(0))  # soft: the weighted mean
assert all(not torch.allclose(soft_out[0, 0], v, atol=0.05) for v in values)  # a blend, no key's value
# padding is never chosen: with only the first 2 keys valid, the best valid key is key 1
assert masked_hardmax(scores, torch.tensor([2]))[0, 0].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
keys = torch.arange(5)
ax1.bar(keys - 0.2, soft[0, 0], width=0.4, label="soft: softmax")
ax1.bar(keys + 0.2, hard[0, 0], width=0.4, label="hard: arg-max one-hot")
ax1.set(xlabel="key", ylabel="attention weight", xticks=keys.tolist())
ax1.legend(loc="upper left")
ax2.scatter(values[:, 0], values[:, 1], c="gray", label="values")
for i, (x, y) in enumerate(values.tolist()):
    ax2.annotate(f"v{i}", (x, y), textcoords="offset points", xytext=(5, 5))
ax2.scatter(*soft_out[0, 0], marker="s", s=80, label="soft output")
ax2.scatter(*hard_out[0, 0], marker="*", s=200, label="hard output")
ax2.set(xlabel="value dim 0", ylabel="value dim 1", xlim=(-1.5, 2.6), ylim=(-1.5, 2.6))
ax2.legend(loc="lower right")
plt.show()

# %% [markdown]
# ## 2. Why the one-hot choice has no gradient
#
# Training means nudging the scores (and the parameters that make them) so that the output
# improves. The soft weights move smoothly with the scores:
# $\partial\alpha_i/\partial a_j = \alpha_i(\delta_{ij} - \alpha_j)$, the Jacobian
# $\operatorname{diag}(\boldsymbol\alpha) - \boldsymbol\alpha\boldsymbol\alpha^\top$, whose entries
# are all non-zero. The one-hot weights come from an arg-max, an integer: `masked_hardmax` builds
# them outside the autograd graph, so they carry no `grad_fn`, and a backward pass reaches the
# chosen *value* but never the *scores*.

# %%
s = scores.clone().requires_grad_()
v = values.clone().requires_grad_()
hard = masked_hardmax(s, None)
print("hard weights: requires_grad =", hard.requires_grad, ", grad_fn =", hard.grad_fn)
(hard @ v).sum().backward()
print("scores.grad:", s.grad, "\nvalues.grad:\n", v.grad)

# %%
assert hard.grad_fn is None and not hard.requires_grad
assert s.grad is None  # the scores get no gradient at all
assert torch.equal(v.grad[best], torch.ones(2)) and torch.all(v.grad[torch.arange(5) != best] == 0)

a = scores[0, 0].double()
alpha = torch.softmax(a, -1)
J_soft = torch.autograd.functional.jacobian(lambda x: masked_softmax(x.view(1, 1, -1), None).flatten(), a)
J_hard = torch.autograd.functional.jacobian(lambda x: masked_hardmax(x.view(1, 1, -1), None).flatten(), a)
assert torch.allclose(J_soft, torch.diag(alpha) - torch.outer(alpha, alpha), atol=1e-12)
assert torch.all(J_soft != 0)  # every score moves every soft weight
assert torch.all(J_hard == 0)  # no score moves a hard weight (as autograd sees it)
print("softmax Jacobian = diag(α) − ααᵀ, all entries non-zero; hardmax Jacobian: all zero")

# %% [markdown]
# Autograd is not hiding a gradient that exists: the arg-max is **piecewise constant** in the
# scores. Move the score $a_0$ of key 0 from $-1$ to $2$ and keep the others fixed (key 2 leads
# with $a_2 = 1.2$). The hard output stays $\mathbf v_2$ until $a_0$ reaches $1.2$, then jumps to
# $\mathbf v_0$ (at the tie itself the lowest index wins). A finite difference
# $(f(a_0 + h) - f(a_0 - h))/2h$ of $f = $ the sum of the output's two coordinates is therefore
# exactly 0 everywhere except within $h$ of the tie, where it is a jump divided by $2h$: no
# direction to follow. The soft output's finite difference matches autograd and is never 0.

# %%
H_FD = 1e-4
grid = torch.linspace(-1.0, 2.0, 301, dtype=torch.float64)
tie = scores[0, 0, 2].double().item()
vals64 = values.double()


def output_sum(a0: torch.Tensor, weights_fn) -> torch.Tensor:
    """f(a_0): the sum of the attention output's coordinates as a function of key 0's score, (n,)."""
    sc = scores.double().expand(len(a0), 1, 5).clone()
    sc[:, 0, 0] = a0
    return (weights_fn(sc, None) @ vals64).sum((-1, -2))


fd = {}
for name, fn in (("hard", masked_hardmax), ("soft", masked_softmax)):
    fd[name] = (output_sum(grid + H_FD, fn) - output_sum(grid - H_FD, fn)) / (2 * H_FD)
near_tie = (grid - tie).abs() <= H_FD
print("grid points within h of the tie:", int(near_tie.sum()))
assert torch.all(fd["hard"][~near_tie] == 0)  # piecewise constant: derivative exactly 0
# the jump at the tie: from v2 (sum 4) to v0 (sum 1)
eps = 1e-9
left, at, right = output_sum(torch.tensor([tie - eps, tie, tie + eps], dtype=torch.float64), masked_hardmax)
assert left.item() == vals64[2].sum().item() == 4.0 and at.item() == right.item() == vals64[0].sum().item()
# soft: the finite difference is autograd's derivative, and it is never 0 on the grid
a0 = grid.clone().requires_grad_()
(d_soft,) = torch.autograd.grad(output_sum(a0, masked_softmax).sum(), a0)
assert torch.allclose(fd["soft"], d_soft, atol=1e-6) and torch.all(d_soft.abs() > 1e-3)

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
ax1.plot(grid, output_sum(grid, masked_softmax), label="soft")
ax1.plot(grid, output_sum(grid, masked_hardmax), label="hard (arg-max)")
ax1.set(xlabel="score $a_0$ of key 0", ylabel="$f$ = sum of the output")
ax2.plot(grid, d_soft, label="soft")
ax2.plot(grid[~near_tie], fd["hard"][~near_tie], ".", markersize=3, label="hard (finite difference)")
ax2.axvline(tie, color="gray", linestyle=":", label="tie: a jump")
ax2.set(xlabel="score $a_0$ of key 0", ylabel="$df/da_0$")
for ax in (ax1, ax2):
    ax.legend()
plt.show()

# %% [markdown]
# ## 3. REINFORCE: the score-function estimator
#
# Xu et al. make the choice *stochastic*: the location $s$ is drawn from the attention
# distribution $p_\theta(s) = \operatorname{softmax}(\mathbf a)_s$, and training maximizes the
# *expected* reward $\mathbb E_{s\sim p_\theta}[f(s)]$ (for them $f$ is the log-likelihood of the
# caption). The expectation is a smooth function of $\theta$ even though each draw is not, and its
# gradient can be estimated from draws alone:
#
# $$\nabla_\theta\, \mathbb E_{s\sim p_\theta}[f(s)] = \sum_s f(s)\,\nabla_\theta p_\theta(s)
# = \sum_s p_\theta(s)\, f(s)\, \nabla_\theta \log p_\theta(s)
# = \mathbb E_{s\sim p_\theta}\!\left[f(s)\,\nabla_\theta \log p_\theta(s)\right].$$
#
# For logits $\mathbf a$, $\nabla_{\mathbf a}\log p(s) = \mathbf e_s - \mathbf p$ (one-hot minus
# probabilities). attnlab's `sample_location` draws $s$ and keeps $\log p(s)$;
# `score_function_loss` is a *surrogate*, $-\lambda_r (f(s) - b)\log p(s) - \lambda_e H$ averaged
# over the draws, whose gradient is the estimate (with $\lambda_r = 1$, $\lambda_e = 0$, and a
# baseline $b$ we come to below).
#
# A tiny categorical: four locations with logits $\mathbf a$ and rewards $f$ that, like
# log-likelihoods, are all far below 0. The exact gradient is
# $\nabla_{\mathbf a}\,\mathbb E[f] = \mathbf p \odot (f - \mathbf p^\top f)$.

# %%
logits = torch.tensor([0.3, -0.2, 0.8, 0.0], dtype=torch.float64)
reward_of = torch.tensor([-20.0, -18.0, -23.0, -19.5], dtype=torch.float64)  # f(s), s = 0..3
p = torch.softmax(logits, 0)
exact = p * (reward_of - (p * reward_of).sum())
print("p =", p.numpy().round(4), " E[f] =", round((p * reward_of).sum().item(), 4))
print("exact gradient of E[f]:", exact.numpy().round(4))


def reinforce_estimate(n: int, b: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The surrogate's gradient over n draws with baseline b, and the n per-draw estimates (n, 4)."""
    z = logits.clone().requires_grad_()
    sample = sample_location(z.expand(n, 1, 4), None, torch.Generator().manual_seed(seed))
    reward = sample.weights[:, 0] @ reward_of  # (n,) f of each drawn location
    baseline = MovingAverageBaseline()
    baseline.value.fill_(b)
    surrogate, _ = score_function_loss(
        reward, sample, torch.ones(n, 1, dtype=torch.bool), baseline, 1.0, 0.0, n
    )
    (-surrogate).backward()  # minus: the surrogate is minimized, the reward maximized
    per_draw = (reward - b)[:, None] * (sample.weights[:, 0] - p)  # f(s) − b times ∇ log p(s)
    return z.grad, per_draw


def exact_variance(b: float) -> float:
    """tr Cov of one draw's estimate: Σ_s p_s (f_s − b)² ‖e_s − p‖² − ‖∇E[f]‖²."""
    sq = ((torch.eye(4, dtype=torch.float64) - p) ** 2).sum(1)
    return ((p * (reward_of - b) ** 2 * sq).sum() - (exact**2).sum()).item()


# %% [markdown]
# First, that the surrogate's gradient is exactly the average of $f(s)\,(\mathbf e_s - \mathbf
# p)$ over the draws, and that it converges to the exact gradient: its error shrinks like
# $1/\sqrt N$, with the standard deviation $\sqrt{\operatorname{tr}\Sigma / N}$ computed exactly
# from the distribution (no baseline, $b = 0$). We assert every error lies within 4 of these
# standard deviations, and at the largest $N$ each coordinate within 4 standard errors measured
# from the draws themselves.

# %%
NS = [10, 100, 1_000, 10_000] + ([20_000] if FAST else [100_000, 400_000])
errors = []
for n in NS:
    grad, per_draw = reinforce_estimate(n, 0.0, seed=n)
    assert torch.allclose(grad, per_draw.mean(0), atol=1e-10)  # the surrogate is the estimator
    errors.append((grad - exact).norm().item())
    sd = math.sqrt(exact_variance(0.0) / n)
    print(f"N = {n:>7}: |estimate − exact| = {errors[-1]:.4f}  (expected about {sd:.4f})")
    assert errors[-1] < 4 * sd
assert errors[-1] < errors[0] / 10  # 2000 times the draws: about 45 times smaller
se = per_draw.std(0) / math.sqrt(NS[-1])
assert torch.all((grad - exact).abs() < 4 * se), (grad - exact) / se
print("largest N: estimate", grad.numpy().round(4), "within 4 SE of the exact", exact.numpy().round(4))

# %% [markdown]
# ### A baseline: unbiased, and much less variance
#
# Since $\sum_s p_\theta(s) = 1$, $\;\mathbb E[b\,\nabla_\theta\log p_\theta(s)] = b\,\nabla_\theta
# \sum_s p_\theta(s) = 0$ for any $b$ that does not depend on the draw: subtracting $b$ from the
# reward leaves the estimate unbiased. It changes the variance, though: with rewards around
# $-20$, each draw's estimate without a baseline is $\approx -20\,(\mathbf e_s - \mathbf p)$, a
# large vector whose direction is mostly noise. With $b$ near $\mathbb E[f]$ only the *difference*
# between locations is left. The variance $\operatorname{tr}\Sigma(b)$ is a parabola in $b$;
# we compute it exactly and measure it at $b = 0$ and $b = \mathbb E[f]$.

# %%
N_VAR = 20_000 if FAST else 200_000
mean_reward = (p * reward_of).sum().item()
measured = {}
for b in (0.0, mean_reward):
    grad, per_draw = reinforce_estimate(N_VAR, b, seed=7)
    se = per_draw.std(0) / math.sqrt(N_VAR)
    assert torch.all((grad - exact).abs() < 4 * se), (b, (grad - exact) / se)  # unbiased, whatever b
    sq_dev = ((per_draw - per_draw.mean(0)) ** 2).sum(1)  # (N,) per-draw squared deviation
    measured[b] = sq_dev.mean().item()
    var_se = (sq_dev.std() / math.sqrt(N_VAR)).item()
    print(f"b = {b:8.3f}: tr Σ measured {measured[b]:8.4f} ± {var_se:.4f}, exact {exact_variance(b):8.4f}")
    assert abs(measured[b] - exact_variance(b)) < 5 * var_se
ratio = measured[mean_reward] / measured[0.0]
print(f"variance with b = E[f] is {ratio:.1%} of the variance without a baseline")
assert measured[mean_reward] < measured[0.0] and ratio < 0.05

# %%
bs = torch.linspace(-30, 5, 141, dtype=torch.float64)
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(bs, [exact_variance(b) for b in bs.tolist()], label=r"exact tr $\Sigma(b)$")
ax.plot(list(measured), list(measured.values()), "o", label="measured")
ax.axvline(mean_reward, color="gray", linestyle=":", label=r"$b = \mathbb{E}[f]$")
ax.set(xlabel="baseline $b$", ylabel="variance of one draw's estimate", yscale="log")
ax.legend()
plt.show()

# %% [markdown]
# $\mathbb E[f]$ is unknown during training. Xu et al. keep a moving average of the rewards seen,
# $b \leftarrow 0.9\,b + 0.1\,\bar r$; attnlab's `MovingAverageBaseline` starts at the first
# batch's mean reward, and `score_function_loss` updates it after every batch. Over batches of 64
# draws it settles at $\mathbb E[f]$, within a few of its own standard deviations, which for the
# average of i.i.d. batch means is $\sqrt{(1-m)/(1+m)}\;\sigma_f/\sqrt{64}$ with $m = 0.9$:

# %%
baseline = MovingAverageBaseline(momentum=0.9)
gen = torch.Generator().manual_seed(3)
history = []
for _ in range(80):
    z = logits.clone().requires_grad_()
    sample = sample_location(z.expand(64, 1, 4), None, gen)
    keep = torch.ones(64, 1, dtype=torch.bool)
    score_function_loss(sample.weights[:, 0] @ reward_of, sample, keep, baseline, 1.0, 0.0, 64)
    history.append(baseline.value.item())
sigma_f = math.sqrt((p * (reward_of - mean_reward) ** 2).sum().item())
sd_b = math.sqrt(0.1 / 1.9) * sigma_f / 8
print(f"baseline after 80 batches: {history[-1]:.3f}; E[f] = {mean_reward:.3f}; its sd {sd_b:.3f}")
assert abs(history[-1] - mean_reward) < 4 * sd_b

# %% [markdown]
# ### The entropy bonus
#
# The third term of Xu et al.'s update, $\lambda_e\,\partial H/\partial\theta$, rewards a spread-out
# distribution, $H = -\sum_s p_s \log p_s$, so that sampling keeps exploring other locations
# instead of collapsing early on one. Its gradient with respect to the logits is $\partial
# H/\partial a_k = -p_k(\log p_k + H)$; the surrogate (with $\lambda_r = 0$) passes back exactly
# $-\lambda_e$ times it, and a gradient step on the surrogate raises the entropy:

# %%
LAMBDA_E = 0.1
z = logits.clone().requires_grad_()
sample = sample_location(z.view(1, 1, 4), None, torch.Generator().manual_seed(0))
reward = torch.tensor([-20.0], dtype=torch.float64)  # any reward: λ_r = 0 switches REINFORCE off
keep = torch.ones(1, 1, dtype=torch.bool)
surrogate, _ = score_function_loss(reward, sample, keep, MovingAverageBaseline(), 0.0, LAMBDA_E, 1)
surrogate.backward()
entropy = -(p * p.log()).sum()
dH = -p * (p.log() + entropy)
assert torch.allclose(z.grad, -LAMBDA_E * dH, atol=1e-12)
stepped = torch.softmax(logits - 1.0 * z.grad, 0)
entropy_after = -(stepped * stepped.log()).sum()
print(f"entropy {entropy.item():.4f} -> {entropy_after.item():.4f} nats after one step")
print(f"(the largest possible, uniform: log 4 = {math.log(4):.4f})")
assert entropy < entropy_after <= math.log(4)

# %% [markdown]
# ## 4. The straight-through Gumbel-softmax
#
# A second way around the missing gradient (Jang et al. 2017, section 2.2; Maddison et al.
# 2017). The **Gumbel-max trick** draws from $\operatorname{softmax}(\mathbf a)$ by adding
# independent Gumbel(0, 1) noise $g_i$ and taking the arg-max: $s = \arg\max_i (a_i + g_i)$.
# The **straight-through** estimator uses that one-hot sample in the forward pass and, in the
# backward pass, the gradient of the relaxed $\mathbf y = \operatorname{softmax}((\mathbf a +
# \mathbf g)/\tau)$ with the *same* noise. attnlab's `straight_through_gumbel` does this (and
# masks padding keys). We check all three statements, at three temperatures $\tau$: the forward
# is exactly one-hot and is the arg-max of $\mathbf a + \mathbf g$ (so it does not depend on
# $\tau$); the backward is autograd's gradient of the relaxed softmax; the samples follow
# $\mathbf p$ (a chi-square test on a fixed seed).

# %%
N_ST = 5_000 if FAST else 50_000
TAUS = (0.5, 1.0, 2.0)
gain = torch.tensor([1.0, 3.0, -2.0, 0.5], dtype=torch.float64)  # f(s) = gain_s: the output w · gain
exact_st = p * (gain - (p * gain).sum())  # the exact gradient of E[w · gain]
st_grads, st_samples = {}, {}
for tau in TAUS:
    z = logits.expand(N_ST, 1, 4).clone().requires_grad_()
    w = straight_through_gumbel(z, None, tau, torch.Generator().manual_seed(11))
    (w[:, 0] @ gain).sum().backward()
    g = gumbel_noise(z, torch.Generator().manual_seed(11))  # the same noise, drawn again
    assert torch.all((w == 0) | (w == 1)) and torch.all(w.sum(-1) == 1)  # exactly one-hot
    assert torch.equal(w.detach(), masked_hardmax(z.detach() + g, None))  # arg-max of a + g
    z_ref = z.detach().clone().requires_grad_()
    (masked_softmax((z_ref + g) / tau, None)[:, 0] @ gain).sum().backward()
    assert torch.allclose(z.grad, z_ref.grad, atol=1e-12)  # backward = relaxed softmax's gradient
    st_grads[tau], st_samples[tau] = z.grad[:, 0], w.detach()[:, 0]
# the forward pass does not depend on tau: the same noise gives the same samples at every tau
assert all(torch.equal(st_samples[tau], st_samples[1.0]) for tau in TAUS)
counts = st_samples[1.0].sum(0)
chi2 = stats.chisquare(counts.numpy(), (N_ST * p).numpy())
print(
    f"frequencies of {N_ST} samples {(counts / N_ST).numpy().round(3)} vs p {p.numpy().round(3)}: "
    f"chi-square p-value {chi2.pvalue:.3f}"
)
assert chi2.pvalue > 0.001

# %% [markdown]
# What does it trade? REINFORCE is unbiased (section 3); the straight-through gradient is not:
# its mean is the expected gradient of the relaxed softmax, not the gradient of $\mathbb E[f]$.
# In exchange it differentiates the output itself (through the relaxed weights) instead of
# weighting $\nabla\log p$ by the reward of a draw, so it needs no baseline. On the same
# categorical, with $f(s) = $ `gain[s]`, we measure the bias (in standard errors) and the
# variance at each $\tau$: a higher temperature gives a smoother, lower-variance gradient that
# is further from the truth.

# %%
bias, var = {}, {}
for tau in TAUS:
    g_tau = st_grads[tau]
    bias[tau] = (g_tau.mean(0) - exact_st).norm().item()
    var[tau] = g_tau.var(0).sum().item()
    z_scores = (g_tau.mean(0) - exact_st) / (g_tau.std(0) / math.sqrt(N_ST))
    print(
        f"tau = {tau}: |bias| = {bias[tau]:.4f} (largest {z_scores.abs().max().item():5.1f} SE), "
        f"variance {var[tau]:.4f}"
    )
    if tau >= 1.0:
        assert z_scores.abs().max() > 10  # a bias far beyond the noise
assert bias[0.5] < bias[1.0] < bias[2.0]  # lower temperature, less bias ...
assert var[0.5] > var[1.0] > var[2.0]  # ... and more variance

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
labels = [str(tau) for tau in TAUS]
ax1.bar(labels, [bias[tau] for tau in TAUS])
ax2.bar(labels, [var[tau] for tau in TAUS])
ax1.set(xlabel=r"temperature $\tau$", ylabel="|mean gradient − exact gradient|")
ax2.set(xlabel=r"temperature $\tau$", ylabel="variance (trace) of one gradient")
plt.show()

# %% [markdown]
# ## 5. A toy task: which key holds the answer?
#
# Now the four ways train a model. Each example has $K = 8$ keys $\mathbf k_i$ and values
# $\mathbf v_i$ (random vectors in $\mathbb R^8$) and a query that describes one of the keys,
# $\mathbf q = A\mathbf k_{i^*} + \text{noise}$ with a fixed random rotation $A$ the model does
# not know. The answer is that key's value, $\mathbf y = \mathbf v_{i^*}$. The model scores
# $a_i = \mathbf q^\top W\mathbf k_i$ with a learnable $W$ (the scoring layer), attends, and
# passes the attended value through a learnable output layer $U$; the loss is the squared error
# $\|U(\text{attended}) - \mathbf y\|^2$. **Accuracy** is the share of held-out examples whose
# best-scoring key is $i^*$ (chance: $1/8$). The four ways differ only in the attention weights:
#
# - **soft**: `masked_softmax(scores)`, trained by backpropagation;
# - **arg-max**: `masked_hardmax(scores)`: $U$ still learns, but $W$ gets no gradient;
# - **REINFORCE**: a location drawn by `sample_location`; the loss plus `score_function_loss`
#   with reward $-\text{error}$, the moving-average baseline and $\lambda_e = 0.01$ (attnlab's
#   `hard_reinforce` defaults);
# - **Gumbel**: `straight_through_gumbel(scores, tau=1)`.
#
# Each is trained from the same initial weights with Adam on every seed; the fast mode uses
# fewer seeds and steps and asserts the same on each seed.

# %%
K, D, BATCH, LR = 8, 8, 64, 0.02
SEEDS = range(3) if FAST else range(5)
STEPS = 200 if FAST else 300
EVAL_EVERY = 10
METHODS = ("soft", "arg-max", "REINFORCE", "Gumbel")


def draw_batch(A: torch.Tensor, gen: torch.Generator, n: int):
    """n examples: queries (n, 1, D), keys (n, K, D), values (n, K, D), answer index (n,)."""
    keys = torch.randn(n, K, D, generator=gen)
    values = torch.randn(n, K, D, generator=gen)
    target = torch.randint(K, (n,), generator=gen)
    queries = keys[torch.arange(n), target] @ A.T + 0.3 * torch.randn(n, D, generator=gen)
    return queries[:, None], keys, values, target


class Toy(nn.Module):
    """Scores q^T W k_i (the scoring layer W), then the output layer U on the attended value."""

    def __init__(self):
        super().__init__()
        self.W = nn.Linear(D, D, bias=False)
        self.U = nn.Linear(D, D)

    def scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return queries @ self.W(keys).transpose(1, 2)  # (n, 1, K)


def train(method: str, seed: int) -> dict:
    task = torch.Generator().manual_seed(1000 + seed)
    A = torch.linalg.qr(torch.randn(D, D, generator=task))[0]  # the hidden rotation
    held_out = draw_batch(A, task, 1000)
    torch.manual_seed(seed)  # the same initial model for the four methods
    model = Toy()
    W0, U0 = model.W.weight.detach().clone(), model.U.weight.detach().clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    baseline, noise = MovingAverageBaseline(), torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(2000 + seed)  # the same batches for the four methods

    def accuracy() -> float:
        with torch.no_grad():
            q, k, _, target = held_out
            return (model.scores(q, k)[:, 0].argmax(-1) == target).float().mean().item()

    accs, losses = [accuracy()], []
    for step in range(STEPS):
        q, k, v, target = draw_batch(A, data, BATCH)
        scores = model.scores(q, k)  # (BATCH, 1, K)
        if method == "soft":
            weights = masked_softmax(scores, None)
        elif method == "arg-max":
            weights = masked_hardmax(scores, None)
        elif method == "Gumbel":
            weights = straight_through_gumbel(scores, None, 1.0, noise)
        else:
            sample = sample_location(scores, None, noise)
            weights = sample.weights
        error = ((model.U((weights @ v)[:, 0]) - v[torch.arange(BATCH), target]) ** 2).sum(-1)  # (BATCH,)
        loss = error.mean()
        if method == "REINFORCE":
            keep = torch.ones(BATCH, 1, dtype=torch.bool)
            surrogate, _ = score_function_loss(-error.detach(), sample, keep, baseline, 1.0, 0.01, BATCH)
            loss = loss + surrogate
        optimizer.zero_grad()
        loss.backward()
        if method == "arg-max":
            assert model.W.weight.grad is None  # nothing reaches the scoring layer
        optimizer.step()
        losses.append(loss.item() if method != "REINFORCE" else error.mean().item())
        if (step + 1) % EVAL_EVERY == 0:
            accs.append(accuracy())
    return {
        "W0": W0,
        "acc": accs,
        "loss": losses,
        "W_unchanged": torch.equal(W0, model.W.weight),
        "U_unchanged": torch.equal(U0, model.U.weight),
    }


runs = {m: [train(m, seed) for seed in SEEDS] for m in METHODS}
print(f"{'seed':>4} " + " ".join(f"{m:>10}" for m in METHODS) + "   (held-out accuracy: start -> end)")
for i, seed in enumerate(SEEDS):
    cells = [f"{runs[m][i]['acc'][0]:.2f}->{runs[m][i]['acc'][-1]:.2f}" for m in METHODS]
    print(f"{seed:>4} " + " ".join(f"{c:>10}" for c in cells))

# %%
CHANCE = 1 / K
for i, seed in enumerate(SEEDS):
    start = runs["soft"][i]["acc"][0]
    assert all(torch.equal(runs[m][i]["W0"], runs["soft"][i]["W0"]) for m in METHODS)  # same start
    assert abs(start - CHANCE) < 0.15, (seed, start)  # an untrained scorer is near chance
    for m in ("soft", "REINFORCE", "Gumbel"):
        assert runs[m][i]["acc"][-1] > 0.6, (seed, m, runs[m][i]["acc"][-1])  # far above chance (0.125)
        assert not runs[m][i]["W_unchanged"]
    argmax = runs["arg-max"][i]
    assert argmax["W_unchanged"], seed  # the scoring layer's weights are bitwise the initial ones
    assert not argmax["U_unchanged"]  # while the output layer did train
    assert all(a == start for a in argmax["acc"]), (seed, argmax["acc"])  # stuck at its initial accuracy
    first, last = sum(argmax["loss"][:20]) / 20, sum(argmax["loss"][-20:]) / 20
    assert last < first, (seed, first, last)  # the output layer alone lowers the error a little
    mean_acc = {m: sum(runs[m][i]["acc"]) / len(runs[m][i]["acc"]) for m in METHODS}  # area under the curve
    assert mean_acc["REINFORCE"] < min(mean_acc["soft"], mean_acc["Gumbel"]), (seed, mean_acc)
print(
    f"on all {len(SEEDS)} seeds: soft, REINFORCE and Gumbel end above 0.6 (chance {CHANCE:.3f}); "
    "arg-max's scoring layer never changes and its accuracy stays where it started"
)

# %%
steps_axis = [0] + list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
for m in METHODS:
    acc = torch.tensor([r["acc"] for r in runs[m]]).mean(0)
    loss = torch.tensor([r["loss"] for r in runs[m]]).mean(0)
    smooth = torch.nn.functional.avg_pool1d(loss[None, None], 10, stride=1)[0, 0]  # moving mean over 10 steps
    ax1.plot(steps_axis, acc, label=m)
    ax2.plot(range(10, STEPS + 1), smooth, label=m)
ax1.axhline(CHANCE, color="gray", linestyle=":", label="chance")
ax1.set(xlabel="training step", ylabel="held-out accuracy", ylim=(0, 1))
ax2.set(xlabel="training step", ylabel="training squared error (10-step mean)")
ax1.legend()
ax2.legend()
fig.suptitle(f"mean over {len(SEEDS)} seeds")
plt.show()

# %% [markdown]
# The arg-max model's output layer learns what it can (its squared error falls a little), but its
# scorer never moves: it keeps attending to whichever key its random initial $W$ prefers. The
# three others learn the hidden rotation. On this toy REINFORCE climbs later than the two
# gradient-based ones (asserted on every seed: its mean accuracy over the run is the lowest of
# the three), as a noisier gradient would; how much later depends on the learning rate and the
# reward scale.
#
# ## 6. The same switches in a translation model
#
# attnlab's Bahdanau model (D2L 11.4 (zh 10.4)) has the same choice for its
# decoder's attention over the encoder states: `model.net.attention=soft` (the default, D2L's
# model), `hard_reinforce` (a sampled encoder state in training, trained by
# `score_function_loss` with the log-likelihood of the sentence as the reward, Xu et al.'s
# moving-average baseline and entropy bonus) or `hard_gumbel` (straight-through Gumbel-softmax);
# both hard kinds attend to the arg-max location at inference. `model.net.scoring=additive|dot`
# chooses the scoring function. To train them:
#
# ```bash
# python src/train.py model=bahdanau model.net.attention=hard_reinforce
# python src/train.py model=bahdanau model.net.attention=hard_gumbel
# ```
#
# The [ablations how-to](../../how-to/ablations/) runs the comparison with soft attention, and
# the trained models' scores appear on the [results](../../results/) pages. The settings
# (`reinforce_weight`, `entropy_weight`, `gumbel_tau`) are documented in the
# [API reference](../../reference/api/models/#attnlab.models.bahdanau.Bahdanau).

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
