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
# # Transformer：残差连接和层规范化、编码器块与解码器块、因果解码器
#
# [English](../../tutorials/transformer/) · *中文*
#
# 本页对应《动手学深度学习》第 **10.7 节“Transformer”**（英文版 11.7 节 “The Transformer
# Architecture”），使用 attnlab 自己的类（`src/attnlab/models/transformer.py` 和
# `src/attnlab/models/attention.py`）。下文的每个结论都在本页上计算出来，并用 `assert` 检查；
# 网站构建时会运行本页，测试（`tests/test_tutorials.py`）也会运行它，所以一旦某个结论不再成立，
# CI 就会失败。
#
# 你将：
#
# 1. 在一个由不同长度序列填充而成的小批量上，看清 Transformer 为什么对每个位置使用
#    **层规范化**而不是批量规范化；
# 2. 从深层堆叠底部收到的梯度，度量每个子层为什么要包在**残差连接**里（残差连接和层规范化，add & norm）；
# 3. 把编码器和解码器的子层对应到 attnlab 的类和 D2L 的名称，并手算它们的参数量；
# 4. 检查**掩蔽的解码器是因果的**，并画出它的自注意力权重。
#
# **运行时间。** 本页会给自己计时：最后一个单元格打印这里所展示的这次运行（完整模式）用了
# 多久。快速模式（`ATTNLAB_TUTORIAL_FAST=1`，CI 运行的就是它）尺寸更小、随机抽样更少，断言
# 相同。不需要 GPU、数据集或训练好的模型：这里的模型都未经训练，权重由固定种子随机生成。
# 自己运行：`python docs/tutorials/transformer.zh.py`，或借助
# [jupytext](https://jupytext.readthedocs.io/) 在 Jupyter 中打开。

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
# ## 1. 用层规范化，而不是批量规范化
#
# ### D2L 的小例子
#
# 第 10.7.2 节（英文版 11.7.2 节）在训练模式下，用一个含两个样本、每个样本两个特征的小批量
# $\mathbf X = \begin{bmatrix}1 & 2\\ 2 & 3\end{bmatrix}$ 比较二者。**层规范化**对每一*行*
# （一个样本的所有特征）做规范化；**批量规范化**对每一*列*（一个特征在整个小批量上）做规范化。
# 二者都减去均值、再除以 $\sqrt{\sigma^2 + \epsilon}$，其中 $\sigma^2$ 是有偏方差，$\epsilon$
# 取 PyTorch 的默认值 $10^{-5}$。$\mathbf X$ 的每一行、每一列的均值都是某个 $m$，取值都是
# $m \pm 0.5$，所以 $\sigma^2 = 0.25$，每个元素都变成
# $\pm 0.5/\sqrt{0.25 + 10^{-5}} \approx \pm 0.99998$：在这个 $\epsilon$ 的误差内，层规范化得到
# $\begin{bmatrix}-1 & 1\\ -1 & 1\end{bmatrix}$，批量规范化得到
# $\begin{bmatrix}-1 & -1\\ 1 & 1\end{bmatrix}$。

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
# ### 填充过的序列小批量
#
# Transformer 处理的是序列而不是行：一个小批量是形状为（批量大小，时间步数，$d$）的张量，
# 较短的序列被填充到最长序列的长度。批量规范化为每个特征计算一个均值和一个方差，统计范围是
# 小批量中**每个**序列的**每个**位置，填充也算在内。因此，一个句子规范化后的值取决于和它放在
# 同一小批量里的其他句子，也取决于这个小批量有多少填充。层规范化只在一个位置的 $d$ 个特征上
# 计算统计量，不依赖任何别的东西。
#
# 我们取三个长度分别为 5、9、3 的“句子”（用随机向量代替词元的嵌入），在四种情形下对第一个
# 句子做规范化：单独一个；和另外两个一起，填充到 9；只和第三个一起，填充到 5；和另外两个一起，
# 填充到 20 个时间步。我们把它的 5 个输出与它单独时的输出相比较。层规范化直接使用 attnlab 的
# `AddNorm`（`LayerNorm(X + Dropout(Y))`，这里 $\mathbf Y = \mathbf 0$，不用暂退法）。

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
# 在层规范化下，四条曲线互相重合；在批量规范化下，每种情形各画出自己的一条。这就是
# 第 10.7.2 节（英文版 11.7.2 节）说层规范化适合自然语言的原因：序列的长度可变，而一个位置规范化后的值不应该
# 取决于小批量里的其他序列。
#
# ## 2. 残差连接：为什么要“加”上输入再规范化
#
# Transformer 的每个子层（注意力或前馈网络）都包装成
# $\operatorname{LayerNorm}(\mathbf X + \operatorname{sublayer}(\mathbf X))$：即 attnlab 的
# `AddNorm(X, Y)`，其中 $\mathbf Y = \operatorname{sublayer}(\mathbf X)$。残差路径
# $\mathbf X + \dots$ 给梯度提供了一条绕过子层向下传的路。为了看清它带来了什么，我们把 $L$ 个
# 基于位置的前馈网络（attnlab 的 `PositionWiseFFN`，使用 PyTorch 的默认初始化）按四种方式堆叠：
#
# - **残差连接和层规范化**（add & norm）：
#   $\mathbf X \leftarrow \operatorname{LayerNorm}(\mathbf X + f(\mathbf X))$，即 Transformer 的做法；
# - **只有规范化**：$\mathbf X \leftarrow \operatorname{LayerNorm}(f(\mathbf X))$，没有残差连接；
# - **朴素堆叠**：$\mathbf X \leftarrow f(\mathbf X)$；
# - **只有加法**：$\mathbf X \leftarrow \mathbf X + f(\mathbf X)$，没有规范化。
#
# 取 $d = 32$、隐藏层大小 64，对每个深度，我们从顶部送入一个范数为 1 的随机梯度
# $\mathbf g$（损失为 $\langle \mathbf g, \mathbf X_L\rangle$），度量到达输入 $\mathbf X_0$ 的
# 梯度的范数，以及顶部激活值的标准差。图表显示若干随机种子上的中位数（使用 float64，以免
# 极小的梯度下溢为 0）。下面代码输出里的 `add & norm`、`norm only`、`plain`、`add only`
# 依次对应这四种方式。

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
# 残差连接和层规范化这两半各有分工。**残差连接**让梯度存活：没有它，梯度要么按几何级数消失
# （朴素堆叠），要么随深度增加而较慢地衰减（只有规范化）。**层规范化**让激活值保持同一尺度：
# 没有它（只有加法），激活值随每个子层增大。二者合用时（add & norm），在我们试过的每个深度上都让两个量保持在
# 1 附近。（这些都是处于初始化状态、未经训练的堆叠，而这正是深层网络首先要让梯度传下去的
# 时刻。）
#
# ## 3. 用 attnlab 的类搭起来的块
#
# 下面是一个小 Transformer 的模块树：两个编码器块和两个解码器块。

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
# 各子层沿用 D2L 自己的属性名（`attention`、`addnorm1`、`ffn`……直到 `dense1`、`W_q`、
# `ln`），而尺寸在 D2L 自有命名之处用的是论文中的名称：
#
# | 子层 | attnlab 的类（属性） | D2L 第 10.7 节（英文版 11.7 节） |
# |---|---|---|
# | 编码器块 | `TransformerEncoderBlock`（`encoder_blocks[i]`） | `TransformerEncoderBlock`（`blks`） |
# | &nbsp; 自注意力 | `MultiHeadAttention`（`attention`） | `MultiHeadAttention`（`attention`） |
# | &nbsp; 残差连接和层规范化 | `AddNorm`（`addnorm1`、`addnorm2`） | `AddNorm`（`addnorm1`、`addnorm2`） |
# | &nbsp; 基于位置的前馈网络 | `PositionWiseFFN`（`ffn`） | `PositionWiseFFN`（`ffn`） |
# | 解码器块 | `TransformerDecoderBlock`（`decoder_blocks[i]`） | `TransformerDecoderBlock`（`blks`） |
# | &nbsp; 掩蔽（因果）自注意力 | `MultiHeadAttention`（`attention1`） | `attention1` |
# | &nbsp; 编码器－解码器注意力 | `MultiHeadAttention`（`attention2`） | `attention2` |
# | &nbsp; 残差连接和层规范化、前馈网络 | `addnorm1..3`、`ffn` | `addnorm1..3`、`ffn` |
# | 嵌入层 | `src_embedding`、`tgt_embedding`（共享） | 编码器和解码器各一个 `embedding` |
# | 输出层 | `output`（与嵌入共享权重） | `dense` |
# | 宽度 | `d_model` | `num_hiddens` |
# | 前馈网络隐藏层大小 | `ffn_hidden` | `ffn_num_hiddens` |
# | 头数 | `num_heads` | `num_heads` |
# | 每个栈的块数 | `num_layers` | `num_blks` |
#
# D2L 的 `TransformerEncoder` 和 `TransformerDecoder` 在这里合为一个类 `Transformer`，由它的
# `encode` 和 `decode` 分别担任二者的角色；默认情况下，它让源语言嵌入、目标语言嵌入和输出层
# 共享同一个矩阵（`tie_embeddings`），D2L 则不这样做。
#
# ### 手算参数量
#
# 设 $d$ = `d_model`，$f$ = `ffn_hidden`。attnlab 的 `MultiHeadAttention` 有四个 $d \times d$
# 的投影 $\mathbf W_q, \mathbf W_k, \mathbf W_v, \mathbf W_o$，默认**没有偏置**（`bias=False`，
# 与 D2L 的 `use_bias=False` 相同），各个块也不要求偏置：共 $4d^2$。前馈网络有两个带偏置的
# 全连接层：$df + f + fd + d$。每个层规范化有一个缩放和一个平移：$2d$。所以
#
# $$\text{编码器块} = 4d^2 + (2df + f + d) + 2\cdot 2d, \qquad
# \text{解码器块} = 2\cdot 4d^2 + (2df + f + d) + 3\cdot 2d,$$
#
# 再加上词表大小为 $V$ 的共享嵌入（位置编码是固定的缓冲区，不是参数），整个模型有
# $Vd + L(\text{编码器块} + \text{解码器块})$ 个参数。我们先检查投影确实没有偏置，再核对参数量。

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
# 流水线训练的模型使用 `Transformer` 的默认尺寸（即 `conf/model/transformer.yaml` 中的值，
# 有一个测试保证二者一致）。按同一公式，它的块的参数量是：

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
# ## 4. 掩蔽的解码器是因果的
#
# 训练时解码器一次读入整个目标句子（教师强制），但位置 $t$ 不能看到它之后的词元，因为翻译时
# 它还没有这些词元。因此它的自注意力（`attention1`）是掩蔽的：查询 $t$ 只关注键
# $0, \dots, t$（D2L 传入有效长度 $1, 2, \dots, T$；attnlab 传入 `is_causal=True`）。
# 编码器－解码器注意力和前馈网络都逐位置地作用，所以整个解码器是因果的：**改变位置 $t$ 之后的
# 目标词元，位置 $0..t$ 的输出不变**；而改变位置 $s$ 上的词元，会改变位置 $s$ 及其后每个位置的
# 输出。
#
# 我们在上面这个未经训练的模型上、在评估模式下（没有暂退法）检查这一点：一个源句子，一个含
# $T$ 个词元的目标句子；对每个 $t$，把 $t$ 之后的词元全部替换得到一个副本；对每个 $s$，只替换
# 位置 $s$ 上的词元得到一个副本。“不变”按 $10^{-6}$ 的容差断言（float32 的舍入误差）；表格打印
# 实际的最大变化。

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
# `Transformer.attention_maps` 沿显式的注意力计算路径做一次教师强制的前向传播，返回每一层、
# 每个头的权重，形状为（批量大小，头数，查询数，键数）。第一层的解码器自注意力权重是下三角的：
# 上三角**恰好**为 0（掩蔽softmax 在那里给出的就是 0，而不只是一个很小的数），每一行在它能看到
# 的键上之和为 1。

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
# ## 5. 训练好的模型
#
# 上面用的都是未经训练的模型。`dvc repro` 会在 Multi30k 英语→法语数据上训练默认的
# Transformer（尺寸即第 3 节打印的默认值；`conf/model/transformer.yaml`），
# 并在测试集上评分：步骤见[第一次运行](../../tutorials/first-run/)，每次记录在案的运行的 BLEU
# 分数见[结果](../../results/)。训练会写出 `plots/transformer/explorer.html`，这个页面展示训练后
# 模型每个轮次之后的注意力图（与 `attention_maps` 相同的三种，每一层、每个头）。

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
