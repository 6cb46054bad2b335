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
# # 多头注意力：训练好的 Transformer 的各个头在做什么
#
# [English](../../tutorials/multi-head/) · *中文*
#
# 本页对应《动手学深度学习》第 **10.5 节“多头注意力”**（英文版 11.5 节 “Multi-Head Attention”），
# 使用 attnlab 自己的 `MultiHeadAttention`（`src/attnlab/models/attention.py`），考察的是
# **attnlab 的流水线**在 Multi30k 英语→法语数据上**训练出的** Transformer 中的多头注意力。下文的
# 每个结论都在本页上计算出来，并用 `assert` 检查；网站构建时会运行本页，测试
# （`tests/test_tutorials.py`）也会运行它，所以一旦某个结论不再成立，CI 就会失败。
#
# 你将：
#
# 1. 用训练好的权重逐个头地手算一层的多头注意力，并数一数它的参数；
# 2. 度量**每个自注意力头看得多远**：逐个头计算一个词元与它所关注的词元之间的平均距离
#    $|i-j|$；
# 3. 读出**头的统计量**（每个头各行注意力权重的熵和置信度），并看到一个交叉注意力头把 *chat*
#    对齐到 *cat*；
# 4. 度量**头的重要性**（Michel et al. 2019）：掩蔽一个头时损失的 BLEU，以及在逐个剪除头
#    的过程中损失的 BLEU；
# 5. 在嵌入本页的**注意力浏览器**中查看每一层的每个头。
#
# **训练好的模型。** 完整模式（网站就是这样构建的）读取本项目中由 `dvc repro` 训练的
# Transformer（`runs/transformer.json`，即 `train@transformer` 阶段；见
# [第一次运行](../../tutorials/first-run/)）。快速模式（`ATTNLAB_TUTORIAL_FAST=1`，CI 运行的就是
# 它）用同一个 `src/train.py`、同一套配方（`params.yaml`）自己训练一个模型，只训练两轮，放在项目的
# `.cache/trained/` 中，并在更少的句子上检查同样的断言。如果流水线的模型不存在，完整模式也会这样
# 做，并说明这一点。本页会打印它的模型来自哪个 MLflow 运行、哪次提交。
#
# **运行时间。** 最后一个单元格打印这里所展示的这次运行用了多久，第一个代码单元格打印得到模型
# 用了多久。快速模式的两轮训练在 2 个空闲的 CPU 核上大约需要三分钟，机器繁忙时要长好几倍。它只
# 训练一次：之后的运行会复用它，直到代码、配置或 `params.yaml` 改变。训练需要语料库，从互联网
# 下载，或从 `ATTNLAB_DATA_MIRROR` 所指的文件夹读取。自己运行本页：`python docs/tutorials/multi-head.zh.py`，
# 或借助 [jupytext](https://jupytext.readthedocs.io/) 在 Jupyter 中打开。

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
# ## 1. 手算多头注意力
#
# 一个注意力汇聚只通过一组权重来看这些值。多头注意力则并排运行 $h$ 个注意力汇聚，每个都作用在
# 它自己学到的查询、键和值的投影上（式 (10.5.1)，英文版式 (11.5.1)）：
#
# $$\mathbf h_i = \operatorname{softmax}\!\Big(\frac{(\mathbf Q\mathbf W_i^{(q)})
# (\mathbf K\mathbf W_i^{(k)})^\top}{\sqrt{d_h}}\Big)\,\mathbf V\mathbf W_i^{(v)},\qquad
# \operatorname{MultiHead}(\mathbf Q,\mathbf K,\mathbf V) = [\mathbf h_1, \dots, \mathbf h_h]\,
# \mathbf W_o,$$
#
# 其中 $d_h = d_\text{model}/h$。attnlab 和 D2L 一样，把查询、键、值各自的 $h$ 个宽度为 $d_h$
# 的投影分别存成一个 $d_\text{model}\times d_\text{model}$ 矩阵（`W_q`、`W_k`、`W_v`）：头 $i$
# 占有其中的第 $i d_h, \dots, (i+1)d_h-1$ 列。因此 $h$ 个头的参数量与一个宽的头相同，都是
# $4 d_\text{model}^2$（没有偏置），乘加次数也相同。
#
# 下面用训练好的权重，在一个句子上、以第一个编码器层的真实输入（用前向钩子截获）逐个头地重算
# 这一层的注意力，并与该层自己的输出和注意力权重相比较。

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
# ## 2. 每个头看得多远？
#
# 每个头都有自己的投影，所以每个头都能学到自己的一套“哪些词元要紧”的看法。一个简单的度量是
# **距离**：对词元 $i$，取 $|i-j|$ 在它那一行注意力权重下的期望 $\sum_j \alpha_{ij}\,|i-j|$，
# 再对许多验证集句子的每个词元求平均。关注相邻词元的头得分约为 1；把权重均匀分散开的头在含
# $n$ 个词元的句子上得分为 $\frac{n^2-1}{3n}$，即图中的**均匀注意力**（uniform attention）线
# （以同样的方式求平均）。

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
# 每个头都比均匀分散时更多地关注附近的词元，而且同一层的各个头互不相同：在第一层，最局部的
# 那个头的平均距离不到均匀分散时的四分之三，各个头的距离相差一个词元以上。其余的请看图：
# 平均只看两三个词元以内的头旁边，也有平均距离接近均匀分散时的头。每个头学到什么并不是设计
# 出来的，而是训练出来的；
# 换一个随机种子，分工可能就不一样。
#
# ## 3. 头的统计量，以及一个做对齐的头
#
# `attnlab.analysis.heads.head_statistics` 就是流水线在每个轮次的验证之后记录到 MLflow 的内容：
# 对每一层、每个头，给出各行注意力权重的平均**熵**（单位为奈特；均匀分散时为 $\log n$，独热的
# 行为 0）和平均**置信度**（每行中最大的权重；Voita et al. 2019，第 4 节）。

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
# 编码器自注意力的每个头都比任何一个交叉注意力头分散得更广（熵更高）：编码器从整个源句子中汇集
# 上下文，而读取源句子的解码器只看较少的几处。解码器自注意力各行的熵低，部分是结构使然：因果
# 掩码让位置 $t$ 只有 $t+1$ 个键。这两个统计量还能互相验证：最大权重为 $c$ 的一行，熵至少为
# $-\log c$，所以平均置信度至少是 $e^{-\text{平均熵}}$（对每个头都做了断言）。
#
# 交叉注意力（`encoder_decoder`）头是解码器读取源句子的地方，就像
# [上一页](../../tutorials/bahdanau.zh/)中 Bahdanau 注意力的对齐。用强制教学让模型读入
# "The cat is on the mat." → "Le chat est sur le
# tapis."，就能分别看到最后一层每个头的权重，以及它们的平均：

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
# ## 4. 头的重要性：每个头都需要吗？
#
# Michel et al. (2019), "Are Sixteen Heads Really Better than One?" 在测试时**掩蔽**一个头（在
# 乘 $\mathbf W_o$ 之前把它的输出乘以 0），并度量分数因此损失多少：这就是该头的重要性。然后他们
# 按重要性从低到高剪除头（分步进行，按基于梯度的重要性估计排序）。
# `attnlab.analysis.pruning.head_importance` 逐个单独掩蔽每个头来度量它的重要性，再按重要性从低
# 到高一次剪除一个头，用的是 attnlab 的 `MultiHeadAttention` 的头掩码。流水线的 `head_importance`
# 阶段在训练好的模型上运行它（`metrics/transformer.heads.json`）。分数是验证集句子上贪心搜索解码的
# BLEU，要把这些句子翻译约 50 遍：完整模式读取该阶段对流水线模型算出的结果（300 个句子），
# 快速模式则在这里用 100 个句子计算。

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
# Michel et al. 也发现了同样的现象：大多数头可以**一次去掉一个**而几乎不付出代价，少数头则不行，
# 而一次去掉许多头会损害性能。在这里，最要紧的头是一个交叉注意力头，也就是目标序列读取源序列
# 的地方。
#
# ## 5. 在浏览器中查看每个头
#
# attnlab 的注意力浏览器（`attnlab.analysis.explorer`）展示一次翻译中每种注意力、每一层和每个头
# 的权重；流水线在每个轮次之后为它的验证集句子写出一个（`plots/transformer/explorer.html` 以及
# MLflow 中），`src/translate.py … +show_attention=true` 则为你自己的句子写出一个。下面是本页
# 的模型所翻译的三个句子的浏览器。选择句子、注意力的种类和层；把鼠标悬停在一个格子上，就能
# 看到它的权重。

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
# 另见 `MultiHeadAttention` 的
# [API 参考](../../reference/api/models/#attnlab.models.attention.MultiHeadAttention)，
# 以及讲解这些层所在的块的 [Transformer 一页](../../tutorials/transformer.zh/)。

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
