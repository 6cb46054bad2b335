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
# # Attention cues: queries, keys and values
#
# *English* · [中文](../../tutorials/cues.zh/)
#
# This page follows *Dive into Deep Learning* section **11.1 "Queries, Keys, and Values"**
# (Chinese edition 10.1 注意力提示) with attnlab's own code. It sets up the vocabulary of the whole
# attention chapter, and then checks it with numbers: what a query, a key and a value are, why
# attention weights are non-negative and sum to 1, why attention is a *soft* database lookup,
# and which argument of attnlab's attention modules is which. Every claim below is computed on
# this page and checked with an `assert`; the site runs the page when it is built, and the tests
# run it too (`tests/test_tutorials.py`), so a claim that stops being true fails CI.
#
# You will:
#
# 1. map the two kinds of attention cue onto queries and keys;
# 2. draw D2L's heatmap of attention weights, and make the same matrix with
#    `DotProductAttention`;
# 3. run a soft database lookup and watch its output move to one value;
# 4. call `DotProductAttention`, `AdditiveAttention` and `MultiHeadAttention` with
#    `queries, keys, values, valid_lens` and check every shape.
#
# **Running time.** The page times itself: its last cell prints how long the run shown here
# took (the full mode). It computes nothing large: the fast mode (`ATTNLAB_TUTORIAL_FAST=1`,
# what CI runs) differs only in drawing fewer points on one curve, and checks the same
# assertions. No GPU, data set or trained model is needed. To run it yourself:
# `python docs/tutorials/cues.py`, or open it in Jupyter with
# [jupytext](https://jupytext.readthedocs.io/).

# %%
import inspect
import math
import os
import time

import matplotlib.pyplot as plt
import torch

from attnlab.analysis.provenance import git_commit
from attnlab.models import AdditiveAttention, DotProductAttention, MultiHeadAttention

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # fewer points on one curve, same assertions
torch.manual_seed(0)
print("mode:", "fast" if FAST else "full")

# %% [markdown]
# ## 1. Two kinds of cue
#
# Attention is a scarce resource. The eyes receive far more than the brain can process, and an
# economy of attention decides what gets processed: what we attend to, we pay for by not
# attending to something else. D2L explains how the choice is made with the *two-component
# framework* of the psychologist William James:
#
# - a **non-volitional cue** comes from the things themselves: how salient, how conspicuous
#   they are. Among black-and-white newspapers on a desk, a red coffee cup draws the eye
#   without our willing it;
# - a **volitional cue** comes from us: after the coffee, we *want* to read a book, and the
#   eye goes to the book although it is no more conspicuous than the newspapers.
#
# Attention mechanisms give each cue a name:
#
# | in the psychology | in an attention mechanism | attnlab argument |
# |---|---|---|
# | volitional cue (what we look for) | **query** $\mathbf q$ | `queries` |
# | non-volitional cue of each thing (how it presents itself) | **key** $\mathbf k_i$ | `keys` |
# | the sensory input itself, paired with its key | **value** $\mathbf v_i$ | `values` |
#
# A fully connected or pooling layer has only the non-volitional cues: it processes every input
# the same way whatever we look for. What sets attention apart is the query: it compares the
# query with every key, and from the comparisons it chooses how much of each value to take.
# This choice is *attention pooling*:
#
# $$\operatorname{Attention}(\mathbf q, \mathcal D) = \sum_{i=1}^m \alpha(\mathbf q, \mathbf k_i)\,
# \mathbf v_i, \qquad \mathcal D = \{(\mathbf k_1, \mathbf v_1), \ldots, (\mathbf k_m, \mathbf v_m)\}.$$
#
# ## 2. Attention weights as a heatmap
#
# The weights $\alpha(\mathbf q, \mathbf k_i)$ of several queries form a matrix, one row per query
# and one column per key, and D2L draws such matrices as heatmaps with its `show_heatmaps`. Here
# it is, with D2L's own example: the identity matrix, ten queries each of which attends only to
# the key of the same index.


# %%
def show_heatmaps(matrices, xlabel, ylabel, titles=None, figsize=(2.5, 2.5), cmap="Reds"):
    """D2L 11.1 (zh 10.1)'s show_heatmaps: matrices (rows, cols, queries, keys), one heatmap per panel."""
    num_rows, num_cols = matrices.shape[0], matrices.shape[1]
    fig, axes = plt.subplots(num_rows, num_cols, figsize=figsize, sharex=True, sharey=True, squeeze=False)
    for i, (row_axes, row_matrices) in enumerate(zip(axes, matrices)):
        for j, (ax, matrix) in enumerate(zip(row_axes, row_matrices)):
            image = ax.imshow(matrix.detach().numpy(), cmap=cmap, vmin=0, vmax=1)
            if i == num_rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles:
                ax.set_title(titles[j], fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.6)
    plt.show()


attention_weights = torch.eye(10).reshape((1, 1, 10, 10))
show_heatmaps(attention_weights, xlabel="Keys", ylabel="Queries")

# %% [markdown]
# Where would such a matrix come from? Take ten keys that are the one-hot vectors
# $\mathbf e_1, \ldots, \mathbf e_{10}$ of $\mathbb R^{10}$, and ten queries $s\,\mathbf e_1,
# \ldots, s\,\mathbf e_{10}$. attnlab's `DotProductAttention` scores query $i$ against key $j$ with
# $\mathbf q_i^\top \mathbf k_j / \sqrt d = s\,\delta_{ij}/\sqrt{10}$ and normalizes each row with a
# softmax, so by hand each query's weight on its own key is
#
# $$\alpha_{ii} = \frac{e^{s/\sqrt{10}}}{e^{s/\sqrt{10}} + 9},$$
#
# $1/10$ at $s = 0$ (every key alike: plain average pooling) and tending to 1 as $s$ grows. With
# `hard=True` the module puts weight exactly 1 on the best-scoring key (*hard* attention, as
# opposed to the soft, differentiable weights of a softmax): exactly D2L's identity matrix.

# %%
keys = torch.eye(10).unsqueeze(0)  # (batch 1, 10 keys, d = 10)
values = torch.randn(1, 10, 4)  # any values: the weights do not depend on them
sharpness = (0.0, 3.0, 10.0, 30.0)
soft = []
for s in sharpness:
    attention = DotProductAttention()
    attention(s * keys, keys, values)  # queries s·e_i
    w = attention.attention_weights  # (1, 10, 10)
    by_hand = math.exp(s / math.sqrt(10)) / (math.exp(s / math.sqrt(10)) + 9)
    assert torch.allclose(w[0].diagonal(), torch.full((10,), by_hand), atol=1e-6), (s, by_hand)
    assert torch.allclose(w.sum(-1), torch.ones(1, 10))  # each query's weights sum to 1
    soft.append(w[0])
    print(f"s = {s:>4}: weight of each query on its own key {by_hand:.4f}")

hard = DotProductAttention(hard=True)
hard(keys, keys, values)
assert torch.equal(hard.attention_weights[0], torch.eye(10))  # exactly the identity
show_heatmaps(
    torch.stack([*soft, hard.attention_weights[0]]).unsqueeze(0),
    xlabel="Keys",
    ylabel="Queries",
    titles=[f"soft, s = {s:g}" for s in sharpness] + ["hard=True"],
    figsize=(12, 2.8),
)

# %% [markdown]
# ## 3. Attention is a soft database lookup
#
# D2L 11.1 (zh 10.1) starts from a database: a set of (key, value) pairs such as (surname, first name).
# An exact query, "Li", returns the one value whose key matches, "Mu". Attention replaces the
# exact match with weights. For a query $\mathbf q$ and keys $\mathbf k_1, \ldots, \mathbf k_m$:
#
# $$\alpha(\mathbf q, \mathbf k_i) = \frac{\exp a(\mathbf q, \mathbf k_i)}{\sum_{j}
# \exp a(\mathbf q, \mathbf k_j)} \ge 0, \qquad \sum_i \alpha(\mathbf q, \mathbf k_i) = 1,$$
#
# with a scoring function $a$ (here the scaled dot product; the
# [scoring page](../../tutorials/scoring/) compares it with additive attention). Because the
# weights are non-negative and sum to 1, the output $\sum_i \alpha_i \mathbf v_i$ is a *convex
# combination* of the values: it always lies in their convex hull. Two special cases:
#
# - all weights equal, $1/m$: the output is the mean of the values (**average pooling**);
# - one weight 1, the others 0: the output is exactly one value (an ordinary **database query**).
#
# Between the two: if one key matches the query much better than the others, its weight
# $\alpha_j$ tends to 1 and the output tends to its value $\mathbf v_j$. How close it gets is
# bounded, since $\mathbf o - \mathbf v_j = \sum_{i \ne j} \alpha_i (\mathbf v_i - \mathbf v_j)$:
#
# $$\lVert \mathbf o - \mathbf v_j \rVert \le (1 - \alpha_j)
# \max_i \lVert \mathbf v_i - \mathbf v_j \rVert .$$
#
# We build D2L's little database with random 32-dimensional keys, one per surname, and a
# two-dimensional value per first name (so we can draw them), and we query with
# $\beta\,\mathbf k_{\text{Li}}$: $\beta = 0$ expresses no preference, and the larger $\beta$,
# the more decidedly the query looks for "Li".

# %%
surnames = ["Zhang", "Lipton", "Li", "Smola", "Hu", "Werness"]
first_names = ["Aston", "Zachary", "Mu", "Alex", "Rachel", "Brent"]
d = 32
db_keys = torch.randn(1, len(surnames), d, dtype=torch.float64)  # (1, m, d)
db_values = torch.randn(1, len(surnames), 2, dtype=torch.float64)  # (1, m, 2)
li = surnames.index("Li")

# a query β·k_Li matches k_Li best for every β > 0 exactly when k_Li·k_Li beats every k_Li·k_i
dots = db_keys[0] @ db_keys[0, li]
assert dots.argmax() == li and (dots[li] - dots.topk(2).values[1]) > 0, dots
betas = torch.linspace(0, 3, 16 if FAST else 61, dtype=torch.float64)
queries = betas[:, None] * db_keys[0, li]  # (n_β, d): one query per β
lookup = DotProductAttention()
out = lookup(queries.unsqueeze(0), db_keys, db_values)[0]  # (n_β, 2)
alpha = lookup.attention_weights[0]  # (n_β, m)

assert torch.all(alpha >= 0) and torch.allclose(alpha.sum(-1), torch.ones(len(betas), dtype=torch.float64))
assert torch.allclose(out, alpha @ db_values[0])  # the output is the convex combination
assert torch.allclose(out[0], db_values[0].mean(0))  # β = 0: average pooling
assert torch.all(alpha[1:, li] > alpha[:-1, li])  # the weight of "Li" grows with β
spread = (db_values[0] - db_values[0, li]).norm(dim=-1).max()
distance = (out - db_values[0, li]).norm(dim=-1)
assert torch.all(distance <= (1 - alpha[:, li]) * spread + 1e-12)  # the bound above, at every β
assert alpha[-1, li] > 0.999 and distance[-1] < 1e-2 * spread, (alpha[-1, li], distance[-1])
for b in (0, len(betas) // 3, -1):
    row = ", ".join(f"{n} {w:.3f}" for n, w in zip(surnames, alpha[b].tolist()))
    print(f"β = {betas[b]:.2f}: {row}; |o − v_Li| = {distance[b]:.4f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
v = db_values[0]
ax1.scatter(v[:, 0], v[:, 1], s=60, color="tab:gray", zorder=3)
for surname, name, (x, y) in zip(surnames, first_names, v.tolist()):
    ax1.annotate(f"{surname} → {name}", (x, y), fontsize=8, xytext=(5, 5), textcoords="offset points")
path = ax1.scatter(out[:, 0], out[:, 1], c=betas, cmap="viridis", s=14, zorder=4)
fig.colorbar(path, ax=ax1, label=r"$\beta$")
ax1.set(title=r"the output $\mathbf{o}$ as $\beta$ grows", xlabel="value[0]", ylabel="value[1]")
ax1.margins(0.15)
for i, name in enumerate(surnames):
    ax2.plot(betas, alpha[:, i], lw=2.5 if i == li else 1, label=f"key {name}")
ax2.set(xlabel=r"$\beta$ (how decidedly the query looks for Li)", ylabel="attention weight", ylim=(0, 1.02))
ax2.legend(fontsize=8)
plt.show()

# %% [markdown]
# With `hard=True`, the lookup is the ordinary database query: the output is the value of "Li"
# itself, bit for bit, at any $\beta > 0$.

# %%
hard_lookup = DotProductAttention(hard=True)
hard_out = hard_lookup(queries[1:].unsqueeze(0), db_keys, db_values)[0]
assert torch.equal(hard_out, db_values[0, li].expand_as(hard_out))
print("hard lookup returns", first_names[li], "at every β > 0")

# %% [markdown]
# Soft weights are what make attention trainable: the output changes smoothly with the query
# and the keys, so gradients reach them; a hard lookup passes no gradient to the scores (see
# `masked_hardmax` in the
# [API reference](../../reference/api/models/#attnlab.models.attention.masked_hardmax)).
#
# ## 4. The same words in attnlab's code
#
# attnlab's attention modules take the arguments in D2L's order and under D2L's names,
# `queries, keys, values, valid_lens`, so the book maps onto the code. `valid_lens` says how many
# keys of each sequence are real rather than padding (`None`: all of them; one length per
# sequence, (B,); or one per query, (B, Q)); keys past it get weight exactly 0. The signatures,
# read from the code itself:

# %%
for cls in (DotProductAttention, AdditiveAttention, MultiHeadAttention):
    print(f"{cls.__name__}{inspect.signature(cls)}")
    forward = inspect.signature(cls.forward)
    print(f"    .forward{forward}")
    assert list(forward.parameters)[1:5] == ["queries", "keys", "values", "valid_lens"], forward

# %% [markdown]
# Their shapes (B: batch size, Q: queries, K: key–value pairs per sequence, H: heads):
#
# | argument | `DotProductAttention` | `AdditiveAttention` | `MultiHeadAttention` |
# |---|---|---|---|
# | `queries` | (B, Q, d) | (B, Q, query_size) | (B, Q, d_model) |
# | `keys` | (B, K, d) | (B, K, key_size) | (B, K, d_model) |
# | `values` | (B, K, d_v) | (B, K, d_v) | (B, K, d_model) |
# | `valid_lens` | None, (B,) or (B, Q) | the same | the same |
# | output | (B, Q, d_v) | (B, Q, d_v) | (B, Q, d_model) |
# | `attention_weights` | (B, Q, K) | (B, Q, K) | (B, H, Q, K) |
#
# Queries and keys must have the same size for the dot product; additive attention learns
# projections $\mathbf W_q$, $\mathbf W_k$, so their sizes may differ. Every module keeps its last
# weights in `attention_weights`. One real call of each, on a batch of two sequences with 5
# key–value pairs of which 2 and 5 are valid:

# %%
B, Q, K = 2, 3, 5
valid_lens = torch.tensor([2, 5])
padding = torch.arange(K) >= valid_lens[:, None]  # (B, K): True at padded keys
calls = {
    "DotProductAttention": (
        DotProductAttention(),
        torch.randn(B, Q, 8),
        torch.randn(B, K, 8),
        torch.randn(B, K, 6),
        (B, Q, 6),
        (B, Q, K),
    ),
    "AdditiveAttention": (
        AdditiveAttention(key_size=4, query_size=8, num_hiddens=16),
        torch.randn(B, Q, 8),
        torch.randn(B, K, 4),
        torch.randn(B, K, 6),
        (B, Q, 6),
        (B, Q, K),
    ),
    "MultiHeadAttention": (
        MultiHeadAttention(d_model=8, num_heads=2),
        torch.randn(B, Q, 8),
        torch.randn(B, K, 8),
        torch.randn(B, K, 8),
        (B, Q, 8),
        (B, 2, Q, K),
    ),
}
for name, (module, queries, keys, values, out_shape, weights_shape) in calls.items():
    module.eval()
    with torch.no_grad():
        output = module(queries, keys, values, valid_lens)
    weights = module.attention_weights
    print(f"{name:>20}: output {tuple(output.shape)}, attention_weights {tuple(weights.shape)}")
    assert output.shape == out_shape and weights.shape == weights_shape
    mask = padding[:, None, :] if weights.dim() == 3 else padding[:, None, None, :]
    assert torch.all(weights.masked_select(mask.expand_as(weights)) == 0)  # padding: exactly 0
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]))  # each query sums to 1

# %% [markdown]
# ## What this means
#
# A query is what we look for, a key is how each thing presents itself, and a value is the thing
# itself. Attention compares the query with every key and returns a weighted average of the
# values, with weights that are non-negative and sum to 1: a soft database lookup, which becomes
# average pooling when no key is preferred and an exact lookup when one key is preferred
# absolutely. Every attention model of the chapter is this lookup with a different scoring
# function or different queries, keys and values: Nadaraya–Watson kernel regression
# ([next page](../../tutorials/pooling/)), the Bahdanau decoder (its decoder state queries the
# encoder states) and the Transformer's self-attention (the queries, keys and values all come
# from the same sequence). The modules above are in the
# [API reference](../../reference/api/models/#attnlab.models.attention.DotProductAttention).

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
