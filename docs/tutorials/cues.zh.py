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
# # 注意力提示：查询、键和值
#
# [English](../../tutorials/cues/) · *中文*
#
# 本页对应《动手学深度学习》第 **10.1 节“注意力提示”**（英文版 11.1 节 “Queries, Keys, and
# Values”），使用 attnlab 自己的代码。它建立整个注意力机制一章的词汇，再用数字检验：
# 什么是查询、键和值，注意力权重为什么非负且和为 1，注意力为什么是一种“软”的数据库查询，
# 以及 attnlab 注意力模块的哪个参数对应哪个概念。下文的每个结论都在本页上计算出来，并用
# `assert` 检查；网站构建时会运行本页，测试（`tests/test_tutorials.py`）也会运行它，
# 所以一旦某个结论不再成立，CI 就会失败。
#
# 你将：
#
# 1. 把两种注意力提示对应到查询和键；
# 2. 画出《动手学深度学习》的注意力权重热图，并用 `DotProductAttention` 得到同一个矩阵；
# 3. 做一次软的数据库查询，看它的输出怎样移向某一个值；
# 4. 用 `queries, keys, values, valid_lens` 调用 `DotProductAttention`、`AdditiveAttention`
#    和 `MultiHeadAttention`，检查每一个形状。
#
# **运行时间。** 本页会给自己计时：最后一个单元格打印这里所展示的这次运行（完整模式）用了
# 多久。本页没有大的计算：快速模式（`ATTNLAB_TUTORIAL_FAST=1`，CI 运行的就是它）只是在一条
# 曲线上少画一些点，断言相同。不需要 GPU、数据集或训练好的模型。自己运行：
# `python docs/tutorials/cues.zh.py`，或借助 [jupytext](https://jupytext.readthedocs.io/)
# 在 Jupyter 中打开。

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
# ## 1. 两种注意力提示
#
# 注意力是稀缺的资源。眼睛接收到的信息远多于大脑能处理的，于是有一种“注意力经济”决定处理
# 什么：我们关注一样东西，代价就是不去关注别的东西。《动手学深度学习》用心理学家威廉·
# 詹姆斯的“双组件”（two-component）框架来解释注意力如何分配：
#
# - **非自主性提示**来自事物本身：它有多突出、多显眼。桌上摆着黑白的报纸，一个红色的咖啡杯
#   不由自主地吸引了我们的目光；
# - **自主性提示**来自我们自己：喝完咖啡，我们*想*读书，于是目光落在书上，尽管书并不比
#   报纸更显眼。
#
# 注意力机制给每种提示一个名字：
#
# | 心理学中 | 注意力机制中 | attnlab 的参数 |
# |---|---|---|
# | 自主性提示（我们要找什么） | **查询** $\mathbf q$ | `queries` |
# | 每件事物的非自主性提示（它如何呈现自己） | **键** $\mathbf k_i$ | `keys` |
# | 感官输入本身，与它的键成对 | **值** $\mathbf v_i$ | `values` |
#
# 全连接层或汇聚层只有非自主性提示：无论我们要找什么，它都以同样的方式处理每个输入。注意力
# 机制的不同之处在于查询：它把查询与每个键比较，再根据比较结果决定取每个值的多少。这种选择
# 就是*注意力汇聚*：
#
# $$\operatorname{Attention}(\mathbf q, \mathcal D) = \sum_{i=1}^m \alpha(\mathbf q, \mathbf k_i)\,
# \mathbf v_i, \qquad \mathcal D = \{(\mathbf k_1, \mathbf v_1), \ldots, (\mathbf k_m, \mathbf v_m)\}.$$
#
# ## 2. 注意力权重的热图
#
# 多个查询的权重 $\alpha(\mathbf q, \mathbf k_i)$ 组成一个矩阵，每个查询一行、每个键一列；
# 《动手学深度学习》用 `show_heatmaps` 把这样的矩阵画成热图。下面用书中的例子：单位矩阵，
# 十个查询，每个只关注下标相同的那个键。


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
# 这样的矩阵从哪里来？取十个键为 $\mathbb R^{10}$ 的独热向量 $\mathbf e_1, \ldots,
# \mathbf e_{10}$，十个查询为 $s\,\mathbf e_1, \ldots, s\,\mathbf e_{10}$。attnlab 的
# `DotProductAttention` 给查询 $i$ 与键 $j$ 的评分是 $\mathbf q_i^\top \mathbf k_j / \sqrt d
# = s\,\delta_{ij}/\sqrt{10}$，并对每一行做 softmax 归一化，所以手算可知每个查询在自己的键上
# 的权重是
#
# $$\alpha_{ii} = \frac{e^{s/\sqrt{10}}}{e^{s/\sqrt{10}} + 9},$$
#
# $s = 0$ 时为 $1/10$（所有键一样：就是平均汇聚），$s$ 增大时趋于 1。设 `hard=True` 时，
# 模块把恰好为 1 的权重放在评分最高的键上（*硬*注意力，与 softmax 给出的软的、可微的权重
# 相对）：正是书中的单位矩阵。

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
# ## 3. 注意力是软的数据库查询
#
# 英文版 11.1 节从一个数据库讲起：一组（键，值）对，比如（姓，名）。精确的查询“Li”返回键与
# 之匹配的那一个值“Mu”。注意力用权重代替精确匹配。对查询 $\mathbf q$ 和键 $\mathbf k_1,
# \ldots, \mathbf k_m$：
#
# $$\alpha(\mathbf q, \mathbf k_i) = \frac{\exp a(\mathbf q, \mathbf k_i)}{\sum_{j}
# \exp a(\mathbf q, \mathbf k_j)} \ge 0, \qquad \sum_i \alpha(\mathbf q, \mathbf k_i) = 1,$$
#
# 其中 $a$ 是评分函数（这里是缩放点积；[注意力评分函数](../../tutorials/scoring.zh/)一页把
# 它与加性注意力相比较）。因为权重非负且和为 1，输出 $\sum_i \alpha_i \mathbf v_i$ 是值的
# *凸组合*：它总在值的凸包之内。两种特殊情况：
#
# - 所有权重相等，都是 $1/m$：输出是值的平均（**平均汇聚**）；
# - 一个权重为 1，其余为 0：输出恰好是一个值（普通的**数据库查询**）。
#
# 介于两者之间：如果某个键与查询的匹配远好于其他键，它的权重 $\alpha_j$ 趋于 1，输出趋于它
# 的值 $\mathbf v_j$。能接近到什么程度有一个上界，因为 $\mathbf o - \mathbf v_j =
# \sum_{i \ne j} \alpha_i (\mathbf v_i - \mathbf v_j)$：
#
# $$\lVert \mathbf o - \mathbf v_j \rVert \le (1 - \alpha_j)
# \max_i \lVert \mathbf v_i - \mathbf v_j \rVert .$$
#
# 我们建一个书中的小数据库：每个姓对应一个随机的 32 维键，每个名对应一个二维的值（以便画出
# 来），并用 $\beta\,\mathbf k_{\text{Li}}$ 查询：$\beta = 0$ 表示没有任何偏好，$\beta$
# 越大，查询就越明确地要找“Li”。

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
# 设 `hard=True`，查询就成了普通的数据库查询：在任何 $\beta > 0$ 下，输出都逐位等于“Li”
# 的值本身。

# %%
hard_lookup = DotProductAttention(hard=True)
hard_out = hard_lookup(queries[1:].unsqueeze(0), db_keys, db_values)[0]
assert torch.equal(hard_out, db_values[0, li].expand_as(hard_out))
print("hard lookup returns", first_names[li], "at every β > 0")

# %% [markdown]
# 软权重正是注意力可以训练的原因：输出随查询和键平滑地变化，所以梯度能传到它们；硬查询不给
# 评分传任何梯度（见[API 参考](../../reference/api/models/#attnlab.models.attention.masked_hardmax)
# 中的 `masked_hardmax`）。
#
# ## 4. attnlab 代码里的同样词汇
#
# attnlab 的注意力模块按《动手学深度学习》的顺序、用书中的名字接收参数：
# `queries, keys, values, valid_lens`，所以书能直接对应到代码。`valid_lens` 说明每个序列中
# 有多少个键是真实的而不是填充（`None`：全部；每个序列一个长度，(B,)；或每个查询一个，
# (B, Q)）；超出它的键的权重恰好为 0。以下签名直接从代码中读出：

# %%
for cls in (DotProductAttention, AdditiveAttention, MultiHeadAttention):
    print(f"{cls.__name__}{inspect.signature(cls)}")
    forward = inspect.signature(cls.forward)
    print(f"    .forward{forward}")
    assert list(forward.parameters)[1:5] == ["queries", "keys", "values", "valid_lens"], forward

# %% [markdown]
# 它们的形状（B：批量大小，Q：查询个数，K：每个序列的键值对个数，H：头数）：
#
# | 参数 | `DotProductAttention` | `AdditiveAttention` | `MultiHeadAttention` |
# |---|---|---|---|
# | `queries` | (B, Q, d) | (B, Q, query_size) | (B, Q, d_model) |
# | `keys` | (B, K, d) | (B, K, key_size) | (B, K, d_model) |
# | `values` | (B, K, d_v) | (B, K, d_v) | (B, K, d_model) |
# | `valid_lens` | None、(B,) 或 (B, Q) | 同左 | 同左 |
# | 输出 | (B, Q, d_v) | (B, Q, d_v) | (B, Q, d_model) |
# | `attention_weights` | (B, Q, K) | (B, Q, K) | (B, H, Q, K) |
#
# 点积要求查询和键的长度相同；加性注意力学习投影 $\mathbf W_q$、$\mathbf W_k$，所以二者的
# 长度可以不同。每个模块都把最近一次的权重保存在 `attention_weights` 中。下面对每个模块真实
# 调用一次，用两个序列组成的小批量，各有 5 个键值对，其中有效的分别是 2 个和 5 个：

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
# ## 小结
#
# 查询是我们要找的东西，键是每件事物呈现自己的方式，值是事物本身。注意力把查询与每个键比较，
# 返回值的加权平均，权重非负且和为 1：这是一种软的数据库查询；没有偏好任何键时它就是平均
# 汇聚，绝对偏好一个键时它就是精确查询。本章的每个注意力模型都是这种查询，只是评分函数不同，
# 或者查询、键和值不同：Nadaraya-Watson 核回归（[下一页](../../tutorials/pooling.zh/)）、
# Bahdanau 解码器（它的解码器状态查询编码器的各个状态），以及 Transformer 的自注意力（查询、
# 键和值都来自同一个序列）。上面这些模块见
# [API 参考](../../reference/api/models/#attnlab.models.attention.DotProductAttention)。

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
