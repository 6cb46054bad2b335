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
# # Self-attention and positional encoding
#
# *English* · [中文](../../tutorials/self-attention.zh/)
#
# This page follows *Dive into Deep Learning* section **11.6 "Self-Attention and Positional
# Encoding"** (Chinese edition 10.6 自注意力和位置编码) with attnlab's own code. In
# self-attention every token is query, key and value at once. Every claim below is computed on
# this page and checked with an `assert`; the site runs the page when it is built, and the tests
# run it too (`tests/test_tutorials.py`), so a claim that stops being true fails CI.
#
# You will:
#
# 1. compute $\operatorname{softmax}(\mathbf X\mathbf X^\top)\mathbf X$ by hand on three tokens,
#    早 / 上 / 好 ("good morning"), and check it against attnlab's `DotProductAttention`;
# 2. measure the columns of D2L's table comparing CNNs, RNNs and self-attention (computational
#    complexity as floating-point operations, sequential operations, maximum path length), plus
#    memory and time, against the sequence length $n$;
# 3. draw the sinusoidal positional encoding and check that $\mathbf p_{i+\delta}$ is a fixed
#    linear map (a rotation) of $\mathbf p_i$.
#
# **Running time.** The page times itself: its last cell prints how long the run shown here
# took (the full mode). The fast mode (`ATTNLAB_TUTORIAL_FAST=1`, what CI runs) times fewer and
# shorter sequences and checks the same assertions. No GPU, data set or trained model is
# needed. To run it yourself: `python docs/tutorials/self-attention.py`, or open it in Jupyter
# with [jupytext](https://jupytext.readthedocs.io/).

# %%
import math
import os
import time

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.utils import benchmark
from torch.utils.flop_counter import FlopCounterMode

from attnlab.analysis.provenance import git_commit
from attnlab.models import DotProductAttention, MultiHeadAttention, PositionalEncoding

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # fewer timings, same assertions
torch.manual_seed(0)
print("mode:", "fast" if FAST else "full")

# %% [markdown]
# ## 1. softmax(XXᵀ)X on three tokens
#
# Take the sentence 早上好 ("good morning"), three tokens, and give each a hand-picked 2-d
# embedding, the rows of $\mathbf X \in \mathbb R^{3\times 2}$:
# 早 $=(1, 0)$, 上 $=(1, 1)$, 好 $=(0, 2)$.
# Self-attention in its simplest form (D2L 11.6.1 (zh 10.6.1)) uses $\mathbf X$ as queries, keys and values:
#
# $$\mathbf Y = \operatorname{softmax}(\mathbf X\mathbf X^\top)\,\mathbf X .$$
#
# **Step 1, the scores.** Entry $(i, j)$ of $\mathbf X\mathbf X^\top$ is the inner product
# $\mathbf x_i^\top\mathbf x_j$. With these integers you can do it in your head:
# 早·早 $= 1$, 早·上 $= 1$, 早·好 $= 0$, 上·上 $= 2$, 上·好 $= 2$, 好·好 $= 4$.

# %%
LABELS = ["zǎo", "shàng", "hǎo"]  # 早, 上, 好 in pinyin: matplotlib's default font has no CJK glyphs
X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)  # (3 tokens, d = 2)

S = X @ X.T
S_hand = torch.tensor([[1, 1, 0], [1, 2, 2], [0, 2, 4]], dtype=torch.float64)
print(S)
assert torch.equal(S, S_hand)  # exact: integer inner products
assert torch.equal(S, S.T)  # x_i·x_j = x_j·x_i: self-attention scores are symmetric

# %% [markdown]
# **Step 2, the softmax of each row.** Row $i$ becomes the weights token $i$ gives every token,
# $\alpha_{ij} = e^{s_{ij}}/\sum_k e^{s_{ik}}$. By hand, with $e = 2.718\ldots$:
# row 早 is $(e, e, 1)/(2e + 1)$, row 上 is $(e, e^2, e^2)/(e + 2e^2)$, and row 好 is
# $(1, e^2, e^4)/(1 + e^2 + e^4)$.

# %%
A = torch.softmax(S, dim=-1)
e = math.e
A_hand = torch.tensor(
    [
        [e / (2 * e + 1), e / (2 * e + 1), 1 / (2 * e + 1)],
        [e / (e + 2 * e**2), e**2 / (e + 2 * e**2), e**2 / (e + 2 * e**2)],
        [1 / (1 + e**2 + e**4), e**2 / (1 + e**2 + e**4), e**4 / (1 + e**2 + e**4)],
    ],
    dtype=torch.float64,
)
print(A.numpy().round(4))
assert torch.allclose(A, A_hand, rtol=0, atol=1e-15)
assert torch.allclose(A.sum(-1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-15)  # rows sum to 1
assert not torch.allclose(A, A.T)  # the scores are symmetric, the weights are not
# 好 has the largest norm, so it gives itself most of its weight; 早 weighs 早 and 上 alike
assert A[2].argmax() == 2 and A[2, 2] > 0.85 and A[0, 0] == A[0, 1]

# %% [markdown]
# **Step 3, the weighted sum.** Output $i$ is $\mathbf y_i = \sum_j \alpha_{ij}\mathbf x_j$.
# We add the vectors up in plain Python and compare. The weights are positive and sum to 1, so
# $\mathbf y_i$ is a point inside the triangle the three embeddings span, and its barycentric
# coordinates in that triangle are exactly row $i$ of the weights:

# %%
Y = A @ X
Y_hand = [[sum(A_hand[i, j].item() * X[j, c].item() for j in range(3)) for c in range(2)] for i in range(3)]
print(Y.numpy().round(4))
assert torch.allclose(Y, torch.tensor(Y_hand, dtype=torch.float64), rtol=0, atol=1e-15)
ones = torch.ones(3, 1, dtype=torch.float64)
barycentric = torch.cat([Y, ones], 1) @ torch.linalg.inv(torch.cat([X, ones], 1))  # (3, 3)
assert torch.allclose(barycentric, A, rtol=0, atol=1e-14) and torch.all(barycentric > 0)

# %% [markdown]
# **attnlab's `DotProductAttention`** divides the scores by $\sqrt d$ (section 11.3; see the
# [scoring page](../../tutorials/scoring/)): called on $(\mathbf X, \mathbf X, \mathbf X)$ it
# computes $\operatorname{softmax}(\mathbf X\mathbf X^\top/\sqrt 2)\mathbf X$. Multiplying the
# queries by $\sqrt d$ undoes the scaling and gives our $\mathbf Y$. And `MultiHeadAttention`
# is the same computation behind learned projections $\mathbf W_q, \mathbf W_k, \mathbf W_v,
# \mathbf W_o$: with one head and all four set to the identity it is `DotProductAttention`.

# %%
d = X.shape[1]
attention = DotProductAttention()
Xb = X[None]  # a batch of one sentence: (1, 3, 2)
Y_scaled = attention(Xb, Xb, Xb)[0]
assert torch.allclose(Y_scaled, torch.softmax(S / math.sqrt(d), -1) @ X, rtol=0, atol=1e-15)
assert torch.allclose(attention(Xb * math.sqrt(d), Xb, Xb)[0], Y, rtol=0, atol=1e-14)
assert torch.allclose(attention.attention_weights[0], A, rtol=0, atol=1e-15)

mha = MultiHeadAttention(d_model=d, num_heads=1).double()
with torch.no_grad():
    for W in (mha.W_q, mha.W_k, mha.W_v, mha.W_o):
        W.weight.copy_(torch.eye(d))
assert torch.allclose(mha(Xb, Xb, Xb)[0], Y_scaled, rtol=0, atol=1e-15)
print("softmax(XXᵀ)X = DotProductAttention(√d·X, X, X); MultiHeadAttention with W = I = DotProductAttention")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
im = ax1.imshow(A, cmap="Reds", vmin=0, vmax=1)
for i in range(3):
    for j in range(3):
        ax1.text(
            j, i, f"{A[i, j]:.3f}", ha="center", va="center", color="black" if A[i, j] < 0.6 else "white"
        )
ax1.set_xticks(range(3), LABELS)
ax1.set_yticks(range(3), LABELS)
ax1.set(xlabel="key", ylabel="query", title=r"weights softmax($XX^\top$)")
fig.colorbar(im, ax=ax1, fraction=0.046)
ax2.fill(X[:, 0], X[:, 1], color="0.92")
ax2.plot(X[:, 0], X[:, 1], "o", color="tab:blue", label="input $x_i$")
ax2.plot(Y[:, 0], Y[:, 1], "s", color="tab:red", label="output $y_i$")
for i, label in enumerate(LABELS):
    ax2.annotate("", xy=tuple(Y[i]), xytext=tuple(X[i]), arrowprops={"arrowstyle": "->", "color": "0.5"})
    ax2.annotate(label, tuple(X[i]), textcoords="offset points", xytext=(6, 4))
ax2.set(xlim=(-0.4, 1.8), ylim=(-0.3, 2.3), aspect="equal", title="each output is a weighted mean")
ax2.legend(loc="upper right")
plt.show()

# %% [markdown]
# Without learned projections a token's score with itself is its squared norm, so a long
# vector (好) mostly attends to itself. The projections $\mathbf W_q, \mathbf W_k$ of
# `MultiHeadAttention` let a model learn which tokens should attend to which.
#
# ## 2. CNNs, RNNs and self-attention, measured
#
# D2L 11.6.2 (zh 10.6.2) compares three layers that map a sequence of $n$ tokens of width $d$ to another
# such sequence: a convolution with kernel size $k$, an RNN, and self-attention:
#
# | layer | computational complexity | sequential operations | maximum path length |
# |---|---|---|---|
# | CNN | $O(knd^2)$ | $O(1)$ | $O(n/k)$ |
# | RNN | $O(nd^2)$ | $O(n)$ | $O(n)$ |
# | self-attention | $O(n^2d)$ | $O(1)$ | $O(1)$ |
#
# D2L's $O(n^2d)$ for self-attention counts the scaled dot-product attention alone, on queries,
# keys and values that are $\mathbf X$ itself. It leaves out the projections $\mathbf W_q,
# \mathbf W_k, \mathbf W_v, \mathbf W_o$ of a real attention layer, an $O(nd^2)$ term, which
# the layer measured here has. That term matters: it is where the FLOP crossover with the GRU
# at $n = d$, below, comes from.
#
# We measure each column on `torch.nn.Conv1d` ($d \to d$ channels, $k = 3$, padding $k//2$),
# `torch.nn.GRU` (input and hidden size $d$) and attnlab's `MultiHeadAttention` used as
# self-attention (queries = keys = values = $\mathbf X$, 4 heads), all of width $d = 64$.
#
# ### Computational complexity: FLOPs counted
#
# `torch.utils.flop_counter.FlopCounterMode` counts the floating-point operations of the
# matrix products and convolutions a call runs (a multiply-add is 2 FLOPs; biases, gates and
# the softmax are not counted, they are $O(nd)$ or $O(n^2)$). By hand, per sequence:
#
# - convolution: each of $n$ outputs of $d$ channels reads $k$ inputs of $d$ channels:
#   $2knd^2$;
# - GRU: three gates, each with a $d\times d$ matrix for the input and one for the hidden
#   state, at each of $n$ steps: $12nd^2$;
# - self-attention: four $d\times d$ projections of $n$ tokens ($8nd^2$), the scores
#   $\mathbf Q\mathbf K^\top$ and the weighted sum of the values ($2n^2d$ each):
#   $8nd^2 + 4n^2d$.
#
# The counter must agree exactly at every $n$:

# %%
D, K, HEADS, B = 64, 3, 4, 1
NS = [8, 16, 32, 64, 128, 256] if FAST else [8, 16, 32, 64, 128, 256, 512, 1024]


def make_layers(d: int = D, k: int = K, heads: int = HEADS) -> dict[str, nn.Module]:
    """The three layers of D2L 11.6.2 (zh 10.6.2), of width d, in eval mode.

    Each maps (B, n, d) to (B, n, d)."""
    conv = nn.Conv1d(d, d, k, padding=k // 2).eval()
    gru = nn.GRU(d, d, batch_first=True).eval()
    mha = MultiHeadAttention(d, heads).eval()
    return {
        "CNN": lambda x: conv(x.transpose(1, 2)).transpose(1, 2),
        "RNN": lambda x: gru(x)[0],
        "self-attention": lambda x: mha(x, x, x),
    }


def formula(name: str, n: int, d: int = D, k: int = K) -> int:
    return {"CNN": 2 * k * n * d**2, "RNN": 12 * n * d**2, "self-attention": 8 * n * d**2 + 4 * n**2 * d}[
        name
    ]


layers = make_layers()
flops = {name: [] for name in layers}
for n in NS:
    x = torch.randn(B, n, D)
    for name, layer in layers.items():
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            assert layer(x).shape == (B, n, D)
        flops[name].append(counter.get_total_flops() // B)
        assert flops[name][-1] == formula(name, n), (name, n, flops[name][-1], formula(name, n))

print(f"{'n':>5} {'CNN':>12} {'RNN':>12} {'self-attention':>15}   (MFLOPs per sequence)")
for i, n in enumerate(NS):
    c, r, a = (flops[name][i] / 1e6 for name in ("CNN", "RNN", "self-attention"))
    print(f"{n:>5} {c:>12.2f} {r:>12.2f} {a:>15.2f}")

# %% [markdown]
# **Where $n^2d$ overtakes $nd^2$.** Self-attention minus the GRU is
# $8nd^2 + 4n^2d - 12nd^2 = 4nd\,(n - d)$: self-attention costs fewer FLOPs than the GRU while
# $n < d$, exactly as many at $n = d$, and more beyond: $(2d + n)/3d$ times as many, a factor
# that grows like $n/d$. Within self-attention, the $4n^2d$ of the scores and the weighted sum
# overtakes the $8nd^2$ of the projections at $n = 2d$. Without the projections, which D2L's
# $O(n^2d)$ leaves out, the $4n^2d$ alone would pass the GRU's $12nd^2$ only at $n = 3d$: the
# crossover at $n = d$ is the projections' doing. The convolution's $2knd^2 = 6nd^2$ is a
# constant per token.

# %%
att, rnn, cnn = (torch.tensor(flops[name]) for name in ("self-attention", "RNN", "CNN"))
ns = torch.tensor(NS)
assert torch.equal(torch.sign(att - rnn), torch.sign(ns - D))  # cheaper, equal at n = d, dearer
assert torch.equal(att - rnn, 4 * ns * D * (ns - D))
quadratic, projections = 4 * ns**2 * D, 8 * ns * D**2
assert torch.equal(torch.sign(quadratic - projections), torch.sign(ns - 2 * D))  # n²d wins past n = 2d
# without the projections (D2L's O(n²d)), 4n²d would pass the GRU's 12nd² only at n = 3d, not n = d
assert torch.equal(torch.sign(quadratic - rnn), torch.sign(ns - 3 * D))
assert torch.equal(cnn, 2 * K * ns * D**2) and len(set((cnn // ns).tolist())) == 1  # linear in n
assert torch.equal(att * 3 * D, rnn * (2 * D + ns))  # self-attention / GRU = (2d + n) / 3d

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.8))
for name, marker in (("CNN", "^-"), ("RNN", "o-"), ("self-attention", "s-")):
    ax.plot(NS, flops[name], marker, label=name)
ax.axvline(D, color="gray", linestyle=":", label=f"$n = d = {D}$")
ax.set(xscale="log", yscale="log", xlabel="sequence length $n$", ylabel="FLOPs per sequence")
ax.set_xticks(NS, [str(n) for n in NS])
ax.xaxis.set_minor_locator(plt.NullLocator())  # only the ticks at the measured n
ax.legend()
plt.show()

# %% [markdown]
# ### Memory: the activations kept for backward
#
# Training keeps, for the backward pass, the tensors each operation saved.
# `torch.autograd.graph.saved_tensors_hooks` shows them to us; we add up the bytes of the
# distinct ones that are not parameters. Unlike a time, this number is deterministic. The
# attention weights are one $n\times n$ matrix per head and sequence: we expect the
# self-attention layer's bytes to be exactly $an + bn^2$, with $b$ = 4 bytes (float32) × heads
# × batch, while the convolution and the GRU keep $O(nd)$ bytes. (The $an$ turns out to be five
# $n\times d$ float32 tensors: the input, the queries, keys and values, and the heads' joined
# output, which $\mathbf W_o$ keeps.) The GRU keeps more per token than self-attention's $a$, so the
# memory crosses over at another length than the FLOPs; we derive where after the measurement.


# %%
def saved_bytes(fn, x: torch.Tensor, params: list[torch.Tensor]) -> tuple[int, int]:
    """(total, largest) bytes of the distinct non-parameter tensors that fn(x) saves for backward."""
    storages: dict[int, int] = {}
    skip = {p.untyped_storage().data_ptr() for p in params}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x.requires_grad_())
    return sum(storages.values()), max(storages.values())


conv, gru, mha = (
    nn.Conv1d(D, D, K, padding=K // 2),
    nn.GRU(D, D, batch_first=True),
    MultiHeadAttention(D, HEADS),
)
memory_layers = {
    "CNN": (lambda x: conv(x.transpose(1, 2)), list(conv.parameters())),
    "RNN": (lambda x: gru(x)[0], list(gru.parameters())),
    "self-attention": (lambda x: mha(x, x, x), list(mha.parameters())),
}
MEM_NS = [8, 16, 32, 64, 128, 256]
memory = {
    name: [saved_bytes(fn, torch.randn(B, n, D), ps) for n in MEM_NS]
    for name, (fn, ps) in memory_layers.items()
}
print(f"{'n':>5} {'CNN (KiB)':>10} {'RNN (KiB)':>10} {'self-attention (KiB)':>21} {'its largest (KiB)':>18}")
for i, n in enumerate(MEM_NS):
    c, r, a = (memory[name][i][0] / 1024 for name in ("CNN", "RNN", "self-attention"))
    print(f"{n:>5} {c:>10.1f} {r:>10.1f} {a:>21.1f} {memory['self-attention'][i][1] / 1024:>18.1f}")

# %%
total = {name: [t for t, _ in memory[name]] for name in memory}
for name in ("CNN", "RNN"):  # exactly proportional to n
    assert all(t * MEM_NS[0] == total[name][0] * n for t, n in zip(total[name], MEM_NS)), (name, total[name])
# self-attention: solve a·n + b·n² from the first two n, then check it at every n
n1, n2 = MEM_NS[:2]
t1, t2 = total["self-attention"][:2]
b = (t2 * n1 - t1 * n2) // (n1 * n2 * (n2 - n1))
a = (t1 - b * n1**2) // n1
assert b == 4 * HEADS * B, (a, b)  # one float32 n×n weight matrix per head
assert a == 5 * 4 * D * B, (a, b)  # five float32 n×d tensors
assert all(t == a * n + b * n**2 for t, n in zip(total["self-attention"], MEM_NS))
# and the largest tensor it keeps is that (B, heads, n, n) weight tensor once n ≥ d / heads
assert all(
    big == 4 * B * HEADS * n**2 for n, (_, big) in zip(MEM_NS, memory["self-attention"]) if n >= D // HEADS
)
print(f"self-attention keeps {a} n + {b} n² bytes")
gru_per_token = total["RNN"][0] // MEM_NS[0]
assert gru_per_token == 8 * 4 * D * B  # eight float32 n×d tensors: the GRU's gates and states
crossover = (gru_per_token - a) / b  # where a·n + b·n² = gru_per_token·n
assert crossover == 3 * D / HEADS
assert all((t > g) == (n > crossover) for n, t, g in zip(MEM_NS, total["self-attention"], total["RNN"]))
print(f"the GRU keeps {gru_per_token} n bytes: more than self-attention below n = {crossover:g}, less above")

# %% [markdown]
# **Where the memory crosses over.** In the page's symbols, with batch $B$, width $d$, $h$ heads
# and 4 bytes a float32, the cell above measured (and asserted) that self-attention keeps
# $an + bn^2$ bytes with $a = 5 \cdot 4dB = 20dB$ and $b = 4hB$, and the GRU keeps $gn$ with
# $g = 8 \cdot 4dB = 32dB$ (`gru_per_token`). Self-attention keeps more exactly when
#
# $$an + bn^2 > gn \iff n > \frac{g - a}{b} = \frac{32dB - 20dB}{4hB} = \frac{3d}{h},$$
#
# the batch cancelling; for this page's $d$ and $h$ the cell above printed the value. More
# heads bring the crossover closer: each head keeps its own $n\times n$ matrix of weights, so
# $b$ grows with $h$, while $a$ does not (its five tensors are $n\times d$ whatever $h$ is: the
# heads share out the $d$ columns of the queries, keys and values) and the GRU's $g$ has nothing
# to do with heads. The cell below measures $a$ and $b$ again for 1, 2, 4 and 8 heads.
#
# This counts what PyTorch's CPU implementations of these layers save for backward, so
# $n = 3d/h$ is this implementation's crossover, not a law: another implementation keeps other
# tensors and crosses over elsewhere, for example a fused GRU kernel, or an attention kernel
# that recomputes the weights in the backward pass instead of keeping them (as FlashAttention
# does).

# %%
print(f"{'heads h':>7} {'a (bytes)':>10} {'b (bytes)':>10} {'(g - a) / b':>12} {'3d/h':>6}")
for h in (1, 2, 4, 8):
    mha_h = MultiHeadAttention(D, h)
    kept = [
        saved_bytes(lambda x, f=mha_h: f(x, x, x), torch.randn(B, n, D), list(mha_h.parameters()))[0]
        for n in MEM_NS
    ]
    b_h = (kept[1] * n1 - kept[0] * n2) // (n1 * n2 * (n2 - n1))
    a_h = (kept[0] - b_h * n1**2) // n1
    assert all(t == a_h * n + b_h * n**2 for t, n in zip(kept, MEM_NS)), h
    assert a_h == a and b_h == 4 * h * B, (h, a_h, b_h)  # only the n² term grows with the heads
    crossover_h = (gru_per_token - a_h) / b_h
    assert crossover_h == 3 * D / h
    assert all((t > g) == (n > crossover_h) for n, t, g in zip(MEM_NS, kept, total["RNN"]))
    print(f"{h:>7} {a_h:>10} {b_h:>10} {crossover_h:>12g} {3 * D / h:>6g}")

# %% [markdown]
# ### Sequential operations: the depth of the autograd graph
#
# Operations that depend on each other's results must run one after another, however many
# cores there are. The autograd graph records every operation and what it depends on, so the
# longest chain of `grad_fn` nodes from the output back to the input counts the **sequential
# operations**: the GRU must update its hidden state once per token, the other two layers do a
# fixed number of (parallel) tensor operations whatever $n$ is.


# %%
def depth(output: torch.Tensor, leaf: torch.Tensor) -> int:
    """Longest chain of autograd nodes from output back to leaf (the critical path of the forward)."""
    memo: dict = {}

    def longest(node) -> int | None:
        if node is None:
            return None
        if node not in memo:
            if getattr(node, "variable", None) is leaf:
                memo[node] = 0
            else:
                below = [longest(child) for child, _ in node.next_functions]
                below = [h for h in below if h is not None]
                memo[node] = 1 + max(below) if below else None
        return memo[node]

    return longest(output.grad_fn)


DEPTH_NS = [4, 8, 16, 32, 64]
depths = {name: [] for name in layers}
for n in DEPTH_NS:
    x = torch.randn(B, n, D, requires_grad=True)
    for name, layer in layers.items():
        depths[name].append(depth(layer(x), x))
print(f"{'n':>4}", *(f"{name:>15}" for name in depths))
for i, n in enumerate(DEPTH_NS):
    print(f"{n:>4}", *(f"{depths[name][i]:>15}" for name in depths))

# %%
assert len(set(depths["CNN"])) == 1 and len(set(depths["self-attention"])) == 1  # O(1)
rnn_depth = depths["RNN"]
slope = (rnn_depth[1] - rnn_depth[0]) // (DEPTH_NS[1] - DEPTH_NS[0])
assert slope >= 1 and all(
    h == rnn_depth[0] + slope * (n - DEPTH_NS[0]) for h, n in zip(rnn_depth, DEPTH_NS)
)  # O(n)
print(f"GRU: {slope} more sequential operations per token")

# %% [markdown]
# ### Wall-clock time
#
# FLOPs and sequential operations both show up in the time. We time the three layers with
# `torch.utils.benchmark` on one CPU thread (batch of 8, no gradient). The milliseconds depend
# on the machine and are **only illustrative** (nothing is asserted on them). What to look for:
# on a CPU the GRU's $n$ small sequential steps typically cost more than their FLOPs suggest,
# and self-attention's time grows faster than linearly once $n$ is a few times $d$. So the
# length where self-attention becomes slower than the GRU need not be the FLOPs' crossover at
# $n = d$; the cell below prints where it lies on the machine that ran the page.

# %%
TIME_NS = [16, 64, 256] if FAST else [16, 32, 64, 128, 256, 512]
MIN_RUN_TIME = 0.02 if FAST else 0.2  # seconds per measurement
times = {name: [] for name in layers}
for n in TIME_NS:
    x = torch.randn(8, n, D)
    for name, layer in layers.items():
        timer = benchmark.Timer(
            stmt="with torch.no_grad(): layer(x)",
            globals={"torch": torch, "layer": layer, "x": x},
            num_threads=1,
        )
        times[name].append(timer.blocked_autorange(min_run_time=MIN_RUN_TIME).median)
print(f"{'n':>5}", *(f"{name + ' (ms)':>20}" for name in times))
for i, n in enumerate(TIME_NS):
    print(f"{n:>5}", *(f"{times[name][i] * 1e3:>20.3f}" for name in times))
slower = [n for n, a, r in zip(TIME_NS, times["self-attention"], times["RNN"]) if a > r]
print(
    f"n timed: {TIME_NS}; self-attention slower than the GRU at: {slower or 'none'} (FLOPs: from n > d = {D})"
)

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.8))
for name, marker in (("CNN", "^-"), ("RNN", "o-"), ("self-attention", "s-")):
    ax.plot(TIME_NS, [t * 1e3 for t in times[name]], marker, label=name)
ax.set(xscale="log", yscale="log", xlabel="sequence length $n$", ylabel="time per batch of 8 (ms)")
ax.set_xticks(TIME_NS, [str(n) for n in TIME_NS])
ax.xaxis.set_minor_locator(plt.NullLocator())  # only the ticks at the measured n
ax.set_title("illustrative: one CPU thread, this machine", fontsize=9)
ax.legend()
plt.show()

# %% [markdown]
# ### Maximum path length
#
# How many layers or steps lie between the first and the last token? We test whether a path
# exists with the gradient: $\partial\mathbf y_0/\partial\mathbf x_{n-1}$ for the convolution and
# self-attention, which look both ways, and $\partial\mathbf y_{n-1}/\partial\mathbf x_0$ for the
# GRU, which reads left to right (its $\mathbf y_0$ never depends on $\mathbf x_{n-1}$).
#
# **Convolutions.** One layer with kernel $k$ and padding $k//2$ sees $k//2$ tokens to each
# side, so $L$ stacked layers see $L\cdot(k//2)$: reaching token $n-1$ from token $0$ takes
# $L = \lceil (n-1)/(k//2) \rceil$ layers, $O(n/k)$. To make "a path exists" the same as "the
# gradient is non-zero", the stack is linear with positive weights: the gradient is then a sum
# of products of positive numbers over all paths, positive exactly when there is one.


# %%
def conv_layers_needed(n: int, k: int, d: int = 4) -> int:
    """The fewest stacked Conv1d(d, d, k, padding=k//2) layers for which ∂y_0/∂x_{n-1} ≠ 0."""
    x = torch.randn(1, d, n, dtype=torch.float64, requires_grad=True)
    h, layers_used = x, 0
    while True:
        conv = nn.Conv1d(d, d, k, padding=k // 2, bias=False).double()
        nn.init.uniform_(conv.weight, 0.5, 1.5)  # positive: no cancellation between paths
        h, layers_used = conv(h), layers_used + 1
        (grad,) = torch.autograd.grad(h[0, :, 0].sum(), x, retain_graph=True)
        if grad[0, :, n - 1].abs().sum() > 0:
            return layers_used


conv_path: dict[tuple[int, int], int] = {}  # (n, k) -> layers needed
print(f"{'n':>3} {'k':>2} {'layers needed':>14} {'ceil((n-1)/(k//2))':>19}")
for n in (8, 16) if FAST else (8, 16, 32):
    for k in (3, 5, 7):
        needed, predicted = conv_layers_needed(n, k), math.ceil((n - 1) / (k // 2))
        print(f"{n:>3} {k:>2} {needed:>14} {predicted:>19}")
        assert needed == predicted, (n, k, needed, predicted)
        conv_path[n, k] = needed

# %% [markdown]
# **Self-attention.** One layer connects every output token to every input token: the
# Jacobian block $\partial\mathbf y_i/\partial\mathbf x_j$ is non-zero for **all** pairs, at any
# $n$.

# %%
for n in (8, 32):
    x = torch.randn(n, 16, dtype=torch.float64)  # width 16: a smaller Jacobian
    mha = MultiHeadAttention(16, HEADS).double().eval()
    J = torch.autograd.functional.jacobian(
        lambda x, f=mha: f(x[None], x[None], x[None])[0], x, vectorize=True
    )
    block_norms = J.abs().sum(dim=(1, 3))  # J is (n, 16, n, 16); block_norms (n, n): |∂y_i/∂x_j|
    assert torch.all(block_norms > 0), n
print("one self-attention layer: every output depends on every input")

# %% [markdown]
# **The GRU.** It, too, connects token $0$ to token $n-1$ in one layer, but only through the
# hidden state: $\mathbf x_0$ enters $\mathbf h_1$, and $\mathbf y_{n-1} = \mathbf h_n$ is
# reached through $\mathbf h_2, \ldots, \mathbf h_{n-1}$. We run `nn.GRU` one token at a time
# (the same outputs as one call on the whole sequence), then cut the path at each hidden state
# in turn with `.detach()`: if $\partial\mathbf y_{n-1}/\partial\mathbf x_0$ becomes zero, that
# state lies on **every** path. All $n-1$ of them do: the path is $n$ recurrent steps long, $O(n)$.


# %%
def gru_by_step(gru: nn.GRU, x: torch.Tensor, cut: int | None = None) -> torch.Tensor:
    """Outputs (1, n, d) of gru run one token at a time; h_cut (1 ≤ cut < n) is detached if given."""
    h, outputs = None, []
    for t in range(x.shape[1]):
        if cut is not None and t == cut:
            h = h.detach()
        y, h = gru(x[:, t : t + 1], h)
        outputs.append(y)
    return torch.cat(outputs, dim=1)


gru_path: dict[int, int] = {}  # n -> recurrent steps from x_0 to y_{n-1}
for n in (8, 16):
    gru = nn.GRU(D, D, batch_first=True).double()
    x = torch.randn(1, n, D, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(gru_by_step(gru, x), gru(x)[0], rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(gru_by_step(gru, x)[0, -1].sum(), x)
    assert grad[0, 0].abs().sum() > 0  # y_{n-1} depends on x_0
    on_every_path = 0
    for cut in range(1, n):
        (grad,) = torch.autograd.grad(gru_by_step(gru, x, cut)[0, -1].sum(), x)
        on_every_path += int(grad[0, 0].abs().sum() == 0)
    assert on_every_path == n - 1, (n, on_every_path)
    gru_path[n] = on_every_path + 1  # x_0 → h_1, then one step past each state on every path
    print(f"n = {n}: cutting any one of the {on_every_path} states h_1 … h_{n - 1} cuts y_{n - 1} off x_0")

# %% [markdown]
# **Side by side.** The three measurements at the lengths where all three were run, and the
# same stacking test for self-attention:


# %%
def attention_layers_needed(n: int, d: int = 16) -> int:
    """The fewest stacked self-attention layers for which ∂y_0/∂x_{n-1} ≠ 0, as for the convolutions."""
    x = torch.randn(1, n, d, dtype=torch.float64, requires_grad=True)
    h, layers_used = x, 0
    while True:
        mha = MultiHeadAttention(d, HEADS).double().eval()
        h, layers_used = mha(h, h, h), layers_used + 1
        (grad,) = torch.autograd.grad(h[0, 0].sum(), x, retain_graph=True)
        if grad[0, n - 1].abs().sum() > 0:
            return layers_used


PATH_NS = sorted(gru_path)  # the lengths at which the GRU was measured; the convolutions were too
attention_path = {n: attention_layers_needed(n) for n in PATH_NS}
print("maximum path length from token 0 to token n-1: layers (the RNN: recurrent steps)")
print(f"{'n':>3}", *(f"{f'CNN k={k}':>9}" for k in (3, 5, 7)), f"{'RNN':>5}", f"{'self-attention':>15}")
for n in PATH_NS:
    print(
        f"{n:>3}",
        *(f"{conv_path[n, k]:>9}" for k in (3, 5, 7)),
        f"{gru_path[n]:>5}",
        f"{attention_path[n]:>15}",
    )

# %%
for n in PATH_NS:
    cnn_path = [conv_path[n, k] for k in (3, 5, 7)]
    assert attention_path[n] == 1 < min(cnn_path), n  # self-attention: one layer
    assert cnn_path == sorted(cnn_path, reverse=True)  # a wider kernel, a shorter path
    assert max(cnn_path) < gru_path[n] == n, n  # the GRU: n steps, the longest
short, long = PATH_NS[0], PATH_NS[-1]
assert attention_path[long] == attention_path[short]  # O(1): the same at every n
assert gru_path[long] * short == gru_path[short] * long  # O(n): proportional to n

# %% [markdown]
# In this last table the path through self-attention is one layer at every $n$, the path
# through the convolutions is $\lceil (n-1)/(k//2) \rceil$ layers, shorter for a wider kernel,
# and the path through the GRU is $n$ steps, the longest (all asserted).
#
# So the table holds, measured: self-attention does the most arithmetic per token once $n > d$,
# but all of it in parallel, and it links any two tokens directly. That is why the Transformer
# (D2L 11.7 (zh 10.7)) is built from it. The price is the $n^2$ in its FLOPs and memory.
#
# ## 3. Positional encoding
#
# Self-attention ignores order: permute the input tokens and the outputs are permuted the same
# way. D2L 11.6.3 (zh 10.6.3) adds position information to the input, $\mathbf X + \mathbf P$, with
#
# $$p_{i,2j} = \sin\!\left(\frac{i}{10000^{2j/d}}\right),\qquad
# p_{i,2j+1} = \cos\!\left(\frac{i}{10000^{2j/d}}\right).$$
#
# attnlab's `PositionalEncoding` (see the
# [API reference](../../reference/api/models/#attnlab.models.positional_encoding.PositionalEncoding))
# holds $\mathbf P$ in its buffer `P`, of shape (1, max_len, d). First the order-blindness, with the
# `MultiHeadAttention` of the last section:

# %%
mha = MultiHeadAttention(D, HEADS).double().eval()
x = torch.randn(1, 8, D, dtype=torch.float64)
perm = torch.randperm(8)
assert torch.allclose(mha(x[:, perm], x[:, perm], x[:, perm]), mha(x, x, x)[:, perm], rtol=0, atol=1e-12)

ENCODING_DIM, NUM_STEPS = 32, 60  # D2L's figure
pos_encoding = PositionalEncoding(ENCODING_DIM, dropout=0.0).eval()
P = pos_encoding.P[0, :NUM_STEPS, :]  # (60, 32)
assert torch.equal(pos_encoding(torch.zeros(1, NUM_STEPS, ENCODING_DIM))[0], P)  # forward adds P
i = torch.arange(NUM_STEPS, dtype=torch.float64)[:, None]
omega = 10000.0 ** (-torch.arange(0, ENCODING_DIM, 2, dtype=torch.float64) / ENCODING_DIM)  # (16,)
assert torch.allclose(P[:, 0::2].double(), torch.sin(i * omega), rtol=0, atol=1e-5)
assert torch.allclose(P[:, 1::2].double(), torch.cos(i * omega), rtol=0, atol=1e-5)

# %% [markdown]
# D2L's figure plots columns 6 to 9 over the positions: columns 6 and 7 (a sine and a cosine of
# frequency $\omega_3 = 10000^{-6/32}$) oscillate faster than columns 8 and 9 (frequency
# $\omega_4 = 10000^{-8/32} = 0.1$), and each cosine runs a quarter period ahead of its sine. The
# heatmap shows all 32 columns: the frequency falls from left to right, as the bits of a binary
# number change more slowly from the lowest to the highest (D2L 11.6.3.1 (zh 10.6.3.1)).

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1.3, 1]})
for col in range(6, 10):
    ax1.plot(range(NUM_STEPS), P[:, col], label=f"col {col}")
ax1.set(xlabel="row (position)", ylabel="$p_{i, j}$")
ax1.legend(loc="lower left")
im = ax2.imshow(P, cmap="Blues", aspect="auto")
ax2.set(xlabel="column (encoding dimension)", ylabel="row (position)")
fig.colorbar(im, ax=ax2)
plt.show()


# %%
def sign_changes(column: torch.Tensor) -> int:
    """Sign changes between neighbouring positions 1 … 59 (at i = 0 every sine is exactly 0)."""
    return int((torch.sign(column[1:-1]) != torch.sign(column[2:])).sum())


for col in (6, 8):  # sines: a sign change at every multiple of π
    w = omega[col // 2].item()
    assert sign_changes(P[:, col]) == math.floor((NUM_STEPS - 1) * w / math.pi), col
assert sign_changes(P[:, 6]) == 3 and sign_changes(P[:, 8]) == 1  # the higher frequency changes sign more
# cos(ωi) = sin(ωi + π/2): the cosine runs a quarter period ahead of the sine
for col in (6, 8):
    w = omega[col // 2].item()
    assert torch.allclose(P[:, col + 1].double(), torch.sin(w * i[:, 0] + math.pi / 2), rtol=0, atol=1e-5)
assert torch.all(omega[1:] < omega[:-1])  # frequencies fall along the encoding dimension

# %% [markdown]
# ### Relative positions: a rotation
#
# D2L 11.6.3.2 (zh 10.6.3.2): for any offset $\delta$, each (sine, cosine) pair at position
# $i + \delta$ is the pair at position $i$ rotated by the angle $\omega_j\delta$,
#
# $$\begin{bmatrix} \cos\omega_j\delta & \sin\omega_j\delta \\ -\sin\omega_j\delta &
# \cos\omega_j\delta \end{bmatrix}
# \begin{bmatrix} p_{i,2j} \\ p_{i,2j+1} \end{bmatrix} =
# \begin{bmatrix} p_{i+\delta,2j} \\ p_{i+\delta,2j+1} \end{bmatrix},$$
#
# so $\mathbf p_{i+\delta} = \mathbf M_\delta\,\mathbf p_i$ with $\mathbf M_\delta$ the
# block-diagonal matrix of these $2\times 2$ rotations: one linear map for every $i$, which
# depends only on $\delta$. We build $\mathbf M_\delta$ from the module's own frequencies and
# check it on all 1000 positions of its buffer, for several $\delta$.
#
# **Tolerance.** `P` is float32: the angle $i\omega_j$ is rounded to a relative $2^{-24}$
# before its sine is taken, an error of at most $i\omega_j 2^{-24} \le 999 \cdot 2^{-24}
# \approx 6\times10^{-5}$ in each entry, plus a few units of $2^{-24}$ from the sine itself:
# say $\varepsilon = (999 + 4)\cdot 2^{-24}$. A rotation does not grow the error of a pair
# (at most $\sqrt2\,\varepsilon$), so each entry of $\mathbf M_\delta\mathbf p_i -
# \mathbf p_{i+\delta}$ is at most $(1+\sqrt2)\,\varepsilon \approx 1.4\times10^{-4}$,
# the tolerance we assert.


# %%
def rotation(delta: int, omega: torch.Tensor) -> torch.Tensor:
    """M_δ, (d, d) float64: block-diagonal 2×2 rotations by ω_j δ, acting on (sin, cos) pairs."""
    c, s = torch.cos(omega * delta), torch.sin(omega * delta)
    blocks = (
        torch.tensor([[cj, sj], [-sj, cj]], dtype=torch.float64) for cj, sj in zip(c.tolist(), s.tolist())
    )
    return torch.block_diag(*blocks)


P_all = pos_encoding.P[0].double()  # (1000, 32)
max_len = P_all.shape[0]
# the module's float32 frequencies, exactly as it computes them
omega32 = (
    1 / torch.pow(10000.0, torch.arange(0, ENCODING_DIM, 2, dtype=torch.float32) / ENCODING_DIM).double()
)
tolerance = (1 + math.sqrt(2)) * ((max_len - 1) * omega32.max().item() + 4) * 2**-24
print(f"{'δ':>4} {'max |M_δ p_i − p_(i+δ)|':>24} {'tolerance':>10}")
for delta in (1, 2, 7, 50, 333):
    M = rotation(delta, omega32)
    error = (P_all[:-delta] @ M.T - P_all[delta:]).abs().max().item()  # every i with i + δ < 1000
    print(f"{delta:>4} {error:>24.2e} {tolerance:>10.2e}")
    assert error < tolerance, (delta, error)
    assert torch.allclose(
        M @ M.T, torch.eye(ENCODING_DIM, dtype=torch.float64), rtol=0, atol=1e-12
    )  # orthogonal
assert torch.allclose(rotation(7, omega32) @ rotation(50, omega32), rotation(57, omega32), rtol=0, atol=1e-12)
print("M_δ p_i = p_(i+δ) at every position; M_δ is a rotation, and M_7 M_50 = M_57")

# %% [markdown]
# Because every $\mathbf M_\delta$ is a rotation, the inner product of two encodings depends only
# on their offset: $\mathbf p_i^\top\mathbf p_{i+\delta} = \sum_j \cos(\omega_j\delta)$. So the
# matrix $\mathbf P\mathbf P^\top$, the self-attention scores of the encodings alone, is constant
# along its diagonals:

# %%
G = P_all[:NUM_STEPS] @ P_all[:NUM_STEPS].T  # (60, 60)
offsets = torch.arange(NUM_STEPS)
expected = torch.cos(offsets[:, None] * omega32).sum(-1)  # Σ_j cos(ω_j δ), (60,)
assert torch.allclose(G, expected[(offsets[:, None] - offsets[None, :]).abs()], rtol=0, atol=1e-4)
fig, ax = plt.subplots(figsize=(4.2, 3.6))
im = ax.imshow(G, cmap="Blues")
ax.set(xlabel="position $j$", ylabel="position $i$", title=r"$p_i^\top p_j$ depends only on $|i - j|$")
fig.colorbar(im, ax=ax)
plt.show()

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
