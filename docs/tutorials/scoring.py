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
# # Scoring functions: why √d
#
# *English* · [中文](../../tutorials/scoring.zh/)
#
# This page follows *Dive into Deep Learning* section **11.3 "Attention Scoring Functions"**
# (Chinese edition 10.3 注意力评分函数) with attnlab's own code, and answers one question:
# **why does scaled dot-product attention divide the scores by $\sqrt{d}$?**
# Every claim below is computed on this page and checked with an `assert`; the site runs the
# page when it is built, and the tests run it too (`tests/test_tutorials.py`), so a claim that
# stops being true fails CI.
#
# You will:
#
# 1. mask a padded batch with `masked_softmax`;
# 2. time additive and scaled dot-product attention side by side;
# 3. measure why $\sqrt{d}$: the variance of $\mathbf q^\top\mathbf k$, what it does to the
#    softmax, and what it does to the softmax's gradient.
#
# **Running time.** The page times itself: its last cell prints
# how long the run shown here took (the full mode). The fast mode (`ATTNLAB_TUTORIAL_FAST=1`,
# what CI runs) takes fewer samples and checks the same assertions. No GPU, data set or trained
# model is needed. To run it yourself: `python docs/tutorials/scoring.py`, or open it in Jupyter
# with [jupytext](https://jupytext.readthedocs.io/).

# %%
import csv
import math
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch.utils import benchmark

import attnlab
from attnlab.analysis.provenance import git_commit
from attnlab.models import AdditiveAttention, DotProductAttention, masked_softmax

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # fewer samples, same assertions
torch.manual_seed(0)
ROOT = Path(attnlab.__file__).resolve().parents[2]  # the project: results/
print("mode:", "fast" if FAST else "full")

# %% [markdown]
# ## 1. Masked softmax on a padded batch
#
# A batch of sequences of different lengths is padded to one length. The padding positions
# are keys too, and an ordinary softmax would give them weight. `masked_softmax(X, valid_lens)`
# (D2L 11.3.2.1 (zh 10.3.1), "Masked Softmax Operation") gives every key past a sequence's valid length
# weight **exactly 0** and normalizes over the rest. Here are two samples of four keys, with
# two and three valid keys:

# %%
scores = torch.rand(2, 2, 4)  # (batch, queries, keys)
valid_lens = torch.tensor([2, 3])
weights = masked_softmax(scores, valid_lens)
print(weights)

# %%
keys = torch.arange(4)
masked = keys[None, None, :] >= valid_lens[:, None, None]  # True at padding, (2, 1, 4)
assert torch.all(weights[masked.expand_as(weights)] == 0)  # exactly 0, not merely small
assert torch.allclose(weights.sum(-1), torch.ones(2, 2))  # each query's weights sum to 1
print("masked keys get exactly 0; every row sums to 1")

# %% [markdown]
# `valid_lens` may also give one length per query, shape (batch, queries), as a decoder's
# causal mask does:

# %%
per_query = masked_softmax(scores, torch.tensor([[1, 3], [2, 4]]))
print(per_query)
assert torch.all(per_query[0, 0, 1:] == 0) and torch.all(per_query[0, 1, 3:] == 0)
assert torch.allclose(per_query.sum(-1), torch.ones(2, 2))

# %% [markdown]
# ## 2. Additive and scaled dot-product attention, side by side
#
# Both turn a query and a key into a score $a(\mathbf q, \mathbf k)$:
#
# - **additive attention** (D2L 11.3.4 (zh 10.3.2)) learns it with a one-hidden-layer MLP,
#   $\mathbf w_v^\top \tanh(\mathbf W_q\mathbf q + \mathbf W_k\mathbf k)$; queries and keys
#   may have different sizes;
# - **scaled dot-product attention** (D2L 11.3.3 (zh 10.3.3)) needs no parameters,
#   $\mathbf q^\top\mathbf k/\sqrt d$, but queries and keys must have the same size $d$.
#
# The additive score builds a hidden vector for every (query, key) pair, a
# (batch, queries, keys, hidden) tensor; the dot product is one batched matrix product. We time
# both over a small sweep of $d$ and of the sequence length $n$ (as many queries as keys), on
# one CPU thread with `torch.utils.benchmark`, with the hidden size of the additive MLP set to $d$:

# %%
BATCH = 4
MIN_RUN_TIME = 0.02 if FAST else 0.2  # seconds per measurement
rows = []
for d in (16, 64, 256):
    for n in (16, 128):
        q, k, v = torch.randn(BATCH, n, d), torch.randn(BATCH, n, d), torch.randn(BATCH, n, d)
        additive = AdditiveAttention(key_size=d, query_size=d, num_hiddens=d).eval()
        dot = DotProductAttention().eval()
        with torch.no_grad():
            assert additive(q, k, v).shape == dot(q, k, v).shape == (BATCH, n, d)
        times = {}
        for name, model in (("additive", additive), ("dot", dot)):
            timer = benchmark.Timer(
                stmt="with torch.no_grad(): model(q, k, v)",
                globals={"torch": torch, "model": model, "q": q, "k": k, "v": v},
                num_threads=1,
            )
            times[name] = timer.blocked_autorange(min_run_time=MIN_RUN_TIME).median
        rows.append((d, n, times["additive"], times["dot"]))

print(f"{'d':>4} {'n':>4} {'additive (ms)':>14} {'dot (ms)':>10} {'additive / dot':>15}")
for d, n, t_add, t_dot in rows:
    print(f"{d:>4} {n:>4} {t_add * 1e3:>14.3f} {t_dot * 1e3:>10.3f} {t_add / t_dot:>15.1f}")

# %% [markdown]
# The ratio is what to read, not the milliseconds, which depend on the machine. With $h = d$
# both scores cost $O(n^2 d)$ multiply-adds (the additive one also projects the queries and keys,
# $O(nd^2)$ more), so the big-O alone does not explain the ratio: the
# additive score builds an $n \times n \times h$ tensor of hidden vectors (memory traffic, a
# $\tanh$ on every entry, then a reduction), while the dot product is one matrix product that
# BLAS runs at full speed. How much that costs depends on $d$, on $n$ and on the machine, and so
# does the ratio: the table above is this build's measurement, not a shape to expect elsewhere.
# This is one reason the Transformer uses the dot product. (Only the output shapes are asserted
# above; a timing is no claim a test can hold on a shared machine.)
#
# ## 3. Why divide by √d
#
# ### The variance of $\mathbf q^\top\mathbf k$ grows like $d$
#
# D2L 11.3.1 (zh 10.3.3) assumes that the entries of a query $\mathbf q$ and a key $\mathbf k$ are
# independent with mean 0 and variance 1. Then $\mathbf q^\top\mathbf k = \sum_{i=1}^d q_i k_i$
# is a sum of $d$ independent terms, each of mean 0 and variance
# $\mathbb E[q_i^2]\,\mathbb E[k_i^2] = 1$, so
#
# $$\operatorname{Var}(\mathbf q^\top\mathbf k) = d, \qquad
# \operatorname{Var}\!\left(\frac{\mathbf q^\top\mathbf k}{\sqrt d}\right) = 1 .$$
#
# We measure it with $N$ samples for each $d$. How close must the measurement be? The sample
# variance $s^2$ of $N$ draws has standard error $\sqrt{(\mu_4 - \sigma^4)/N}$, with $\mu_4$ the
# fourth central moment. For $x = \mathbf q^\top\mathbf k$ with normal entries,
# $\mathbb E[q_i^4] = \mathbb E[k_i^4] = 3$ gives $\mu_4 = 3d^2 + 6d$, so
# $\mathrm{SE}(s^2) = \sqrt{(2d^2 + 6d)/N}$ (and $\sqrt{(2 + 6/d)/N}$ after dividing by
# $\sqrt d$). We assert every measurement lies within **5 standard errors** of $d$ and of 1.

# %%
DS = (4, 16, 64, 256)
N = 20_000 if FAST else 200_000  # samples of (q, k) per d

print(f"{'d':>4} {'Var(qk)':>10} {'5 SE':>8} {'Var(qk/sqrt d)':>15} {'5 SE':>7}")
var_unscaled, var_scaled = [], []
for d in DS:
    q, k = torch.randn(N, d, dtype=torch.float64), torch.randn(N, d, dtype=torch.float64)
    dots = (q * k).sum(-1)
    v_raw, v_scaled = dots.var().item(), (dots / math.sqrt(d)).var().item()
    se_raw, se_scaled = math.sqrt((2 * d**2 + 6 * d) / N), math.sqrt((2 + 6 / d) / N)
    print(f"{d:>4} {v_raw:>10.3f} {5 * se_raw:>8.3f} {v_scaled:>15.4f} {5 * se_scaled:>7.4f}")
    assert abs(v_raw - d) < 5 * se_raw, (d, v_raw)
    assert abs(v_scaled - 1) < 5 * se_scaled, (d, v_scaled)
    var_unscaled.append(v_raw)
    var_scaled.append(v_scaled)

# %%
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(DS, var_unscaled, "o-", label=r"$\mathbf{q}^\top\mathbf{k}$ (unscaled)")
ax.plot(DS, var_scaled, "s-", label=r"$\mathbf{q}^\top\mathbf{k}/\sqrt{d}$ (scaled)")
ax.plot(DS, DS, ":", color="gray", label="$d$")
ax.set(xscale="log", yscale="log", xlabel="$d$", ylabel="measured variance")
ax.set_xticks(DS, [str(d) for d in DS])
ax.legend()
plt.show()

# %% [markdown]
# ### Large scores saturate the softmax
#
# Why does a large variance matter? The softmax is not scale-free: multiplying the scores by
# $c$ sharpens it. With $n$ keys, unscaled scores have standard deviation $\sqrt d$ (16 at
# $d = 256$): the largest score then stands many units above the second, and the softmax puts
# nearly all the weight on one key, a near *hard* argmax. Scaled scores keep standard deviation
# 1 at every $d$.
#
# For each $d$ we draw one query and $n = 64$ keys many times, and compare the softmax of the
# unscaled scores with attnlab's `DotProductAttention`, which scales. We record the largest
# weight and the entropy $-\sum_j \alpha_j \log \alpha_j$ (at most $\log 64 \approx 4.16$,
# for uniform weights; 0 for one-hot weights).

# %%
KEYS = 64
TRIALS = 300 if FAST else 3_000


def draw(d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A query, KEYS keys and values per trial: (TRIALS, 1, d), (TRIALS, KEYS, d), (TRIALS, KEYS, 1)."""
    return torch.randn(TRIALS, 1, d), torch.randn(TRIALS, KEYS, d), torch.randn(TRIALS, KEYS, 1)


def entropy(w: torch.Tensor) -> torch.Tensor:
    return -(w * torch.log(w.clamp_min(1e-30))).sum(-1)


stats = {"unscaled": {"max": [], "entropy": []}, "scaled": {"max": [], "entropy": []}}
attention = DotProductAttention()
for d in DS:
    q, k, v = draw(d)
    unscaled = masked_softmax(q @ k.transpose(1, 2), None)  # (TRIALS, 1, KEYS)
    attention(q, k, v)
    scaled = attention.attention_weights
    # attnlab's DotProductAttention is exactly softmax(q kᵀ / √d)
    assert torch.allclose(scaled, torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), -1), atol=1e-6)
    for name, w in (("unscaled", unscaled), ("scaled", scaled)):
        stats[name]["max"].append(w.max(-1).values.mean().item())
        stats[name]["entropy"].append(entropy(w).mean().item())

print(f"{'d':>4} {'max weight: unscaled':>21} {'scaled':>7} {'entropy: unscaled':>18} {'scaled':>7}")
for i, d in enumerate(DS):
    u, s = stats["unscaled"], stats["scaled"]
    print(f"{d:>4} {u['max'][i]:>21.3f} {s['max'][i]:>7.3f} {u['entropy'][i]:>18.3f} {s['entropy'][i]:>7.3f}")

# %%
u, s = stats["unscaled"], stats["scaled"]
# unscaled: the largest weight grows towards 1 and the entropy falls towards 0 as d grows
assert all(a < b for a, b in zip(u["max"], u["max"][1:])), u["max"]
assert all(a > b for a, b in zip(u["entropy"], u["entropy"][1:])), u["entropy"]
# a clear gap at d = 256: the unscaled softmax is nearly one-hot, the scaled one is not
assert u["max"][-1] > 0.8 and s["max"][-1] < 0.3, (u["max"][-1], s["max"][-1])
assert u["entropy"][-1] < 0.5 and s["entropy"][-1] > 3.0, (u["entropy"][-1], s["entropy"][-1])
# scaled: the same softmax at every d
assert max(s["max"]) - min(s["max"]) < 0.05 and max(s["entropy"]) - min(s["entropy"]) < 0.15
# and not uniform: about half a nat below log 64 (log n − σ²/2 for many keys, scores of variance σ² = 1)
assert all(abs(math.log(KEYS) - 0.5 - e) < 0.15 for e in s["entropy"]), s["entropy"]

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
for name, marker in (("unscaled", "o-"), ("scaled", "s-")):
    ax1.plot(DS, stats[name]["max"], marker, label=name)
    ax2.plot(DS, stats[name]["entropy"], marker, label=name)
ax2.axhline(math.log(KEYS), color="gray", linestyle=":", label="uniform: log 64")
ax1.set(xscale="log", xlabel="$d$", ylabel="mean largest weight", ylim=(0, 1.05))
ax2.set(xscale="log", xlabel="$d$", ylabel="mean entropy (nats)")
for ax in (ax1, ax2):
    ax.set_xticks(DS, [str(d) for d in DS])
    ax.legend()
plt.show()

# %% [markdown]
# The scaled softmax is soft, but not uniform: its entropy stays about half a nat below
# $\log 64$ at every $d$ (asserted above). For scores $s_j$ of variance $\sigma^2$ and many keys,
# the normalizer is $Z = \sum_j e^{s_j} \approx n\,\mathbb E[e^s] = n e^{\sigma^2/2}$, and the
# entropy $\log Z - \sum_j \alpha_j s_j$ is about $\log n + \sigma^2/2 - \mathbb E[s e^s]/
# \mathbb E[e^s] = \log n - \sigma^2/2$: half a nat below $\log n$ when $\sigma^2 = 1$.
#
# ### A saturated softmax passes almost no gradient
#
# Saturation would be harmless if the model could still learn its way out. It cannot, because
# the gradient of the softmax vanishes where it saturates. For $\boldsymbol\alpha =
# \operatorname{softmax}(\mathbf s)$,
#
# $$\frac{\partial \alpha_i}{\partial s_j} = \alpha_i(\delta_{ij} - \alpha_j), \qquad
# J = \operatorname{diag}(\boldsymbol\alpha) - \boldsymbol\alpha\boldsymbol\alpha^\top :$$
#
# $\alpha_i(1-\alpha_i)$ on the diagonal, $-\alpha_i\alpha_j$ off it. First we check this
# formula against PyTorch's autograd:

# %%
s_small = torch.randn(5, dtype=torch.float64)
alpha = torch.softmax(s_small, -1)
J_formula = torch.diag(alpha) - torch.outer(alpha, alpha)
J_autograd = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s_small)
print(J_formula.numpy().round(4))
assert torch.allclose(J_formula, J_autograd, atol=1e-12)
print("diag(α) − ααᵀ matches torch.autograd.functional.jacobian")

# %% [markdown]
# If one weight is near 1 and the rest near 0, every entry of $J$ is near 0: $\alpha_i(1 -
# \alpha_i) \approx 0$ for all $i$, and so is every product $\alpha_i\alpha_j$. We measure it:
# for each $d$, the norm of the gradient that a loss $L = \sum_j \alpha_j v_j$ (random $v_j$)
# sends back to the scores, $\partial L/\partial \mathbf s = J\mathbf v$, unscaled and scaled,
# over the same kind of trials as above. We report the **median** over trials (the typical
# trial) and the share of trials whose gradient norm is below 0.01: the mean would be
# dominated by the few trials whose two best keys happen to score almost alike.

# %%
grad_median = {"unscaled": [], "scaled": []}
grad_tiny = {"unscaled": [], "scaled": []}  # share of trials with |dL/ds| < 0.01
for d in DS:
    q, k, v = draw(d)
    raw = q @ k.transpose(1, 2)  # (TRIALS, 1, KEYS)
    for name, s in (("unscaled", raw), ("scaled", raw / math.sqrt(d))):
        s = s.detach().requires_grad_()
        loss = (torch.softmax(s, -1) @ v).sum()  # trials are independent: one backward for all
        (g,) = torch.autograd.grad(loss, s)
        norms = g.norm(dim=-1).flatten()  # (TRIALS,)
        grad_median[name].append(norms.median().item())
        grad_tiny[name].append((norms < 0.01).float().mean().item())

print(f"{'d':>4} {'median |dL/ds|: unscaled':>25} {'scaled':>7} {'share < 0.01: unscaled':>23} {'scaled':>7}")
for i, d in enumerate(DS):
    gu, gs = grad_median["unscaled"][i], grad_median["scaled"][i]
    tu, ts = grad_tiny["unscaled"][i], grad_tiny["scaled"][i]
    print(f"{d:>4} {gu:>25.4f} {gs:>7.4f} {tu:>23.1%} {ts:>7.1%}")

# %%
gu, gs = grad_median["unscaled"], grad_median["scaled"]
assert gu[-1] < 0.2 * gs[-1], (gu[-1], gs[-1])  # at d = 256 the unscaled gradient has vanished
assert gu[1] > gu[2] > gu[3]  # and it keeps shrinking as d grows from 16
assert grad_tiny["unscaled"][-1] > 0.3 and max(grad_tiny["scaled"]) < 0.01, grad_tiny
assert min(gs) > 0.8 * max(gs)  # scaled: about the same gradient at every d
assert gu[0] > gs[0] and gu[1] > gs[1]  # at d = 4 and 16 the unscaled gradient is even larger

# %%
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(DS, gu, "o-", label="unscaled")
ax.plot(DS, gs, "s-", label="scaled")
ax.set(xscale="log", xlabel="$d$", ylabel=r"median $\|\partial L/\partial \mathbf{s}\|$")
ax.set_xticks(DS, [str(d) for d in DS])
ax.set_ylim(bottom=0)
ax.legend()
plt.show()

# %% [markdown]
# At small $d$ the unscaled scores are only a little wider than the scaled ones, and their
# gradient is even somewhat larger: a softmax learns best when its scores are spread neither
# too little nor too much. From $d = 16$ on, the unscaled gradient shrinks with every step of
# $d$; the scaled one stays where it is.

# %% [markdown]
# ### The gradient at the scores, and the gradient at the queries
#
# The gradient measured above is the softmax's own, taken at its input: $\partial L/\partial
# \mathbf s$. It is the one Vaswani et al. (2017) had in mind when they wrote that large dot
# products push "the softmax function into regions where it has extremely small gradients". The
# queries and keys learn from what the chain rule passes on from there: with $\mathbf s =
# c\,\mathbf K\mathbf q$ ($c = 1$ unscaled, $c = 1/\sqrt d$ scaled), $\partial L/\partial
# \mathbf q = c\,\mathbf K^\top \partial L/\partial\mathbf s$. The keys have norm about
# $\sqrt d$, and unscaled nothing divides by $\sqrt d$ again. We measure the median norm of
# $\partial L/\partial\mathbf q$ on the same kind of trials, with the same loss:

# %%
grad_q_median = {"unscaled": [], "scaled": []}  # median |dL/dq| over trials
for d in DS:
    q, k, v = draw(d)
    for name, c in (("unscaled", 1.0), ("scaled", 1 / math.sqrt(d))):
        q_leaf = q.detach().requires_grad_()
        loss = (torch.softmax(c * q_leaf @ k.transpose(1, 2), -1) @ v).sum()
        (g,) = torch.autograd.grad(loss, q_leaf)  # (TRIALS, 1, d)
        grad_q_median[name].append(g.norm(dim=-1).median().item())
gqu, gqs = grad_q_median["unscaled"], grad_q_median["scaled"]
ratio_q = [a / b for a, b in zip(gqu, gqs)]

print(f"{'d':>4} {'median |dL/dq|: unscaled':>25} {'scaled':>7} {'unscaled / scaled':>18}")
for i, d in enumerate(DS):
    print(f"{d:>4} {gqu[i]:>25.4f} {gqs[i]:>7.4f} {ratio_q[i]:>18.2f}")

# %%
assert all(a > b for a, b in zip(gqu[:-1], gqs[:-1])), (gqu, gqs)  # unscaled starts larger
assert ratio_q[1] > ratio_q[0], ratio_q  # and its lead first grows with d
assert ratio_q[-1] < 0.5 * max(ratio_q), ratio_q  # then saturation eats more than half of it
assert min(gqs) > 0.75 * max(gqs), gqs  # scaled: about the same gradient at every d

# %% [markdown]
# Unscaled, the gradient that reaches $\mathbf q$ is not divided by $\sqrt d$, so it starts
# larger than the scaled one, and its lead first grows with $d$. Then the saturated softmax eats
# it: at the largest $d$ less than half of its peak lead is left (asserted above; the table
# shows how much). So the $\sqrt d$ does not protect the size of the queries' and keys'
# gradient. It protects the softmax's own gradient $\partial L/\partial\mathbf s$, the signal
# that says which keys should get more of the attention and which less; a saturated softmax
# passes almost none of it, and a larger factor in front of it does not bring it back.

# %% [markdown]
# ### In a trained Transformer
#
# The same happens in a real model. attnlab's pipeline trained its Transformer once more with the
# one switch `model.net.scaled=false` (the scores $\mathbf q^\top\mathbf k$ of every head not
# divided by $\sqrt{d}$, here $d = 64$), the rest of the recipe unchanged; see
# [Ablations](../../how-to/ablations/). The committed results file
# `results/ablation_history.csv` holds, for each run and epoch, the mean entropy of the attention
# rows on the first 64 validation pairs (`attnlab.analysis.heads`). After one epoch:

# %%
with open(ROOT / "results" / "runs.csv", newline="", encoding="utf-8") as f:
    runs = {r["mlflow_run_id"]: r for r in csv.DictReader(f) if r["mlflow_run_id"]}
with open(ROOT / "results" / "ablation_history.csv", newline="", encoding="utf-8") as f:
    epoch1 = [h for h in csv.DictReader(f) if h["model"] == "transformer" and h["epoch"] == "1"]
scaled = next(h for h in epoch1 if runs[h["mlflow_run_id"]]["profile"] == "default")
unscaled = next(h for h in epoch1 if runs[h["mlflow_run_id"]]["recipe"].endswith("+model.net.scaled=false"))
kinds = ("encoder_self", "decoder_self", "encoder_decoder")
print(f"{'entropy after epoch 1 (nats)':30}", "  ".join(f"{k:>15}" for k in kinds), f"{'val BLEU':>9}")
for name, h in (("scaled (the default)", scaled), ("unscaled", unscaled)):
    print(f"{name:30}", "  ".join(f"{float(h['entropy_' + k]):>15.2f}" for k in kinds), f"{h['val_bleu']:>9}")
for k in kinds:  # the unscaled heads are nearly one-hot from the first epoch on
    assert float(unscaled["entropy_" + k]) < 0.25 * float(scaled["entropy_" + k]), k
assert float(unscaled["val_bleu"]) < float(scaled["val_bleu"])

# %% [markdown]
# Without the $1/\sqrt{d}$ the trained heads are nearly one-hot: in each of the three kinds of
# attention the entropy of their rows is a small fraction of the scaled model's (below a quarter,
# asserted; the table above prints both), and the model learns more slowly (its validation BLEU
# after the first epoch is printed beside). The
# [results](../../results/#after-the-first-epoch) show the whole curves and the test BLEU after
# four epochs.

# %% [markdown]
# ### Wider heads
#
# The argument says the harm grows with $d$. The pipeline trained the pair once more with wider
# heads, `model.net.d_model=512 model.net.ffn_hidden=1024`: 4 heads of $d = 128$ instead of 64
# (and a feed-forward layer twice as wide), scaled and unscaled, the rest of the recipe unchanged.
# Each pair ran on one machine (`results/runs.csv`). Test BLEU after four epochs, the validation
# BLEU after each epoch and the attention entropy after the first:

# %%
WIDE = "model.net.d_model=512 model.net.ffn_hidden=1024"
recipe = runs[scaled["mlflow_run_id"]]["recipe"]  # the default recipe the switches change
wide = {
    switch: next(r for r in runs.values() if r["recipe"] == f"{recipe}+{WIDE}{switch}")
    for switch in ("", " model.net.scaled=false")
}
pairs = {  # per-head d → (scaled run, unscaled run)
    64: (runs[scaled["mlflow_run_id"]], runs[unscaled["mlflow_run_id"]]),
    128: (wide[""], wide[" model.net.scaled=false"]),
}
with open(ROOT / "results" / "ablation_history.csv", newline="", encoding="utf-8") as f:
    first = {h["mlflow_run_id"]: h for h in csv.DictReader(f) if h["epoch"] == "1"}
gap, mean_entropy = {}, {}
print(
    f"{'d per head':>10} {'':>9} {'test BLEU':>9} {'val BLEU by epoch':>26} {'entropy, epoch 1':>17}",
    "machine",
)
for d, pair in pairs.items():
    for name, r in zip(("scaled", "unscaled"), pair):
        h = first[r["mlflow_run_id"]]
        mean_entropy[d, name] = sum(float(h["entropy_" + k]) for k in kinds) / len(kinds)
        print(f"{d:>10} {name:>9} {float(r['test_2016_flickr_bleu']):>9.2f} {r['val_bleu_epochs']:>26}"
              f" {mean_entropy[d, name]:>17.2f}  {r['machine']} ({r['threads']})")  # fmt: skip
    gap[d] = float(pair[0]["test_2016_flickr_bleu"]) - float(pair[1]["test_2016_flickr_bleu"])
print("BLEU lost without √d:", {d: round(g, 2) for d, g in gap.items()})

# %%
for d, (s_run, u_run) in pairs.items():  # at both widths the unscaled heads are the more peaked
    assert mean_entropy[d, "unscaled"] < 0.5 * mean_entropy[d, "scaled"], d
    s_h, u_h = first[s_run["mlflow_run_id"]], first[u_run["mlflow_run_id"]]
    for k in ("encoder_self", "decoder_self"):  # self-attention most of all
        assert float(u_h["entropy_" + k]) < 0.25 * float(s_h["entropy_" + k]), (d, k)
assert mean_entropy[128, "scaled"] < mean_entropy[64, "scaled"]  # wide heads sharpen even scaled
assert gap[64] > 0 and gap[128] > 2 * gap[64], gap  # and they lose far more without √d

# %% [markdown]
# At both widths the unscaled heads are the more peaked after one epoch: their mean entropy is
# under half the scaled model's, and in self-attention under a quarter (asserted). The wider
# model's attention is more peaked even when scaled, yet it learns to translate; without √d, with
# heads of 128, it loses more than twice as much BLEU as with heads of 64 (asserted), and its
# validation BLEU shows it hardly learns at all in four epochs. The scaled wide model is also a
# little worse than the default, so width alone does not explain that loss; these runs do not
# say why the wide scaled model's attention sharpens so fast.

# %% [markdown]
# ## What this means
#
# Without scaling, the spread of the scores grows like $\sqrt d$: the wider the heads (attnlab's
# have $d$ = `d_model / num_heads`), the nearer one-hot the softmax is from the first step, and
# the smaller the softmax's own gradient, the gradient at the scores $\partial L/\partial
# \mathbf s$ that tells the model which keys to attend to: Vaswani et al.'s "regions where it
# has extremely small gradients". That gradient shrinks with every step of $d$ from 16 on, and
# at $d = 256$ it is below a fifth of the scaled one (both asserted above). The gradient that
# reaches the queries tells a different story: unscaled, nothing divides it by $\sqrt d$, so it
# starts larger, until saturation eats its lead (also asserted). Dividing by $\sqrt d$ keeps the
# scores at variance 1 whatever $d$ is, so the softmax starts soft and trainable at every width.
# That is the line
# `scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)` in
# `DotProductAttention.forward` (`src/attnlab/models/attention.py`; see the
# [API reference](../../reference/api/models/#attnlab.models.attention.DotProductAttention)),
# which every head of `MultiHeadAttention` and so the whole `Transformer` use. The argument
# assumes unit-variance queries and keys; learned projections do not keep them so exactly, but
# the scaling removes the dependence on $d$, which is what matters. Additive attention needs no
# such factor, since its $\tanh$ bounds each hidden unit, but it pays with an $n \times n \times
# h$ tensor, as section 2 measured.

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
