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
# # Multi-head attention: what the heads of a trained Transformer do
#
# *English* · [中文](../../tutorials/multi-head.zh/)
#
# This page follows *Dive into Deep Learning* section **11.5 "Multi-Head Attention"** (Chinese
# edition 10.5 多头注意力) with attnlab's own `MultiHeadAttention`
# (`src/attnlab/models/attention.py`) inside the Transformer **trained by attnlab's pipeline** on
# Multi30k English→French. Every claim below is computed on this page and checked with an
# `assert`; the site runs the page when it is built, and the tests run it too
# (`tests/test_tutorials.py`), so a claim that stops being true fails CI.
#
# You will:
#
# 1. recompute one layer's multi-head attention by hand, head by head, from the trained
#    weights, and count its parameters;
# 2. measure **how far each self-attention head looks**: the mean distance $|i-j|$ between a
#    token and the tokens it attends to, head by head;
# 3. read the **head statistics** (entropy and confidence of each head's rows) and see a
#    cross-attention head align *chat* with *cat*;
# 4. measure **head importance** (Michel et al. 2019): the BLEU lost when one head is masked,
#    and as heads are pruned one by one;
# 5. browse every head of every layer in the **attention explorer**, embedded in the page.
#
# **The trained model.** The full mode (how the site is built) reads the Transformer that
# `dvc repro` trained in this project (`runs/transformer.json`, the `train@transformer` stage;
# see [Your first run](../../tutorials/first-run/)). The fast mode (`ATTNLAB_TUTORIAL_FAST=1`,
# what CI runs) trains its own for two epochs with the same `src/train.py` and the same recipe
# (`params.yaml`), in `.cache/trained/` of the project, and checks the same assertions on fewer
# sentences. If the pipeline's model is missing, the full mode does the same and says so. The
# page prints the MLflow run and the commit its model comes from.
#
# **Running time.** The last cell prints how long the run shown here took, and the first code
# cell how long getting the model took. The two-epoch training of the fast mode takes about
# three minutes on 2 idle CPU cores, several times that on a busy machine. It runs once: later
# runs reuse it until the code, the configs or `params.yaml` change. It needs the corpus, from
# the internet or from the folder in `ATTNLAB_DATA_MIRROR`. To run the
# page yourself: `python docs/tutorials/multi-head.py`, or open it in Jupyter with
# [jupytext](https://jupytext.readthedocs.io/).

# %%
import html
import json
import math
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import HTML, display

import attnlab
from attnlab.analysis.explorer import translation_epoch, translation_explorer
from attnlab.analysis.heads import head_statistics
from attnlab.analysis.provenance import git_commit
from attnlab.analysis.pruning import head_importance
from attnlab.analysis.trained import trained_model
from attnlab.analysis.viz import collect_translation_maps
from attnlab.data.corpora import read_lines
from attnlab.data.special_tokens import BOS_ID, EOS_ID, PAD_ID
from attnlab.inference.decoding import translate_text
from attnlab.metrics import corpus_scores

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # a two-epoch model, fewer sentences, same assertions
ROOT = Path(attnlab.__file__).resolve().parents[2]  # the project: params.yaml, runs/
print("mode:", "fast" if FAST else "full")

# fast: a two-epoch run of the pipeline's recipe; full: the pipeline's model (or that run, if none)
model = trained_model("transformer", ROOT, epochs=2 if FAST else None, fallback_epochs=2)
net, sp = model.net, model.tokenizer
# the examples below are English→French: a model of another direction (params.yaml) cannot show them
assert model.tokenized.name.endswith("-en-fr"), f"this page needs an en→fr model, not {model.tokenized.name}"
print(f"model ready after {time.perf_counter() - START:.1f} s")
layers = net.attention_layers()  # kind → [MultiHeadAttention per layer]
H, L = layers["encoder_self"][0].num_heads, len(layers["encoder_self"])
d_model = layers["encoder_self"][0].W_q.in_features
print("model:", model.origin)
print(f"{L} encoder and {L} decoder layers, {H} heads of width {d_model // H} (d_model = {d_model})")

# %% [markdown]
# ## 1. Multi-head attention, by hand
#
# One attention pooling sees the values through one set of weights. Multi-head attention runs
# $h$ of them side by side, each on its own learned projections of the queries, keys and values
# (D2L eq. 11.5.1 (zh 10.5.1)):
#
# $$\mathbf h_i = \operatorname{softmax}\!\Big(\frac{(\mathbf Q\mathbf W_i^{(q)})
# (\mathbf K\mathbf W_i^{(k)})^\top}{\sqrt{d_h}}\Big)\,\mathbf V\mathbf W_i^{(v)},\qquad
# \operatorname{MultiHead}(\mathbf Q,\mathbf K,\mathbf V) = [\mathbf h_1, \dots, \mathbf h_h]\,
# \mathbf W_o,$$
#
# with $d_h = d_\text{model}/h$. attnlab, like D2L, keeps the $h$ projections of width $d_h$ as
# one $d_\text{model}\times d_\text{model}$ matrix each (`W_q`, `W_k`, `W_v`): head $i$ owns the
# columns $i d_h, \dots, (i+1)d_h-1$. So $h$ heads cost the parameters of one wide head,
# $4 d_\text{model}^2$ (no biases), and the same multiply-adds.
#
# Below, the first encoder layer's attention is recomputed head by head from the trained
# weights, on its real input for one sentence (caught with a forward hook), and compared with
# the layer's own output and weights.

# %%
sentence = "Two dogs play in the snow near a red fence."
src, src_lens = sp.encode_sources([sentence])  # (1, S), (1,)
caught = {}
attention = layers["encoder_self"][0]
hook = attention.register_forward_hook(lambda module, args, output: caught.update(args=args, output=output))
with torch.no_grad():
    maps = net.attention_maps(src, src_lens, torch.tensor([[BOS_ID]]))
hook.remove()
X = caught["args"][0][0]  # (S, d_model): the layer's input (queries = keys = values)
d_h = d_model // H
heads = []
with torch.no_grad():
    for i in range(H):
        cols = slice(i * d_h, (i + 1) * d_h)  # head i's columns of W_q, W_k, W_v
        q = X @ attention.W_q.weight[cols].T  # (S, d_h)
        k = X @ attention.W_k.weight[cols].T
        v = X @ attention.W_v.weight[cols].T
        alpha = torch.softmax(q @ k.T / d_h**0.5, dim=-1)  # (S, S): no padding in a batch of one
        assert torch.allclose(alpha, maps["encoder_self"][0][0, i], atol=1e-5)  # the layer's head i
        heads.append(alpha @ v)  # (S, d_h)
    by_hand = torch.cat(heads, dim=-1) @ attention.W_o.weight.T  # (S, d_model): [h_1 … h_h] W_o
print("largest difference from the layer's output:", float((by_hand - caught["output"][0]).abs().max()))

# %%
assert torch.allclose(by_hand, caught["output"][0], atol=1e-4)
n_params = sum(p.numel() for p in attention.parameters())
print(f"parameters of one multi-head attention: {n_params:,} = 4 · {d_model}²")
assert n_params == 4 * d_model**2  # W_q, W_k, W_v, W_o; no biases

# %% [markdown]
# ## 2. How far does each head look?
#
# Each head has its own projections, so each can learn its own notion of which tokens matter.
# A simple measure is **distance**: for token $i$, the expected $|i-j|$ under its attention row,
# $\sum_j \alpha_{ij}\,|i-j|$, averaged over every token of many validation sentences. A head that
# attends to its neighbours scores about 1; one that spreads its weight evenly scores
# $\frac{n^2-1}{3n}$ on a sentence of $n$ tokens, the **uniform** line in the figure (averaged the
# same way).

# %%
N_VAL = 200 if FAST else 1000  # validation sentences
sources = read_lines(model.tokenized / "val.src.txt")[:N_VAL]
targets = read_lines(model.tokenized / "val.tgt.txt")[:N_VAL]
src, src_lens = sp.encode_sources(sources)
tgt = [torch.tensor([BOS_ID] + sp.encode(t) + [EOS_ID]) for t in targets]
tgt = torch.nn.utils.rnn.pad_sequence(tgt, batch_first=True, padding_value=PAD_ID)
batch = {"src": src, "src_valid_lens": src_lens, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}
with torch.no_grad():
    maps = net.attention_maps(src, src_lens, batch["tgt_in"])

S = src.shape[1]
pos = torch.arange(S)
dist = (pos[:, None] - pos[None, :]).abs().double()  # (S, S): |i − j|
rows = (pos[None] < src_lens[:, None]).double()  # (B, S): real tokens, not padding
distance = torch.stack(
    [((w.double() * dist).sum(-1) * rows[:, None]).sum((0, 2)) / rows.sum() for w in maps["encoder_self"]]
)  # (L, H): mean |i − j| per layer and head
n = src_lens.double()
uniform = float(((n**2 - 1) / 3).sum() / n.sum())  # Σ_sentences n·(n²−1)/(3n) / Σ n
for layer in range(L):
    print(f"encoder layer {layer + 1}: mean |i−j| per head", [round(x, 2) for x in distance[layer].tolist()])
print(f"uniform attention: {uniform:.2f}")

fig, ax = plt.subplots(figsize=(6.5, 3.5), layout="constrained")
for layer in range(L):
    ax.bar([layer * (H + 1) + h for h in range(H)], distance[layer], label=f"layer {layer + 1}")
ax.axhline(uniform, color="gray", linestyle="--", label="uniform attention")
ax.set_xticks(
    [layer * (H + 1) + h for layer in range(L) for h in range(H)],
    [f"h{h + 1}" for _ in range(L) for h in range(H)],
)
ax.set(ylabel="mean |i − j| (tokens)", title="encoder self-attention: how far each head looks")
ax.legend(fontsize=8)
plt.show()

# %%
assert torch.all(distance < uniform)  # every head looks nearer than an even spread would
most_local = float(distance[0].min())
assert most_local < 0.75 * uniform, (most_local, uniform)  # a short-range head in the first layer
assert float(distance[0].max() - distance[0].min()) > 1.0  # and the heads of a layer differ

# %% [markdown]
# Every head attends more to nearby tokens than an even spread would, and the heads of one layer
# differ: in the first layer the most local head stays below three quarters of the even
# spread's distance, and the heads' distances span more than a token. The figure shows the
# rest: heads that stay within two or three tokens on average, beside heads whose distance
# comes close to the even spread's. What each head learns is not designed; it comes out of
# training, and another seed can give another split.
#
# ## 3. Head statistics, and a head that aligns
#
# `attnlab.analysis.heads.head_statistics` is what the pipeline logs to MLflow after every
# validation epoch: per layer and head, the mean **entropy** of the attention rows (in nats;
# $\log n$ for an even spread, 0 for a one-hot row) and their mean **confidence** (the largest
# weight of each row; Voita et al. 2019, section 4).

# %%
with torch.no_grad():
    stats = head_statistics(net, batch)
kinds = list(layers)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), layout="constrained")
for ax, name in zip(axes, ("entropy", "confidence")):
    grid = torch.tensor(
        [[[stats[f"{name}/{k}/layer{i + 1}/head{h + 1}"] for h in range(H)] for i in range(L)] for k in kinds]
    ).reshape(len(kinds) * L, H)
    im = ax.imshow(grid, cmap="viridis")
    ax.set_yticks(range(len(kinds) * L), [f"{k} L{i + 1}" for k in kinds for i in range(L)], fontsize=8)
    ax.set_xticks(range(H), [f"head {h + 1}" for h in range(H)])
    for (r, c), v in zip(((r, c) for r in range(grid.shape[0]) for c in range(H)), grid.flatten().tolist()):
        ax.text(c, r, f"{v:.2f}", ha="center", va="center", color="white", fontsize=7)
    ax.set_title(name)
    fig.colorbar(im, ax=ax, shrink=0.8)
plt.show()

entropy = {
    k: [stats[f"entropy/{k}/layer{i + 1}/head{h + 1}"] for i in range(L) for h in range(H)] for k in kinds
}
for k in kinds:
    print(f"{k:16} entropy per head: {min(entropy[k]):.2f} to {max(entropy[k]):.2f} nats")

# %%
for name, value in stats.items():  # per row, max_k α_k ≥ e^{−H}; averaged, by Jensen's inequality
    if name.startswith("entropy/"):
        assert stats[name.replace("entropy/", "confidence/")] >= math.exp(-value) - 1e-9, name
assert min(entropy["encoder_self"]) > max(entropy["encoder_decoder"])  # the encoder spreads widest

# %% [markdown]
# Every encoder self-attention head spreads its weight wider (higher entropy) than any
# cross-attention head: the encoder mixes context from across the source, while the decoder
# reading the source looks at fewer places. The decoder's self-attention rows have low entropy
# partly by construction: the causal mask leaves position $t$ only $t+1$ keys. The two
# statistics also check each other: a row whose largest weight is $c$ has entropy at least
# $-\log c$, so the mean confidence is at least $e^{-\text{mean entropy}}$ (asserted for every
# head).
#
# The cross-attention (`encoder_decoder`) heads are where the decoder reads the source, like
# Bahdanau's alignment on the [previous page](../../tutorials/bahdanau/). Teacher-forcing "The
# cat is on the mat." → "Le chat est sur le tapis." through the model shows each head of the
# last layer separately, and their mean:

# %%
source, target = "The cat is on the mat.", "Le chat est sur le tapis."
one_src, one_lens = sp.encode_sources([source])
ids = sp.encode(target)
with torch.no_grad():
    cross = net.attention_maps(one_src, one_lens, torch.tensor([[BOS_ID] + ids]))["encoder_decoder"][-1][0]
src_pieces = [sp.id_to_piece(int(i)) for i in one_src[0]]
tgt_pieces = [sp.id_to_piece(i) for i in ids]
panels = [*cross, cross.mean(0)]
fig, axes = plt.subplots(1, H + 1, figsize=(3 * (H + 1), 3.4), layout="constrained", sharey=True)
for ax, w, title in zip(axes, panels, [f"head {h + 1}" for h in range(H)] + ["mean of the heads"]):
    ax.imshow(w, cmap="Reds", vmin=0, vmax=1)
    ax.set_xticks(range(len(src_pieces)), src_pieces, rotation=90, fontsize=7)
    ax.set_yticks(range(len(tgt_pieces)), tgt_pieces, fontsize=7)
    ax.set_title(title, fontsize=9)
plt.show()

# %%
chat, cat = tgt_pieces.index("▁chat"), src_pieces.index("▁cat")
best_heads = [h + 1 for h in range(H) if int(cross[h, chat].argmax()) == cat]
print("last-layer heads whose 'chat' row looks most at 'cat':", best_heads)
assert int(cross.mean(0)[chat].argmax()) == cat  # the heads together align chat with cat
assert best_heads  # and at least one head does so on its own

# %% [markdown]
# ## 4. Head importance: do we need every head?
#
# Michel et al. (2019), "Are Sixteen Heads Really Better than One?", **mask** a head (multiply
# its output by 0 before $\mathbf W_o$) at test time and measure what the score loses: the head's
# importance. Then they prune heads, least important first (in steps, ranked by a
# gradient-based estimate of the importance). `attnlab.analysis.pruning.head_importance` measures
# each head's importance by masking it alone, then prunes one head at a time, least important
# first, with the head masks of attnlab's `MultiHeadAttention`. The pipeline's `head_importance`
# stage runs it on the trained model (`metrics/transformer.heads.json`). The score is greedy BLEU
# on validation sentences, about 50 translations of them: the full mode reads that stage's result
# for the pipeline's model (300 sentences), the fast mode computes it here on 100.

# %%
N_BLEU = 100 if FAST else 300  # validation sentences per score (the stage uses 300)
bleu_src = read_lines(model.tokenized / "val.src.txt")[:N_BLEU]
bleu_ref = read_lines(model.tokenized / "val.tgt.txt")[:N_BLEU]


def bleu() -> float:
    return corpus_scores(translate_text(net.init_state, net.step, sp, bleu_src), bleu_ref)["bleu"]


STAGE = ROOT / "plots" / "heads" / "transformer" / "importance.json"  # the head_importance stage's
if not FAST and model.epochs is None and STAGE.exists():  # the pipeline's model and stage
    result = json.loads(STAGE.read_text(encoding="utf-8"))  # its output for the pipeline's model
    N_BLEU = result["num_sentences"]
    print(f"read from the pipeline's head_importance stage: {STAGE.relative_to(ROOT)}")
else:
    result = head_importance(net, bleu)  # about 50 scores: every head masked alone, then pruned
importance = {(h["kind"], h["layer"], h["head"]): h["importance"] for h in result["heads"]}
ranked = sorted(importance.items(), key=lambda kv: kv[1], reverse=True)
print(f"greedy BLEU on {N_BLEU} val sentences, every head on: {result['score']:.2f}")
for (kind, layer, head), value in ranked[:3]:
    print(f"  most important: {kind} layer {layer} head {head}: masking it costs {value:.2f} BLEU")
curve = result["pruning"]
half = curve[len(curve) // 2]
print(f"{half['pruned']} of {len(importance)} heads pruned: BLEU {half['score']:.2f}")
print(f"all {len(importance)} pruned: BLEU {curve[-1]['score']:.2f}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.4), layout="constrained", width_ratios=[3, 2])
grid = torch.tensor([[[importance[(k, i + 1, h + 1)] for h in range(H)] for i in range(L)] for k in kinds])
im = ax1.imshow(
    grid.reshape(len(kinds) * L, H), cmap="coolwarm", vmin=-grid.abs().max(), vmax=grid.abs().max()
)
ax1.set_yticks(range(len(kinds) * L), [f"{k} L{i + 1}" for k in kinds for i in range(L)], fontsize=8)
ax1.set_xticks(range(H), [f"head {h + 1}" for h in range(H)])
ax1.set_title("BLEU lost when the head alone is masked")
fig.colorbar(im, ax=ax1, shrink=0.8)
ax2.plot([p["pruned"] for p in curve], [p["score"] for p in curve], marker=".")
ax2.set(xlabel="heads pruned (least important first)", ylabel="greedy val BLEU", title="pruning")
plt.show()

# %%
values = sorted(importance.values())
median = values[len(values) // 2]
print(f"median importance: {median:.2f} BLEU; largest: {ranked[0][1]:.2f}")
assert median < 0.1 * result["score"]  # most single heads can go at a small cost …
assert ranked[0][1] > 3 * max(median, 0.1)  # … while a few matter much more
assert curve[-1]["score"] < 0.2 * result["score"]  # and without any head the model fails
assert half["score"] < result["score"]  # pruning half of them costs BLEU
assert ranked[0][0][0] == "encoder_decoder"  # the most important head reads the source

# %% [markdown]
# Michel et al. found the same: most heads can be removed **one at a time** at little cost, a
# few cannot, and removing many at once hurts. Here the most important head is a
# cross-attention head, where the target reads the source.
#
# ## 5. Every head, in the explorer
#
# attnlab's attention explorer (`attnlab.analysis.explorer`) shows every kind, layer and head of
# a translation; the pipeline writes one for its validation sentences after every epoch
# (`plots/transformer/explorer.html` and MLflow), and `src/translate.py … +show_attention=true`
# writes one for your sentences. Here it is for three sentences translated by this page's model.
# Choose the sentence, the kind and the layer; hover over a cell for its weight.

# %%
explored = ["The cat is on the mat.", sentence, "A man in a blue shirt is riding a bike down the street."]
page = translation_explorer(
    [translation_epoch(collect_translation_maps(net, sp, explored), 1, label="translation")],
    "attnlab: the heads of the tutorial's Transformer",
)
assert page.lstrip().lower().startswith("<!doctype html>") and "bokeh" in page.lower()
frame = f'<iframe srcdoc="{html.escape(page)}" style="width: 100%; height: 760px; border: 0"></iframe>'
display(HTML(f"<div>{frame}</div>"))  # the page inline: the site needs no file beside it
print(
    f"explorer: {len(page) / 1e6:.1f} MB, {len(explored)} sentences (drawn above in a notebook, on the site)"
)

# %% [markdown]
# See also the [API reference](../../reference/api/models/#attnlab.models.attention.MultiHeadAttention)
# of `MultiHeadAttention`, and the [Transformer page](../../tutorials/transformer/) for the blocks
# these layers sit in.

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
