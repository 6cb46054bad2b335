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
# # 注意力评分函数：为什么除以√d
#
# [English](../../tutorials/scoring/) · *中文*
#
# 本页对应《动手学深度学习》第 **10.3 节“注意力评分函数”**（英文版 11.3 节 “Attention Scoring
# Functions”），用 attnlab 自己的代码回答一个问题：**缩放点积注意力为什么要把评分除以
# $\sqrt{d}$？** 下文的每个结论都在本页上计算出来，并用 `assert` 检查；网站构建时会运行本页，
# 测试（`tests/test_tutorials.py`）也会运行它，所以一旦某个结论不再成立，CI 就会失败。
#
# 你将：
#
# 1. 用 `masked_softmax` 对填充过的小批量做掩蔽softmax操作；
# 2. 并排计时加性注意力和缩放点积注意力；
# 3. 度量为什么要除以 $\sqrt{d}$：$\mathbf q^\top\mathbf k$ 的方差、它对 softmax 的影响、
#    以及它对 softmax 梯度的影响。
#
# **运行时间。** 本页会给自己计时：最后一个单元格打印这里所展示的这次运行（完整模式）用了
# 多久。快速模式（`ATTNLAB_TUTORIAL_FAST=1`，CI 运行的就是它）样本更少，断言相同。不需要
# GPU、数据集或训练好的模型。自己运行：`python docs/tutorials/scoring.zh.py`，
# 或借助 [jupytext](https://jupytext.readthedocs.io/) 在 Jupyter 中打开。

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
# ## 1. 对填充过的小批量做掩蔽softmax操作
#
# 长短不一的序列组成小批量时要填充到同一长度。填充位置也是键，普通的 softmax 会给它们分配
# 注意力权重。`masked_softmax(X, valid_lens)`（10.3.1 节“掩蔽softmax操作”）让超出有效长度的键的权重**恰好为
# 0**，只在其余的键上归一化。下面是两个样本，各有四个键，有效长度分别为 2 和 3：

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
# `valid_lens` 也可以为每个查询各给一个长度，形状为（批量大小，查询个数），解码器的因果掩蔽
# 就是这样：

# %%
per_query = masked_softmax(scores, torch.tensor([[1, 3], [2, 4]]))
print(per_query)
assert torch.all(per_query[0, 0, 1:] == 0) and torch.all(per_query[0, 1, 3:] == 0)
assert torch.allclose(per_query.sum(-1), torch.ones(2, 2))

# %% [markdown]
# ## 2. 加性注意力与缩放点积注意力并排比较
#
# 两者都把一个查询和一个键变成一个评分 $a(\mathbf q, \mathbf k)$，即注意力评分函数：
#
# - **加性注意力**（10.3.2 节）用只有一个隐藏层的多层感知机学习评分，
#   $\mathbf w_v^\top \tanh(\mathbf W_q\mathbf q + \mathbf W_k\mathbf k)$；查询和键的长度可以不同；
# - **缩放点积注意力**（10.3.3 节）没有参数，评分为 $\mathbf q^\top\mathbf k/\sqrt d$，
#   但查询和键的长度必须相同，都是 $d$。
#
# 加性评分要为每一对（查询，键）算一个隐藏向量，即形状为（批量，查询，键，隐藏单元）的张量；
# 点积只是一次批量矩阵乘法。我们在 $d$ 和序列长度 $n$（查询与键一样多）的一个小范围内，用
# `torch.utils.benchmark` 在单个 CPU 线程上对两者计时，加性注意力的隐藏单元数取 $d$：

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
# 要看的是比值，而不是毫秒数（后者取决于机器）。当 $h = d$ 时，两种评分都要 $O(n^2 d)$ 次
# 乘加（加性评分还要对查询和键做投影，再多 $O(nd^2)$），所以只看大 O 解释不了这个比值：
# 加性评分要构造一个 $n \times n \times h$ 的隐藏向量张量
# （内存读写、对每个元素求 $\tanh$，再做一次归约），而点积只是一次矩阵乘法，BLAS 能以全速
# 执行。这部分开销取决于 $d$、$n$ 和机器，比值也是如此：上表是本次构建测得的结果，不代表在
# 别处也会呈现同样的走势。这是 Transformer 采用点积的原因之一。（上面只断言了输出形状；在共享
# 的机器上，计时不是测试能守住的结论。）
#
# ## 3. 为什么除以 √d
#
# ### $\mathbf q^\top\mathbf k$ 的方差随 $d$ 线性增长
#
# 10.3.3 节假设查询 $\mathbf q$ 和键 $\mathbf k$ 的所有元素都是独立的随机变量，均值为 0、方差为 1。
# 于是 $\mathbf q^\top\mathbf k = \sum_{i=1}^d q_i k_i$ 是 $d$ 个独立项之和，每项均值为 0、方差为
# $\mathbb E[q_i^2]\,\mathbb E[k_i^2] = 1$，所以
#
# $$\operatorname{Var}(\mathbf q^\top\mathbf k) = d, \qquad
# \operatorname{Var}\!\left(\frac{\mathbf q^\top\mathbf k}{\sqrt d}\right) = 1 .$$
#
# 对每个 $d$ 我们用 $N$ 个样本来度量。度量值应当离理论值多近？$N$ 个样本的样本方差 $s^2$
# 的标准误差是 $\sqrt{(\mu_4 - \sigma^4)/N}$，其中 $\mu_4$ 是四阶中心矩。对元素服从正态分布的
# $x = \mathbf q^\top\mathbf k$，由 $\mathbb E[q_i^4] = \mathbb E[k_i^4] = 3$ 得
# $\mu_4 = 3d^2 + 6d$，因此 $\mathrm{SE}(s^2) = \sqrt{(2d^2 + 6d)/N}$（除以 $\sqrt d$ 之后为
# $\sqrt{(2 + 6/d)/N}$）。我们断言每个度量值与 $d$（不缩放）和 1（缩放）之差都在 **5 个标准误差**以内。

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
# ### 大的评分使 softmax 饱和
#
# 方差大为什么要紧？softmax 不是尺度无关的：评分乘以 $c$ 会让它变尖。不缩放时，评分的标准差
# 是 $\sqrt d$（$d = 256$ 时为 16）：最大的评分比第二大的高出许多，softmax 几乎把全部权重
# 放在一个键上，近似于*硬性*的 argmax。缩放后的评分在任何 $d$ 下标准差都是 1。
#
# 对每个 $d$，我们多次抽取一个查询和 $n = 64$ 个键，比较不缩放评分的 softmax 与 attnlab 的
# `DotProductAttention`（它做了缩放）给出的注意力权重。记录最大的权重和熵
# $-\sum_j \alpha_j \log \alpha_j$（权重均匀时最大，为 $\log 64 \approx 4.16$；独热时为 0）。

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
# 缩放后的 softmax 是“软”的，但并不均匀：在每个 $d$ 下，它的熵都比 $\log 64$ 低大约半个奈特
# （已在上面断言）。对方差为 $\sigma^2$ 的评分 $s_j$，当键很多时，归一化常数
# $Z = \sum_j e^{s_j} \approx n\,\mathbb E[e^s] = n e^{\sigma^2/2}$，熵
# $\log Z - \sum_j \alpha_j s_j$ 约为 $\log n + \sigma^2/2 - \mathbb E[s e^s]/\mathbb E[e^s]
# = \log n - \sigma^2/2$：当 $\sigma^2 = 1$ 时比 $\log n$ 低半个奈特。
#
# ### 饱和的 softmax 几乎传不回梯度
#
# 如果模型还能靠学习走出饱和，饱和本身无妨。但它做不到，因为 softmax 饱和之处梯度消失。
# 对 $\boldsymbol\alpha = \operatorname{softmax}(\mathbf s)$，
#
# $$\frac{\partial \alpha_i}{\partial s_j} = \alpha_i(\delta_{ij} - \alpha_j), \qquad
# J = \operatorname{diag}(\boldsymbol\alpha) - \boldsymbol\alpha\boldsymbol\alpha^\top ：$$
#
# 对角线上是 $\alpha_i(1-\alpha_i)$，其余是 $-\alpha_i\alpha_j$。先用 PyTorch 的自动微分检验这个公式：

# %%
s_small = torch.randn(5, dtype=torch.float64)
alpha = torch.softmax(s_small, -1)
J_formula = torch.diag(alpha) - torch.outer(alpha, alpha)
J_autograd = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s_small)
print(J_formula.numpy().round(4))
assert torch.allclose(J_formula, J_autograd, atol=1e-12)
print("diag(α) − ααᵀ matches torch.autograd.functional.jacobian")

# %% [markdown]
# 如果一个权重接近 1、其余接近 0，$J$ 的每个元素都接近 0：对所有 $i$ 有 $\alpha_i(1 -
# \alpha_i) \approx 0$，每个乘积 $\alpha_i\alpha_j$ 也是。我们来度量：对每个 $d$，求损失
# $L = \sum_j \alpha_j v_j$（$v_j$ 随机）传回评分的梯度 $\partial L/\partial \mathbf s = J\mathbf v$
# 的范数，分别在不缩放和缩放时，用与上面同样的多次抽样。我们报告各次抽样的**中位数**（典型的
# 一次）以及梯度范数小于 0.01 的抽样所占比例：均值会被少数“最好的两个键评分恰好几乎相同”的
# 抽样所左右。

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
# $d$ 较小时，不缩放的评分只比缩放的稍宽一些，梯度甚至还略大：评分分得既不太散也不太聚时，
# softmax 学得最好。从 $d = 16$ 起，不缩放的梯度随 $d$ 每增大一级就缩小一截；缩放后的梯度保持不变。

# %% [markdown]
# ### 评分处的梯度与查询处的梯度
#
# 上面度量的是 softmax 自身的梯度，取在它的输入处：$\partial L/\partial\mathbf s$。
# Vaswani 等人（2017）说点积过大会“把 softmax 函数推入梯度极小的区域”，指的正是它。查询和键
# 从链式法则由此再往回传的梯度中学习：设 $\mathbf s = c\,\mathbf K\mathbf q$（不缩放时
# $c = 1$，缩放时 $c = 1/\sqrt d$），则 $\partial L/\partial\mathbf q = c\,\mathbf K^\top
# \partial L/\partial\mathbf s$。键的范数约为 $\sqrt d$，而不缩放时没有什么再除以
# $\sqrt d$。我们在同样的多次抽样上、用同一个损失，度量 $\partial L/\partial\mathbf q$
# 范数的中位数：

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
# 不缩放时，传到 $\mathbf q$ 的梯度没有除以 $\sqrt d$，所以一开始比缩放时大，而且领先的
# 幅度起初随 $d$ 增大。随后饱和的 softmax 把这份领先吃掉了：在最大的 $d$ 处，剩下的不到其峰值的
# 一半（已在上面断言；具体多少见表）。所以 $\sqrt d$ 保护的并不是查询和键的梯度大小，而是
# softmax 自身的梯度 $\partial L/\partial\mathbf s$：正是这个信号告诉模型哪些键该多分一些
# 注意力、哪些该少分一些；饱和的 softmax 几乎传不回它，前面乘上再大的因子也补不回来。

# %% [markdown]
# ### 在训练好的 Transformer 中
#
# 在真实的模型中也一样。attnlab 的流水线又训练了一次 Transformer，只改了一个开关
# `model.net.scaled=false`（每个头的评分 $\mathbf q^\top\mathbf k$ 都不除以 $\sqrt{d}$，这里
# $d = 64$），训练配方的其余部分不变；见 [Ablations](../../how-to/ablations/)。已提交的结果文件
# `results/ablation_history.csv` 记录了每次运行、每一轮之后，注意力权重各行在前 64 个验证集
# 句子对上的平均熵（`attnlab.analysis.heads`）。训练一轮之后：

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
# 没有 $1/\sqrt{d}$，训练出的各个头几乎是独热的：三种注意力中，各行的熵都只是缩放模型的一小部分
# （不到四分之一，已断言；上表打印了两者）；模型也学得更慢（旁边打印了第一轮之后的验证集
# BLEU）。完整的曲线以及训练四轮之后的测试集 BLEU 见[结果](../../results/#after-the-first-epoch)。

# %% [markdown]
# ### 更宽的头
#
# 上面的论证说，$d$ 越大，危害越大。流水线又用更宽的头把这一对模型各训练了一次，
# `model.net.d_model=512 model.net.ffn_hidden=1024`：4 个头，每个头 $d = 128$ 而不是 64
# （前馈层也宽一倍），缩放与不缩放，训练配方的其余部分不变。每一对在同一台机器上运行
# （`results/runs.csv`）。下面是训练四轮之后的测试集 BLEU、每一轮之后的验证集 BLEU，以及第一轮
# 之后注意力的熵：

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
# 两种宽度下，训练一轮之后都是不缩放的头更尖锐：它们的平均熵不到缩放模型的一半，自注意力中
# 不到四分之一（均已断言）。更宽的模型即使缩放，注意力也更尖锐，但它仍然学会了翻译；去掉 √d 时，
# 头宽为 128 损失的 BLEU 是头宽为 64 时的两倍多（已断言），从验证集 BLEU 看，四轮训练中它几乎
# 什么也没学会。缩放的宽模型也比默认模型略差，所以这一损失不能只用宽度解释；至于缩放的宽模型
# 的注意力为什么变尖锐得这么快，这几次运行没有回答。

# %% [markdown]
# ## 这意味着什么
#
# 不缩放时，评分的离散程度随 $\sqrt d$ 增长：头越宽（attnlab 每个头的 $d$ = `d_model / num_heads`），
# softmax 从第一步起就越接近独热，softmax 自身的梯度，即评分处告诉模型“该关注哪个键”的梯度
# $\partial L/\partial\mathbf s$，也越小：这就是 Vaswani 等人所说的“梯度极小的区域”。从
# $d = 16$ 起，$d$ 每增大一级它都在缩小，到 $d = 256$ 时已不到缩放后梯度的五分之一（两者都已在
# 上面断言）。传到查询的梯度则是另一回事：不缩放时没有什么把它除以 $\sqrt d$，所以它一开始
# 更大，直到饱和吃掉它的领先（同样已断言）。
# 除以 $\sqrt d$ 让评分的方差无论 $d$ 多大都保持为 1，于是在任何宽度下
# softmax 一开始都是“软”的、可训练的。这就是 `DotProductAttention.forward` 中的那一行
# `scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)`
# （`src/attnlab/models/attention.py`；见
# [API 参考](../../reference/api/models/#attnlab.models.attention.DotProductAttention)），
# `MultiHeadAttention` 的每个头、进而整个 `Transformer` 的注意力汇聚都用它。上面的论证假设查询和键
# 的方差为 1；学到的投影不会严格保持这一点，但缩放消除了对 $d$ 的依赖，这才是关键。加性注意力
# 不需要这个因子，因为 $\tanh$ 限定了每个隐藏单元的范围，但它要付出 $n \times n \times h$ 张量的
# 代价，正如第 2 部分所测。

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
