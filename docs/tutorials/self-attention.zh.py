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
# # 自注意力和位置编码
#
# [English](../../tutorials/self-attention/) · *中文*
#
# 本页对应《动手学深度学习》第 **10.6 节“自注意力和位置编码”**（英文版 11.6 节 “Self-Attention
# and Positional Encoding”），用 attnlab 自己的代码来讲。在自注意力中，每个词元同时充当查询、键和值。
# 下文的每个结论都在本页上计算出来，并用 `assert` 检查；网站构建时会运行本页，测试
# （`tests/test_tutorials.py`）也会运行它，所以一旦某个结论不再成立，CI 就会失败。
#
# 你将：
#
# 1. 在三个词元“早 / 上 / 好”上手算 $\operatorname{softmax}(\mathbf X\mathbf X^\top)\mathbf X$，
#    并与 attnlab 的 `DotProductAttention` 对照；
# 2. 度量书中比较卷积神经网络、循环神经网络和自注意力的那张表的各列（以浮点运算次数表示的
#    计算复杂度、顺序操作、最大路径长度），再加上内存和时间，随序列长度 $n$ 的变化；
# 3. 画出正弦位置编码，并检查 $\mathbf p_{i+\delta}$ 是 $\mathbf p_i$ 的一个固定线性变换（旋转）。
#
# **运行时间。** 本页会给自己计时：最后一个单元格打印这里所展示的这次运行（完整模式）用了
# 多久。快速模式（`ATTNLAB_TUTORIAL_FAST=1`，CI 运行的就是它）计时的序列更少、更短，断言相同。
# 不需要 GPU、数据集或训练好的模型。自己运行：`python docs/tutorials/self-attention.zh.py`，
# 或借助 [jupytext](https://jupytext.readthedocs.io/) 在 Jupyter 中打开。

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
# ## 1. 三个词元上的 softmax(XXᵀ)X
#
# 取句子“早上好”，三个词元，给每个词元手选一个二维嵌入，作为 $\mathbf X \in \mathbb R^{3\times 2}$
# 的各行：早 $=(1, 0)$，上 $=(1, 1)$，好 $=(0, 2)$。
# 最简单形式的自注意力（10.6.1 节）把 $\mathbf X$ 同时用作查询、键和值：
#
# $$\mathbf Y = \operatorname{softmax}(\mathbf X\mathbf X^\top)\,\mathbf X .$$
#
# **第一步：评分。** $\mathbf X\mathbf X^\top$ 的 $(i, j)$ 元素是内积
# $\mathbf x_i^\top\mathbf x_j$。这些都是整数，心算即可：
# 早·早 $= 1$，早·上 $= 1$，早·好 $= 0$，上·上 $= 2$，上·好 $= 2$，好·好 $= 4$。

# %%
LABELS = ["zǎo", "shàng", "hǎo"]  # 早, 上, 好 in pinyin: matplotlib's default font has no CJK glyphs
X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)  # (3 tokens, d = 2)

S = X @ X.T
S_hand = torch.tensor([[1, 1, 0], [1, 2, 2], [0, 2, 4]], dtype=torch.float64)
print(S)
assert torch.equal(S, S_hand)  # exact: integer inner products
assert torch.equal(S, S.T)  # x_i·x_j = x_j·x_i: self-attention scores are symmetric

# %% [markdown]
# **第二步：逐行 softmax。** 第 $i$ 行变成词元 $i$ 分给各个词元的注意力权重，
# $\alpha_{ij} = e^{s_{ij}}/\sum_k e^{s_{ik}}$。手算（$e = 2.718\ldots$）：
# “早”这一行是 $(e, e, 1)/(2e + 1)$，“上”这一行是 $(e, e^2, e^2)/(e + 2e^2)$，
# “好”这一行是 $(1, e^2, e^4)/(1 + e^2 + e^4)$。

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
# **第三步：加权和。** 输出 $i$ 是 $\mathbf y_i = \sum_j \alpha_{ij}\mathbf x_j$。
# 我们用纯 Python 把向量加起来再对照。权重都为正且和为 1，所以 $\mathbf y_i$ 落在三个嵌入
# 所围成的三角形内部，而它在这个三角形中的重心坐标恰好就是权重的第 $i$ 行：

# %%
Y = A @ X
Y_hand = [[sum(A_hand[i, j].item() * X[j, c].item() for j in range(3)) for c in range(2)] for i in range(3)]
print(Y.numpy().round(4))
assert torch.allclose(Y, torch.tensor(Y_hand, dtype=torch.float64), rtol=0, atol=1e-15)
ones = torch.ones(3, 1, dtype=torch.float64)
barycentric = torch.cat([Y, ones], 1) @ torch.linalg.inv(torch.cat([X, ones], 1))  # (3, 3)
assert torch.allclose(barycentric, A, rtol=0, atol=1e-14) and torch.all(barycentric > 0)

# %% [markdown]
# **attnlab 的 `DotProductAttention`** 会把评分除以 $\sqrt d$（10.3 节；见
# [评分函数一页](../../tutorials/scoring.zh/)）：对 $(\mathbf X, \mathbf X, \mathbf X)$ 调用它，
# 算的是 $\operatorname{softmax}(\mathbf X\mathbf X^\top/\sqrt 2)\mathbf X$。把查询乘以 $\sqrt d$
# 就抵消了缩放，得到上面的 $\mathbf Y$。`MultiHeadAttention`（多头注意力）则是在可学习的投影
# $\mathbf W_q, \mathbf W_k, \mathbf W_v, \mathbf W_o$ 之后做同样的计算：只用一个头、四个投影都设为
# 单位矩阵时，它就是 `DotProductAttention`。

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
# 没有可学习的投影时，一个词元与自身的评分就是它的范数平方，所以较长的向量（好）主要关注
# 它自己。`MultiHeadAttention` 的投影 $\mathbf W_q, \mathbf W_k$ 让模型学会哪些词元该关注哪些词元。
#
# ## 2. 度量卷积神经网络、循环神经网络和自注意力
#
# 10.6.2 节比较了三种层，它们都把 $n$ 个宽度为 $d$ 的词元组成的序列映射成同样形状的序列：
# 卷积核大小为 $k$ 的卷积层、循环神经网络层和自注意力层：
#
# | 层 | 计算复杂度 | 顺序操作 | 最大路径长度 |
# |---|---|---|---|
# | 卷积神经网络 | $O(knd^2)$ | $O(1)$ | $O(n/k)$ |
# | 循环神经网络 | $O(nd^2)$ | $O(n)$ | $O(n)$ |
# | 自注意力 | $O(n^2d)$ | $O(1)$ | $O(1)$ |
#
# 书中自注意力的 $O(n^2d)$ 只计入了缩放点积注意力本身，查询、键和值都直接就是 $\mathbf X$。
# 它略去了真实注意力层中的投影 $\mathbf W_q, \mathbf W_k, \mathbf W_v, \mathbf W_o$，即一个
# $O(nd^2)$ 项，而这里度量的层有这些投影。这一项并非无关紧要：下面与 GRU 在 $n = d$ 处的浮点
# 运算交叉点正是由它而来。
#
# 我们逐列度量：`torch.nn.Conv1d`（$d \to d$ 个通道，$k = 3$，填充 $k//2$）、`torch.nn.GRU`
# （输入和隐状态大小都是 $d$），以及用作自注意力的 attnlab `MultiHeadAttention`
# （查询 = 键 = 值 = $\mathbf X$，4 个头），宽度都是 $d = 64$。（图表和打印中的 CNN、RNN、
# self-attention 分别指这三种层。）
#
# ### 计算复杂度：数出浮点运算次数
#
# `torch.utils.flop_counter.FlopCounterMode` 统计一次调用中矩阵乘法和卷积的浮点运算次数
# （一次乘加算 2 次浮点运算；偏置、门控和 softmax 不计入，它们是 $O(nd)$ 或 $O(n^2)$ 的）。
# 手算，每个序列：
#
# - 卷积：$n$ 个输出各有 $d$ 个通道，每个读取 $k$ 个输入的 $d$ 个通道：$2knd^2$；
# - GRU：三个门，每个门对输入和隐状态各有一个 $d\times d$ 矩阵，共 $n$ 个时间步：$12nd^2$；
# - 自注意力：对 $n$ 个词元做四个 $d\times d$ 投影（$8nd^2$），再加上评分
#   $\mathbf Q\mathbf K^\top$ 和值的加权和（各 $2n^2d$）：$8nd^2 + 4n^2d$。
#
# 在每个 $n$ 上，计数都必须与手算完全一致：

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
# **$n^2d$ 在哪里超过 $nd^2$。** 自注意力减去 GRU 是
# $8nd^2 + 4n^2d - 12nd^2 = 4nd\,(n - d)$：$n < d$ 时自注意力的浮点运算比 GRU 少，$n = d$ 时
# 恰好相等，此后更多，是 GRU 的 $(2d + n)/3d$ 倍，这个倍数像 $n/d$ 一样增长。在自注意力内部，
# 评分和加权和的 $4n^2d$ 在 $n = 2d$ 处超过投影的 $8nd^2$。如果没有书中 $O(n^2d)$ 略去的投影，
# 单靠 $4n^2d$ 要到 $n = 3d$ 才超过 GRU 的 $12nd^2$：交叉点落在 $n = d$，是投影造成的。卷积的
# $2knd^2 = 6nd^2$ 对每个词元是常数。

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
# ### 内存：为反向传播保存的激活
#
# 训练时，每个操作都会为反向传播保存一些张量。`torch.autograd.graph.saved_tensors_hooks`
# 让我们看到它们；我们把其中不是参数的、互不相同的张量的字节数加起来。与时间不同，这个数是
# 确定的。注意力权重对每个头、每个序列是一个 $n\times n$ 矩阵：我们预期自注意力层的字节数
# 恰好是 $an + bn^2$，其中 $b$ = 4 字节（float32）× 头数 × 批量大小，而卷积和 GRU 只保存
# $O(nd)$ 字节。（结果 $an$ 是五个 $n\times d$ 的 float32 张量：输入，查询、键和值，以及
# $\mathbf W_o$ 保存的各头拼接后的输出。）GRU 每个词元保存的字节比自注意力的 $a$ 多，所以内存
# 的交叉点与浮点运算次数的不同；度量之后我们再推导它在哪里。


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
# **内存的交叉点在哪里。** 用本页的记号，批量大小为 $B$、宽度为 $d$、头数为 $h$，float32 每个
# 元素 4 字节。上面的单元格度量（并断言）了：自注意力保存 $an + bn^2$ 字节，其中
# $a = 5 \cdot 4dB = 20dB$，$b = 4hB$；GRU 保存 $gn$ 字节，其中 $g = 8 \cdot 4dB = 32dB$
# （即 `gru_per_token`）。自注意力保存得更多，当且仅当
#
# $$an + bn^2 > gn \iff n > \frac{g - a}{b} = \frac{32dB - 20dB}{4hB} = \frac{3d}{h},$$
#
# 批量大小被约去；本页的 $d$ 和 $h$ 对应的值已由上面的单元格打印。头越多，交叉点越靠前：每个头
# 各保存一个 $n\times n$ 的权重矩阵，所以 $b$ 随 $h$ 增大；而 $a$ 不变（无论 $h$ 是多少，那五个
# 张量都是 $n\times d$ 的：各头只是分摊查询、键和值的 $d$ 列），GRU 的 $g$ 也与头数无关。下面的
# 单元格对 1、2、4、8 个头重新度量 $a$ 和 $b$。
#
# 这里统计的是 PyTorch 在 CPU 上的这些层的实现为反向传播保存的张量，所以 $n = 3d/h$ 是这一实现
# 的交叉点，而不是定律：换一种实现，保存的张量不同，交叉点也就不同，例如融合的 GRU 内核，或在
# 反向传播时重新计算注意力权重而不保存它们的注意力内核（FlashAttention 就是这样做的）。

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
# ### 顺序操作：自动微分图的深度
#
# 彼此依赖结果的操作必须一个接一个地执行，核再多也没用。自动微分图记录了每个操作及其依赖，
# 所以从输出回到输入的最长 `grad_fn` 节点链数的就是**顺序操作**：GRU 每个词元都要更新一次
# 隐状态，另外两种层无论 $n$ 多大都只做固定数量的（并行的）张量操作。


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
# ### 实际运行时间
#
# 浮点运算次数和顺序操作都会体现在时间上。我们用 `torch.utils.benchmark` 在一个 CPU 线程上
# 给三种层计时（批量大小 8，不求梯度）。毫秒数取决于机器，**仅作示意**（不对它做任何断言）。
# 可以留意：在 CPU 上，GRU 的 $n$ 个小的顺序步骤通常比其浮点运算次数所预示的更耗时；
# 当 $n$ 达到 $d$ 的几倍之后，自注意力的时间增长快于线性。所以自注意力开始比 GRU 慢的长度
# 未必就是浮点运算次数的交叉点 $n = d$；下面的单元格打印出在运行本页的机器上它在哪里。

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
# ### 最大路径长度
#
# 第一个词元和最后一个词元之间隔着多少层或多少步？我们用梯度检验路径是否存在：卷积和自注意力
# 双向都看，用 $\partial\mathbf y_0/\partial\mathbf x_{n-1}$；GRU 从左往右读，用
# $\partial\mathbf y_{n-1}/\partial\mathbf x_0$（它的 $\mathbf y_0$ 从不依赖
# $\mathbf x_{n-1}$）。
#
# **卷积。** 卷积核为 $k$、填充为 $k//2$ 的一层向两侧各看 $k//2$ 个词元，所以堆叠 $L$ 层能看到
# $L\cdot(k//2)$ 个：从词元 $0$ 到达词元 $n-1$ 需要 $L = \lceil (n-1)/(k//2) \rceil$ 层，即
# $O(n/k)$。为了让“路径存在”等价于“梯度非零”，这些层是线性的，权重都为正：于是梯度是所有
# 路径上正数乘积之和，恰好在有路径时为正。


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
# **自注意力。** 一层就把每个输出词元与每个输入词元连了起来：雅可比矩阵的块
# $\partial\mathbf y_i/\partial\mathbf x_j$ 对**所有**位置对都非零，无论 $n$ 多大。

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
# **GRU。** 它也在一层内把词元 $0$ 和词元 $n-1$ 连起来，但只能经过隐状态：$\mathbf x_0$
# 进入 $\mathbf h_1$，而 $\mathbf y_{n-1} = \mathbf h_n$ 要经过 $\mathbf h_2, \ldots, \mathbf h_{n-1}$
# 才能到达。我们让 `nn.GRU` 一次处理一个词元（输出与对整个序列调用一次相同），再依次用
# `.detach()` 在每个隐状态处切断路径：如果 $\partial\mathbf y_{n-1}/\partial\mathbf x_0$ 变成零，
# 这个隐状态就位于**每一条**路径上。全部 $n-1$ 个隐状态都是如此：路径长 $n$ 个循环步，即 $O(n)$。


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
# **并排比较。** 把三种层都度量过的长度上的结果放在一起，自注意力也用同样的堆叠方法检验：


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
# 在最后这张表中，经过自注意力的路径在每个 $n$ 上都是一层；经过卷积的路径是
# $\lceil (n-1)/(k//2) \rceil$ 层，卷积核越宽越短；经过 GRU 的路径是 $n$ 步，最长（都已断言）。
#
# 这张表经度量得到印证：$n > d$ 之后，自注意力每个词元的计算量最大，但全部可以并行，而且
# 任意两个词元之间直接相连。这就是 Transformer（10.7 节）以它为基础的原因。代价是其浮点运算
# 和内存中的 $n^2$。
#
# ## 3. 位置编码
#
# 自注意力不理会顺序：把输入词元重新排列，输出也按同样的方式重新排列。10.6.3 节在输入中加入
# 位置信息，$\mathbf X + \mathbf P$，其中
#
# $$p_{i,2j} = \sin\!\left(\frac{i}{10000^{2j/d}}\right),\qquad
# p_{i,2j+1} = \cos\!\left(\frac{i}{10000^{2j/d}}\right).$$
#
# attnlab 的 `PositionalEncoding`（见
# [API 参考](../../reference/api/models/#attnlab.models.positional_encoding.PositionalEncoding)）
# 把 $\mathbf P$ 存在缓冲区 `P` 中，形状为 (1, max_len, d)。先用上一节的 `MultiHeadAttention`
# 验证它不理会顺序：

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
# 书中的图画出第 6 到 9 列随位置的变化：第 6、7 列（频率为 $\omega_3 = 10000^{-6/32}$ 的
# 正弦和余弦）比第 8、9 列（频率 $\omega_4 = 10000^{-8/32} = 0.1$）振荡得更快，而且每个余弦都比
# 对应的正弦超前四分之一周期。热图显示全部 32 列：频率从左到右下降，就像二进制数的各位从低位到
# 高位变化得越来越慢（10.6.3.1 节）。

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
# ### 相对位置：一个旋转
#
# 10.6.3.2 节：对任意偏移 $\delta$，位置 $i + \delta$ 处的每一对（正弦，余弦）都是位置 $i$ 处
# 那一对旋转角度 $\omega_j\delta$ 的结果：
#
# $$\begin{bmatrix} \cos\omega_j\delta & \sin\omega_j\delta \\ -\sin\omega_j\delta &
# \cos\omega_j\delta \end{bmatrix}
# \begin{bmatrix} p_{i,2j} \\ p_{i,2j+1} \end{bmatrix} =
# \begin{bmatrix} p_{i+\delta,2j} \\ p_{i+\delta,2j+1} \end{bmatrix},$$
#
# 所以 $\mathbf p_{i+\delta} = \mathbf M_\delta\,\mathbf p_i$，其中 $\mathbf M_\delta$ 是由这些
# $2\times 2$ 旋转组成的分块对角矩阵：对所有 $i$ 都是同一个线性变换，只依赖于 $\delta$。
# 我们用模块自己的频率构造 $\mathbf M_\delta$，在其缓冲区的全部 1000 个位置上、对几个
# $\delta$ 做检查。
#
# **容差。** `P` 是 float32：角度 $i\omega_j$ 在取正弦之前按相对误差 $2^{-24}$ 舍入，每个元素
# 的误差至多 $i\omega_j 2^{-24} \le 999 \cdot 2^{-24} \approx 6\times10^{-5}$，再加上正弦本身
# 几个单位的 $2^{-24}$：记 $\varepsilon = (999 + 4)\cdot 2^{-24}$。旋转不会放大一对元素的误差
# （至多 $\sqrt2\,\varepsilon$），所以 $\mathbf M_\delta\mathbf p_i - \mathbf p_{i+\delta}$ 的每个
# 元素至多为 $(1+\sqrt2)\,\varepsilon \approx 1.4\times10^{-4}$，这就是我们断言的容差。


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
# 由于每个 $\mathbf M_\delta$ 都是旋转，两个位置编码的内积只依赖于它们的偏移：
# $\mathbf p_i^\top\mathbf p_{i+\delta} = \sum_j \cos(\omega_j\delta)$。所以矩阵
# $\mathbf P\mathbf P^\top$，也就是仅由位置编码得到的自注意力评分，沿每条对角线都是常数：

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
