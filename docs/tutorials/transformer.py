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
# # The Transformer: add & norm, the blocks, the causal decoder
#
# *English* · [中文](../../tutorials/transformer.zh/)
#
# This page follows *Dive into Deep Learning* section **11.7 "The Transformer Architecture"**
# (Chinese edition 10.7 Transformer) with attnlab's own classes (`src/attnlab/models/transformer.py`
# and `src/attnlab/models/attention.py`). Every claim below is computed on this page and checked
# with an `assert`; the site runs the page when it is built, and the tests run it too
# (`tests/test_tutorials.py`), so a claim that stops being true fails CI.
#
# You will:
#
# 1. see why the Transformer normalizes each position with **layer norm** rather than batch
#    norm, on a padded batch of sequences of different lengths;
# 2. measure why each sublayer sits inside a **residual connection** (add & norm), from the
#    gradient that reaches the bottom of a deep stack;
# 3. map the encoder and decoder sublayers to attnlab's classes and D2L's names, and count
#    their parameters by hand;
# 4. check that the **masked decoder is causal**, and draw its self-attention weights.
#
# **Running time.** The page times itself: its last cell prints how long the run shown here
# took (the full mode). The fast mode (`ATTNLAB_TUTORIAL_FAST=1`, what CI runs) uses smaller
# sizes and fewer random draws, and checks the same assertions. No GPU, data set or trained
# model is needed: the models here are untrained, with seeded random weights. To run it
# yourself: `python docs/tutorials/transformer.py`, or open it in Jupyter with
# [jupytext](https://jupytext.readthedocs.io/).

# %%
import inspect
import os
import statistics
import time

import matplotlib.pyplot as plt
import torch
from torch import nn

from attnlab.analysis.provenance import git_commit
from attnlab.models import (
    AddNorm,
    MultiHeadAttention,
    PositionWiseFFN,
    Transformer,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # fewer random draws, same assertions
torch.manual_seed(0)
print("mode:", "fast" if FAST else "full")

# %% [markdown]
# ## 1. Layer norm, not batch norm
#
# ### D2L's tiny example
#
# D2L 11.7.2 (zh 10.7.2) compares the two on a batch of two examples with two features,
# $\mathbf X = \begin{bmatrix}1 & 2\\ 2 & 3\end{bmatrix}$, in training mode. **Layer norm**
# normalizes each *row* (one example, over its features); **batch norm** normalizes each
# *column* (one feature, over the batch). Both subtract the mean and divide by
# $\sqrt{\sigma^2 + \epsilon}$, with the biased variance $\sigma^2$ and PyTorch's default
# $\epsilon = 10^{-5}$. Every row of $\mathbf X$ and every column has mean $m$ and values
# $m \pm 0.5$, so $\sigma^2 = 0.25$ and every entry becomes
# $\pm 0.5/\sqrt{0.25 + 10^{-5}} \approx \pm 0.99998$: layer norm gives
# $\begin{bmatrix}-1 & 1\\ -1 & 1\end{bmatrix}$ and batch norm
# $\begin{bmatrix}-1 & -1\\ 1 & 1\end{bmatrix}$, up to that $\epsilon$.

# %%
ln = nn.LayerNorm(2)
bn = nn.BatchNorm1d(2)  # training mode: normalizes with the batch's own statistics
X = torch.tensor([[1.0, 2.0], [2.0, 3.0]])
print("layer norm:", ln(X), "\nbatch norm:", bn(X), sep="\n")

# %%
a = 0.5 / (0.25 + 1e-5) ** 0.5  # by hand: (x - mean) / sqrt(biased variance + eps)
assert torch.allclose(ln(X), torch.tensor([[-a, a], [-a, a]]), atol=1e-6)
assert torch.allclose(bn(X), torch.tensor([[-a, -a], [a, a]]), atol=1e-6)
print(f"both match ±{a:.6f}, computed by hand")

# %% [markdown]
# ### A padded batch of sequences
#
# A Transformer sees sequences, not rows: a batch is a tensor (batch, steps, $d$), with the
# shorter sequences padded to the longest. Batch norm computes one mean and one variance per
# feature over **every** position of **every** sequence in the batch, padding included. So one
# sentence's normalized values depend on the other sentences it is batched with, and on how
# much padding the batch has. Layer norm computes its statistics over the $d$ features of one
# position alone, and depends on nothing else.
#
# We take three "sentences" of 5, 9 and 3 positions (random vectors standing in for embedded
# tokens) and normalize the first one in four contexts: alone; with the other two, padded to 9;
# with the third only, padded to 5; and with the other two padded to 20 steps. We compare its
# five outputs with the ones it gets alone. For layer norm we use attnlab's `AddNorm` itself
# (`LayerNorm(X + Dropout(Y))`, here with $\mathbf Y = \mathbf 0$ and no dropout).

# %%
D = 16 if FAST else 64  # features
LENS = (5, 9, 3)
sentences = [2 * torch.randn(n, D) + 1 for n in LENS]  # not already normalized


def pad(seqs: list[torch.Tensor], steps: int) -> torch.Tensor:
    """Zero-padded batch (len(seqs), steps, D)."""
    out = torch.zeros(len(seqs), steps, D)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


add_norm = AddNorm(D, dropout=0.0)
batch_norm = nn.BatchNorm1d(D)  # training mode, as during training


def layer_normed(X: torch.Tensor) -> torch.Tensor:
    return add_norm(X, torch.zeros_like(X))


def batch_normed(X: torch.Tensor) -> torch.Tensor:
    return batch_norm(X.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d wants (batch, D, steps)


contexts = {  # name: (sentences in the batch, padded length)
    "alone": ([0], 5),
    "with both, 9 steps": ([0, 1, 2], 9),
    "with the third, 5 steps": ([0, 2], 5),
    "with both, 20 steps": ([0, 1, 2], 20),
}
first = LENS[0]
outputs = {"layer norm": {}, "batch norm": {}}
print(f"{'context':<24} {'padding share':>13} {'max |change|: layer norm':>25} {'batch norm':>11}")
changes = {"layer norm": [], "batch norm": []}
for context, (members, steps) in contexts.items():
    batch = pad([sentences[i] for i in members], steps)
    share = 1 - sum(LENS[i] for i in members) / (len(members) * steps)  # share of padded positions
    outputs["layer norm"][context] = layer_normed(batch)[0, :first].detach()
    outputs["batch norm"][context] = batch_normed(batch)[0, :first].detach()
    row = []
    for norm in ("layer norm", "batch norm"):
        change = (outputs[norm][context] - outputs[norm]["alone"]).abs().max().item()
        row.append(change)
        if context != "alone":
            changes[norm].append(change)
    print(f"{context:<24} {share:>13.0%} {row[0]:>25.2e} {row[1]:>11.3f}")

# %%
# layer norm: the same sentence gets the same outputs in every batch (float rounding at most)
assert max(changes["layer norm"]) < 1e-5, changes["layer norm"]
# batch norm: its outputs (of unit variance) move by more than 0.5 in every other context
assert min(changes["batch norm"]) > 0.5, changes["batch norm"]
# and batch norm's statistics are those of all B × steps positions, padding included (by hand)
batch = pad(sentences, 20)
flat = batch.reshape(-1, D)  # every position, padding too
by_hand = (batch - flat.mean(0)) / (flat.var(0, unbiased=False) + batch_norm.eps).sqrt()
assert torch.allclose(batch_normed(batch), by_hand, atol=1e-4)
print("layer norm: unchanged; batch norm: changed, with statistics that count the padding")

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.3), sharey=True)
for ax, norm in zip(axes, ("layer norm", "batch norm")):
    for context, out in outputs[norm].items():
        ax.plot(range(first), out[:, 0], "o-", label=context, alpha=0.8)
    ax.set(title=norm, xlabel="position in the sentence", xticks=range(first))
axes[0].set_ylabel("normalized feature 0")
axes[1].legend(fontsize=8)
plt.show()

# %% [markdown]
# Under layer norm the four lines lie on top of one another; under batch norm each context
# draws its own. This is why D2L 11.7.2 (zh 10.7.2) says layer norm
# suits natural language: sequences have variable lengths, and a position's normalized value
# should not depend on its neighbours in the batch.
#
# ## 2. Residual connections: why *add* & norm
#
# Every sublayer of the Transformer, attention or FFN, is wrapped as
# $\operatorname{LayerNorm}(\mathbf X + \operatorname{sublayer}(\mathbf X))$: attnlab's
# `AddNorm(X, Y)` with $\mathbf Y = \operatorname{sublayer}(\mathbf X)$. The residual path
# $\mathbf X + \dots$ gives the gradient a way down that bypasses the sublayer. To see what
# it buys, we stack $L$ position-wise FFNs (attnlab's `PositionWiseFFN`, PyTorch's default
# initialization), four ways:
#
# - **add & norm**: $\mathbf X \leftarrow \operatorname{LayerNorm}(\mathbf X + f(\mathbf X))$,
#   what the Transformer does;
# - **norm only**: $\mathbf X \leftarrow \operatorname{LayerNorm}(f(\mathbf X))$, no residual;
# - **plain**: $\mathbf X \leftarrow f(\mathbf X)$;
# - **add only**: $\mathbf X \leftarrow \mathbf X + f(\mathbf X)$, no norm.
#
# With $d = 32$ and a hidden size of 64, for each depth we send a random unit-norm gradient
# $\mathbf g$ into the top (the loss $\langle \mathbf g, \mathbf X_L\rangle$) and measure
# the norm of the gradient that reaches the input $\mathbf X_0$, and the standard deviation of
# the top's activations. The median over several random seeds is shown (float64, so that tiny
# gradients do not underflow).

# %%
D_FFN, HIDDEN = 32, 64  # d and the FFN's hidden size
DEPTHS = (1, 2, 4, 8, 16, 32, 64)
SEEDS = range(7 if FAST else 21)
KINDS = ("add & norm", "norm only", "plain", "add only")


def run_stack(kind: str, depth: int, seed: int) -> tuple[float, float]:
    """|dL/dX_0| for a unit-norm top gradient, and the std of the top activations."""
    torch.manual_seed(seed)
    ffns = [PositionWiseFFN(D_FFN, HIDDEN).double() for _ in range(depth)]
    norms = [AddNorm(D_FFN).double() for _ in range(depth)]
    X0 = torch.randn(4, 10, D_FFN, dtype=torch.float64, requires_grad=True)
    X = X0
    for ffn, add_norm_layer in zip(ffns, norms):
        Y = ffn(X)
        if kind == "add & norm":
            X = add_norm_layer(X, Y)
        elif kind == "norm only":
            X = add_norm_layer.ln(Y)
        elif kind == "plain":
            X = Y
        else:
            X = X + Y
    g = torch.randn_like(X)
    g = g / g.norm()
    (grad,) = torch.autograd.grad((X * g).sum(), X0)
    return grad.norm().item(), X.std().item()


grad_med = {k: [] for k in KINDS}
std_med = {k: [] for k in KINDS}
for kind in KINDS:
    for depth in DEPTHS:
        runs = [run_stack(kind, depth, s) for s in SEEDS]
        grad_med[kind].append(statistics.median(r[0] for r in runs))
        std_med[kind].append(statistics.median(r[1] for r in runs))

print("median |dL/dX_0|")
print(f"{'depth':>6}" + "".join(f"{k:>13}" for k in KINDS))
for i, depth in enumerate(DEPTHS):
    print(f"{depth:>6}" + "".join(f"{grad_med[k][i]:>13.3g}" for k in KINDS))
print("median std of the top activations")
print(f"{'depth':>6}" + "".join(f"{k:>13}" for k in KINDS))
for i, depth in enumerate(DEPTHS):
    print(f"{depth:>6}" + "".join(f"{std_med[k][i]:>13.3g}" for k in KINDS))

# %%
an, no, pl, ad = (grad_med[k] for k in KINDS)
# add & norm: the gradient at the bottom stays of the order of the one sent in, at every depth
assert all(0.5 < x < 2 for x in an), an
# plain: it vanishes geometrically (each default-initialized FFN shrinks it)
assert all(a > b for a, b in zip(pl, pl[1:])) and pl[-1] < 1e-20, pl
# norm only: layer norm rescales the activations but not the gradient's loss of direction;
# at depth 64 the typical gradient is well below add & norm's
assert no[-1] < 0.5 * an[-1] and no[-1] < no[0], (no[-1], no[0], an[-1])
# add only: the gradient survives, but the activations grow with depth (nothing rescales them)
assert all(x > 0.9 for x in ad), ad
assert all(a < b for a, b in zip(std_med["add only"], std_med["add only"][1:])), std_med["add only"]
assert std_med["add only"][-1] > 1.5 * std_med["add only"][0]
# add & norm: every position's activations normalized to std 1 (layer norm's default affine)
assert all(abs(s - 1) < 0.02 for s in std_med["add & norm"]), std_med["add & norm"]
print("ordering at depth 64: add & norm > norm only > plain;", f"{an[-1]:.3g} > {no[-1]:.3g} > {pl[-1]:.3g}")
assert an[-1] > no[-1] > pl[-1]

# %%
MARKERS = dict(zip(KINDS, ("o-", "s-", "^-", "d-")))
COLORS = dict(zip(KINDS, ("C0", "C1", "C2", "C3")))  # one color per stack, in every panel
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.5))
for kind in ("add & norm", "norm only", "add only"):
    ax1.plot(DEPTHS, grad_med[kind], MARKERS[kind], color=COLORS[kind], label=kind)
ax2.plot(DEPTHS, grad_med["plain"], MARKERS["plain"], color=COLORS["plain"], label="plain")
for kind in KINDS:
    ax3.plot(DEPTHS, std_med[kind], MARKERS[kind], color=COLORS[kind], label=kind)
ax1.set(ylabel=r"median $\|\partial L/\partial X_0\|$", title="gradient at the input")
ax2.set(ylabel=r"median $\|\partial L/\partial X_0\|$", title="gradient at the input: plain")
ax3.set(ylabel="median std of $X_L$", title="activations at the top")
for ax in (ax1, ax2, ax3):
    ax.set(xscale="log", yscale="log", xlabel="depth $L$ (sublayers)")
    ax.set_xticks(DEPTHS, [str(d) for d in DEPTHS])
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The two halves of add & norm do different jobs. The **residual** path keeps the gradient
# alive: without it, the gradient dies geometrically (plain) or, more slowly, fades as the
# depth grows (norm only). The **layer norm** keeps the activations at one scale: without it
# (add only), they grow with every sublayer. Add & norm keeps both near 1 at every depth we tried. (These
# are untrained stacks at initialization, the moment where a deep network must first get a
# gradient through.)
#
# ## 3. The blocks, in attnlab's classes
#
# Here is a small Transformer's module tree: two encoder blocks and two decoder blocks.

# %%
D_MODEL, HEADS, FFN_HIDDEN, LAYERS, VOCAB = 32, 4, 64, 2, 100
net = Transformer(VOCAB, d_model=D_MODEL, num_heads=HEADS, num_layers=LAYERS, ffn_hidden=FFN_HIDDEN)
print(net)
# one embedding matrix for the source, the target and the output layer (tie_embeddings=True)
assert net.tgt_embedding is net.src_embedding and net.output.weight is net.src_embedding.weight
# the sublayers, in order, with D2L's attribute names
enc_names = [name for name, _ in net.encoder_blocks[0].named_children()]
dec_names = [name for name, _ in net.decoder_blocks[0].named_children()]
assert enc_names == ["attention", "addnorm1", "ffn", "addnorm2"], enc_names
assert dec_names == ["attention1", "addnorm1", "attention2", "addnorm2", "ffn", "addnorm3"], dec_names

# %% [markdown]
# The sublayers carry D2L's own attribute names (`attention`, `addnorm1`, `ffn`, ... down to
# `dense1`, `W_q`, `ln`), and the sizes have the paper's names where D2L has its own:
#
# | sublayer | attnlab class (attribute) | D2L 11.7 (zh 10.7) |
# |---|---|---|
# | encoder block | `TransformerEncoderBlock` (`encoder_blocks[i]`) | `TransformerEncoderBlock` (`blks`) |
# | &nbsp; self-attention | `MultiHeadAttention` (`attention`) | `MultiHeadAttention` (`attention`) |
# | &nbsp; add & norm | `AddNorm` (`addnorm1`, `addnorm2`) | `AddNorm` (`addnorm1`, `addnorm2`) |
# | &nbsp; position-wise FFN | `PositionWiseFFN` (`ffn`) | `PositionWiseFFN` (`ffn`) |
# | decoder block | `TransformerDecoderBlock` (`decoder_blocks[i]`) | `TransformerDecoderBlock` (`blks`) |
# | &nbsp; masked (causal) self-attention | `MultiHeadAttention` (`attention1`) | `attention1` |
# | &nbsp; encoder–decoder attention | `MultiHeadAttention` (`attention2`) | `attention2` |
# | &nbsp; add & norm, FFN | `addnorm1..3`, `ffn` | `addnorm1..3`, `ffn` |
# | embeddings | `src_embedding`, `tgt_embedding` (tied) | `embedding` in each of encoder and decoder |
# | output layer | `output` (tied to the embedding) | `dense` |
# | width | `d_model` | `num_hiddens` |
# | FFN hidden size | `ffn_hidden` | `ffn_num_hiddens` |
# | heads | `num_heads` | `num_heads` |
# | blocks per stack | `num_layers` | `num_blks` |
#
# D2L's `TransformerEncoder` and `TransformerDecoder` are one class here, `Transformer`, whose
# `encode` and `decode` play their parts; by default it shares one embedding matrix between
# the source, the target and the output layer (`tie_embeddings`), which D2L does not.
#
# ### Counting the parameters by hand
#
# Let $d$ = `d_model` and $f$ = `ffn_hidden`. attnlab's `MultiHeadAttention` has four
# $d \times d$ projections $\mathbf W_q, \mathbf W_k, \mathbf W_v, \mathbf W_o$, **without
# biases** by default (`bias=False`, as D2L's `use_bias=False`), and the blocks do not ask
# for them: $4d^2$. The FFN has two linear layers with biases: $df + f + fd + d$. Each layer
# norm has a scale and a shift: $2d$. So
#
# $$\text{encoder block} = 4d^2 + (2df + f + d) + 2\cdot 2d, \qquad
# \text{decoder block} = 2\cdot 4d^2 + (2df + f + d) + 3\cdot 2d,$$
#
# and with the tied embedding of a vocabulary of $V$ tokens (the positional encoding is a
# fixed buffer, not a parameter) the whole model has $Vd + L(\text{enc} + \text{dec})$. First
# we check that the projections really have no bias, then the counts.

# %%
mha = net.encoder_blocks[0].attention
assert isinstance(mha, MultiHeadAttention)
assert all(getattr(mha, w).bias is None for w in ("W_q", "W_k", "W_v", "W_o"))


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # a shared (tied) tensor counts once


d, f = D_MODEL, FFN_HIDDEN
ffn_by_hand = 2 * d * f + f + d
enc_by_hand = 4 * d**2 + ffn_by_hand + 2 * (2 * d)
dec_by_hand = 2 * 4 * d**2 + ffn_by_hand + 3 * (2 * d)
total_by_hand = VOCAB * d + LAYERS * (enc_by_hand + dec_by_hand)
enc_block, dec_block = net.encoder_blocks[0], net.decoder_blocks[0]
assert isinstance(enc_block, TransformerEncoderBlock) and isinstance(dec_block, TransformerDecoderBlock)
print(f"{'':<16} {'counted':>9} {'by hand':>9}")
for name, module, by_hand in (
    ("encoder block", enc_block, enc_by_hand),
    ("decoder block", dec_block, dec_by_hand),
    ("whole model", net, total_by_hand),
):
    print(f"{name:<16} {count(module):>9,} {by_hand:>9,}")
    assert count(module) == by_hand, (name, count(module), by_hand)

# %% [markdown]
# The model that the pipeline trains has `Transformer`'s default sizes (the values of
# `conf/model/transformer.yaml`, which a test keeps equal to them). Its blocks, by the same
# formula:

# %%
defaults = {k: v.default for k, v in inspect.signature(Transformer).parameters.items()}
d, f, heads = defaults["d_model"], defaults["ffn_hidden"], defaults["num_heads"]
print(f"d_model = {d}, ffn_hidden = {f}, num_heads = {heads}, num_layers = {defaults['num_layers']}")
enc_default = 4 * d**2 + 2 * d * f + f + d + 2 * (2 * d)
dec_default = 2 * 4 * d**2 + 2 * d * f + f + d + 3 * (2 * d)
print(f"encoder block: {enc_default:,} parameters; decoder block: {dec_default:,}")
assert count(TransformerEncoderBlock(d, heads, f, 0.1)) == enc_default
assert count(TransformerDecoderBlock(d, heads, f, 0.1)) == dec_default

# %% [markdown]
# ## 4. The masked decoder is causal
#
# During training the decoder reads the whole target sentence at once (teacher forcing), but
# position $t$ must not see the tokens after it, which it will not have when it translates.
# Its self-attention (`attention1`) is therefore masked: query $t$ attends to keys
# $0, \dots, t$ only (D2L passes the valid lengths $1, 2, \dots, T$; attnlab passes
# `is_causal=True`). The encoder–decoder attention and the FFN act on each position alone, so
# the whole decoder is causal: **changing target tokens after position $t$ leaves the outputs
# at positions $0..t$ unchanged**, while changing the token at position $s$ changes the
# outputs at $s$ and at every position after it.
#
# We check it on the untrained model above, in evaluation mode (no dropout): one source
# sentence, one target of $T$ tokens; for every $t$ a copy of the target with all the tokens
# after $t$ replaced, and for every $s$ a copy with only the token at $s$ replaced. "Unchanged"
# is asserted to $10^{-6}$ (float32 rounding); the tables print the actual largest change.

# %%
torch.manual_seed(1)
net.eval()
T = 8 if FAST else 12
src = torch.randint(1, VOCAB, (1, 7))
src_valid_lens = torch.tensor([7])
tgt = torch.randint(1, VOCAB, (1, T))


def replaced(tokens: torch.Tensor, positions: slice) -> torch.Tensor:
    """A copy of tokens (1, T) with a different token at every one of ``positions``."""
    out = tokens.clone()
    n = len(range(T)[positions])
    out[0, positions] = (tokens[0, positions] + torch.randint(1, VOCAB - 1, (n,))) % VOCAB
    assert (out[0, positions] != tokens[0, positions]).all()
    return out


with torch.no_grad():
    enc = net.encode(src, src_valid_lens)
    base = net.decoder_states(tgt, enc, src_valid_lens)  # (1, T, d_model)

    def change_per_position(tokens: torch.Tensor) -> torch.Tensor:
        """(T,): the largest change of the decoder's output at each position."""
        return (net.decoder_states(tokens, enc, src_valid_lens) - base).abs().amax(-1)[0]

    # every token after t replaced: the outputs at 0..t
    after_t = [
        change_per_position(replaced(tgt, slice(t + 1, None)))[: t + 1].max().item() for t in range(T - 1)
    ]
    # one token, at position s, replaced: the outputs before s, and at s and after
    one = [change_per_position(replaced(tgt, slice(s, s + 1))) for s in range(T)]
before_s = [c[:s].max().item() if s else 0.0 for s, c in enumerate(one)]
from_s = [c[s:].min().item() for s, c in enumerate(one)]
print(f"{'t':>3} {'tokens > t replaced: max change at ≤ t':>40}")
for t, c in enumerate(after_t):
    print(f"{t:>3} {c:>40.2e}")
print(f"{'s':>3} {'token s replaced: max change at < s':>37} {'min change at ≥ s':>18}")
for s in range(T):
    print(f"{s:>3} {before_s[s]:>37.2e} {from_s[s]:>18.3f}")

# %%
assert max(after_t) < 1e-6, after_t  # positions ≤ t never see the tokens after t
assert max(before_s) < 1e-6, before_s  # the same, one token at a time
assert min(from_s) > 1e-3, from_s  # but a token reaches its own and every later position
print("causal: later tokens never reach earlier positions; each token reaches all later ones")

# %% [markdown]
# `Transformer.attention_maps` runs one teacher-forced pass through the explicit attention
# path and returns every layer's and head's weights, (batch, heads, queries, keys). The decoder
# self-attention weights of the first layer are lower triangular: the upper triangle is
# **exactly** 0 (the masked softmax puts exactly 0 there, not merely a small number), and each
# row sums to 1 over the keys it may see.

# %%
with torch.no_grad():
    maps = net.attention_maps(src, src_valid_lens, tgt)
    explicit = net.decoder_states(tgt, enc, src_valid_lens, need_weights=True)
weights = maps["decoder_self"][0][0]  # layer 0, sample 0: (heads, T, T)
assert weights.shape == (HEADS, T, T)
assert torch.all(torch.triu(weights, diagonal=1) == 0)  # exactly 0 above the diagonal
assert torch.allclose(weights.sum(-1), torch.ones(HEADS, T), atol=1e-6)
allowed = torch.ones(T, T, dtype=torch.bool).tril()
assert torch.all(weights[:, allowed] > 0)  # and every allowed key gets some weight
# the explicit path (with weights) and the fused one (without) compute the same outputs
assert torch.allclose(explicit, base, atol=1e-5)
print("upper triangle exactly 0; rows sum to 1")

fig, axes = plt.subplots(1, HEADS, figsize=(2.6 * HEADS, 2.8))
for h, ax in enumerate(axes):
    ax.imshow(weights[h], cmap="Reds", vmin=0, vmax=1)
    ax.set(title=f"head {h}", xlabel="key position")
axes[0].set_ylabel("query position")
plt.show()

# %% [markdown]
# ## 5. The trained model
#
# Everything above used untrained models. `dvc repro` trains the default Transformer (the
# sizes printed in section 3; `conf/model/transformer.yaml`) on Multi30k English→French and
# scores it on the test sets: see
# [Your first run](../../tutorials/first-run/) for the steps and [Results](../../results/) for
# the BLEU scores of every recorded run. Training writes `plots/transformer/explorer.html`, a
# page with the trained model's attention maps (the same three kinds as
# `attention_maps`, every layer and head) after every epoch.

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
