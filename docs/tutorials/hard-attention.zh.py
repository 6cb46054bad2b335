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
# # 软注意力与硬注意力：为什么硬注意力需要强化学习
#
# [English](../../tutorials/hard-attention/) · *中文*
#
# 《动手学深度学习》英文版第 **11.1 节 “Queries, Keys, and Values”** 对比了使用注意力权重的两种方式：
# **软**注意力返回所有值的加权平均，每个键都有贡献，处处可微；如果恰好一个权重为 1、其余都为 0，
# 这次查找就像数据库查询一样**选出**一个键、只返回它的值：这就是**硬**注意力。中文版第 **10.1 节
# “注意力提示”** 讲的正是同一个想法，即由提示来选择关注什么；中文版没有专门讲硬注意力的小节。
# Xu 等人 2015 年的论文 “Show, Attend and Tell” 第 4 节两种都训练了：确定性的软注意力（4.2 节）
# 用反向传播训练，随机的硬注意力（4.1 节）用 REINFORCE（得分函数）估计器训练，因为一次选择
# 本身没有梯度。后来 Jang 等人 2017 和 Maddison 等人 2017 给出了第二条路：（直通）Gumbel-softmax。
# 本页用 attnlab 自己的代码（`attnlab.models.masked_softmax`、`masked_hardmax` 和
# `attnlab.models.hard_attention`）把这些逐一走一遍；下文的每个结论都在本页上计算出来，并用
# `assert` 检查；网站构建时会运行本页，测试（`tests/test_tutorials.py`）也会运行它，所以一旦
# 某个结论不再成立，CI 就会失败。
#
# 你将：
#
# 1. 在一个查询上比较软权重和 arg-max 独热权重，以及它们各自的输出；
# 2. 看清为什么独热选择不给评分传回任何梯度；
# 3. 用 REINFORCE 估计这个缺失的梯度，并用基线减小它的方差；
# 4. 改用直通 Gumbel-softmax，并度量它用什么换来了什么；
# 5. 用四种方式（软、arg-max、REINFORCE、Gumbel）训练一个“哪个键存着答案”的玩具模型，看哪些能学会；
# 6. 在 attnlab 的 Bahdanau 翻译模型里找到同样的开关。
#
# 10.1 节的基本概念另见[注意力提示教程](../../tutorials/cues.zh/)。
#
# **运行时间。** 本页会给自己计时：最后一个单元格打印这里所展示的这次运行（完整模式）用了
# 多久。快速模式（`ATTNLAB_TUTORIAL_FAST=1`，CI 运行的就是它）抽样更少、在更少的随机种子上
# 训练更少的步数，断言相同。不需要 GPU、数据集或训练好的模型。自己运行：
# `python docs/tutorials/hard-attention.zh.py`，或借助 [jupytext](https://jupytext.readthedocs.io/)
# 在 Jupyter 中打开。

# %%
import math
import os
import time

import matplotlib.pyplot as plt
import torch
from scipy import stats
from torch import nn

from attnlab.analysis.provenance import git_commit
from attnlab.models import masked_hardmax, masked_softmax
from attnlab.models.hard_attention import (
    MovingAverageBaseline,
    gumbel_noise,
    sample_location,
    score_function_loss,
    straight_through_gumbel,
)

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # fewer samples and seeds, same assertions
torch.manual_seed(0)
torch.set_num_threads(1)  # the tensors here are tiny: one thread is the fastest
print("mode:", "fast" if FAST else "full")

# %% [markdown]
# ## 1. 软权重与独热选择
#
# 一个查询，五个键。评分 $a(\mathbf q, \mathbf k_i)$ 是给定的；每个键的值是平面上的一个点。
# 软注意力用 $\boldsymbol\alpha = \operatorname{softmax}(\mathbf a)$ 对值加权；硬注意力在推理时
# 把权重 1 放在评分最高的键上（`masked_hardmax`），其余为 0。

# %%
values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 1.0], [0.5, -1.0]])  # (K, 2)
scores = torch.tensor([[[0.3, 1.0, 1.2, -0.5, 0.1]]])  # (batch 1, query 1, K = 5 keys)
soft = masked_softmax(scores, None)  # (1, 1, 5)
hard = masked_hardmax(scores, None)
soft_out, hard_out = soft @ values, hard @ values  # (1, 1, 2) each
print("soft weights:", soft[0, 0].numpy().round(3), "-> output", soft_out[0, 0].numpy().round(3))
print("hard weights:", hard[0, 0].numpy(), "-> output", hard_out[0, 0].numpy())

# %%
assert torch.all(soft > 0) and torch.allclose(soft.sum(-1), torch.ones(1, 1))  # every key counts
assert torch.allclose(soft, torch.softmax(scores, -1))
best = scores[0, 0].argmax().item()
assert best == 2 and hard[0, 0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]  # exactly one-hot on the arg-max
assert torch.equal(hard_out[0, 0], values[best])  # hard: the chosen value itself
assert torch.allclose(soft_out[0, 0], (soft[0, 0, :, None] * values).sum(0))  # soft: the weighted mean
assert all(not torch.allclose(soft_out[0, 0], v, atol=0.05) for v in values)  # a blend, no key's value
# padding is never chosen: with only the first 2 keys valid, the best valid key is key 1
assert masked_hardmax(scores, torch.tensor([2]))[0, 0].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
keys = torch.arange(5)
ax1.bar(keys - 0.2, soft[0, 0], width=0.4, label="soft: softmax")
ax1.bar(keys + 0.2, hard[0, 0], width=0.4, label="hard: arg-max one-hot")
ax1.set(xlabel="key", ylabel="attention weight", xticks=keys.tolist())
ax1.legend(loc="upper left")
ax2.scatter(values[:, 0], values[:, 1], c="gray", label="values")
for i, (x, y) in enumerate(values.tolist()):
    ax2.annotate(f"v{i}", (x, y), textcoords="offset points", xytext=(5, 5))
ax2.scatter(*soft_out[0, 0], marker="s", s=80, label="soft output")
ax2.scatter(*hard_out[0, 0], marker="*", s=200, label="hard output")
ax2.set(xlabel="value dim 0", ylabel="value dim 1", xlim=(-1.5, 2.6), ylim=(-1.5, 2.6))
ax2.legend(loc="lower right")
plt.show()

# %% [markdown]
# ## 2. 为什么独热选择没有梯度
#
# 训练就是微调评分（以及产生评分的参数），让输出变好。软权重随评分平滑变化：
# $\partial\alpha_i/\partial a_j = \alpha_i(\delta_{ij} - \alpha_j)$，即雅可比矩阵
# $\operatorname{diag}(\boldsymbol\alpha) - \boldsymbol\alpha\boldsymbol\alpha^\top$，它的每个元素
# 都不为零。独热权重来自 arg-max，而 arg-max 是一个整数：`masked_hardmax` 在自动微分的计算图之外
# 构造它们，所以它们没有 `grad_fn`，反向传播能到达被选中的*值*，却永远到不了*评分*。

# %%
s = scores.clone().requires_grad_()
v = values.clone().requires_grad_()
hard = masked_hardmax(s, None)
print("hard weights: requires_grad =", hard.requires_grad, ", grad_fn =", hard.grad_fn)
(hard @ v).sum().backward()
print("scores.grad:", s.grad, "\nvalues.grad:\n", v.grad)

# %%
assert hard.grad_fn is None and not hard.requires_grad
assert s.grad is None  # the scores get no gradient at all
assert torch.equal(v.grad[best], torch.ones(2)) and torch.all(v.grad[torch.arange(5) != best] == 0)

a = scores[0, 0].double()
alpha = torch.softmax(a, -1)
J_soft = torch.autograd.functional.jacobian(lambda x: masked_softmax(x.view(1, 1, -1), None).flatten(), a)
J_hard = torch.autograd.functional.jacobian(lambda x: masked_hardmax(x.view(1, 1, -1), None).flatten(), a)
assert torch.allclose(J_soft, torch.diag(alpha) - torch.outer(alpha, alpha), atol=1e-12)
assert torch.all(J_soft != 0)  # every score moves every soft weight
assert torch.all(J_hard == 0)  # no score moves a hard weight (as autograd sees it)
print("softmax Jacobian = diag(α) − ααᵀ, all entries non-zero; hardmax Jacobian: all zero")

# %% [markdown]
# 并不是自动微分藏起了一个本来存在的梯度：arg-max 对评分是**分段常数**的。把键 0 的评分
# $a_0$ 从 $-1$ 移到 $2$，其他评分不变（键 2 以 $a_2 = 1.2$ 领先）。硬输出一直是 $\mathbf v_2$，
# 直到 $a_0$ 到达 $1.2$，然后跳到 $\mathbf v_0$（恰好相等时下标最小的键胜出）。因此，对
# $f = $ 输出两个坐标之和做有限差分 $(f(a_0 + h) - f(a_0 - h))/2h$，除了在平局点 $h$ 以内之外
# 处处恰好为 0，而在平局点附近它是跳变除以 $2h$：没有可以跟随的方向。软输出的有限差分与自动
# 微分一致，并且从不为 0。

# %%
H_FD = 1e-4
grid = torch.linspace(-1.0, 2.0, 301, dtype=torch.float64)
tie = scores[0, 0, 2].double().item()
vals64 = values.double()


def output_sum(a0: torch.Tensor, weights_fn) -> torch.Tensor:
    """f(a_0): the sum of the attention output's coordinates as a function of key 0's score, (n,)."""
    sc = scores.double().expand(len(a0), 1, 5).clone()
    sc[:, 0, 0] = a0
    return (weights_fn(sc, None) @ vals64).sum((-1, -2))


fd = {}
for name, fn in (("hard", masked_hardmax), ("soft", masked_softmax)):
    fd[name] = (output_sum(grid + H_FD, fn) - output_sum(grid - H_FD, fn)) / (2 * H_FD)
near_tie = (grid - tie).abs() <= H_FD
print("grid points within h of the tie:", int(near_tie.sum()))
assert torch.all(fd["hard"][~near_tie] == 0)  # piecewise constant: derivative exactly 0
# the jump at the tie: from v2 (sum 4) to v0 (sum 1)
eps = 1e-9
left, at, right = output_sum(torch.tensor([tie - eps, tie, tie + eps], dtype=torch.float64), masked_hardmax)
assert left.item() == vals64[2].sum().item() == 4.0 and at.item() == right.item() == vals64[0].sum().item()
# soft: the finite difference is autograd's derivative, and it is never 0 on the grid
a0 = grid.clone().requires_grad_()
(d_soft,) = torch.autograd.grad(output_sum(a0, masked_softmax).sum(), a0)
assert torch.allclose(fd["soft"], d_soft, atol=1e-6) and torch.all(d_soft.abs() > 1e-3)

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
ax1.plot(grid, output_sum(grid, masked_softmax), label="soft")
ax1.plot(grid, output_sum(grid, masked_hardmax), label="hard (arg-max)")
ax1.set(xlabel="score $a_0$ of key 0", ylabel="$f$ = sum of the output")
ax2.plot(grid, d_soft, label="soft")
ax2.plot(grid[~near_tie], fd["hard"][~near_tie], ".", markersize=3, label="hard (finite difference)")
ax2.axvline(tie, color="gray", linestyle=":", label="tie: a jump")
ax2.set(xlabel="score $a_0$ of key 0", ylabel="$df/da_0$")
for ax in (ax1, ax2):
    ax.legend()
plt.show()

# %% [markdown]
# ## 3. REINFORCE：得分函数估计器
#
# Xu 等人让选择变成*随机的*：位置 $s$ 从注意力分布 $p_\theta(s) = \operatorname{softmax}(\mathbf
# a)_s$ 中抽取，训练最大化*期望*奖励 $\mathbb E_{s\sim p_\theta}[f(s)]$（在论文中 $f$ 是图像描述
# 的对数似然）。即使每次抽样不可微，这个期望对 $\theta$ 却是光滑的，而且它的梯度只用抽样就能估计：
#
# $$\nabla_\theta\, \mathbb E_{s\sim p_\theta}[f(s)] = \sum_s f(s)\,\nabla_\theta p_\theta(s)
# = \sum_s p_\theta(s)\, f(s)\, \nabla_\theta \log p_\theta(s)
# = \mathbb E_{s\sim p_\theta}\!\left[f(s)\,\nabla_\theta \log p_\theta(s)\right].$$
#
# 对 logits $\mathbf a$ 而言，$\nabla_{\mathbf a}\log p(s) = \mathbf e_s - \mathbf p$（独热向量减去
# 概率）。attnlab 的 `sample_location` 抽取 $s$ 并保留 $\log p(s)$；`score_function_loss` 是一个
# *替代目标*（surrogate），即对抽样取平均的 $-\lambda_r (f(s) - b)\log p(s) - \lambda_e H$，它的
# 梯度就是这个估计（这里 $\lambda_r = 1$、$\lambda_e = 0$，基线 $b$ 见下文）。
#
# 一个很小的类别分布：四个位置，logits 为 $\mathbf a$，奖励 $f$ 和对数似然一样都远小于 0。
# 精确梯度是 $\nabla_{\mathbf a}\,\mathbb E[f] = \mathbf p \odot (f - \mathbf p^\top f)$。

# %%
logits = torch.tensor([0.3, -0.2, 0.8, 0.0], dtype=torch.float64)
reward_of = torch.tensor([-20.0, -18.0, -23.0, -19.5], dtype=torch.float64)  # f(s), s = 0..3
p = torch.softmax(logits, 0)
exact = p * (reward_of - (p * reward_of).sum())
print("p =", p.numpy().round(4), " E[f] =", round((p * reward_of).sum().item(), 4))
print("exact gradient of E[f]:", exact.numpy().round(4))


def reinforce_estimate(n: int, b: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The surrogate's gradient over n draws with baseline b, and the n per-draw estimates (n, 4)."""
    z = logits.clone().requires_grad_()
    sample = sample_location(z.expand(n, 1, 4), None, torch.Generator().manual_seed(seed))
    reward = sample.weights[:, 0] @ reward_of  # (n,) f of each drawn location
    baseline = MovingAverageBaseline()
    baseline.value.fill_(b)
    surrogate, _ = score_function_loss(
        reward, sample, torch.ones(n, 1, dtype=torch.bool), baseline, 1.0, 0.0, n
    )
    (-surrogate).backward()  # minus: the surrogate is minimized, the reward maximized
    per_draw = (reward - b)[:, None] * (sample.weights[:, 0] - p)  # f(s) − b times ∇ log p(s)
    return z.grad, per_draw


def exact_variance(b: float) -> float:
    """tr Cov of one draw's estimate: Σ_s p_s (f_s − b)² ‖e_s − p‖² − ‖∇E[f]‖²."""
    sq = ((torch.eye(4, dtype=torch.float64) - p) ** 2).sum(1)
    return ((p * (reward_of - b) ** 2 * sq).sum() - (exact**2).sum()).item()


# %% [markdown]
# 首先，替代目标的梯度恰好是 $f(s)\,(\mathbf e_s - \mathbf p)$ 在各次抽样上的平均；它收敛到
# 精确梯度：误差按 $1/\sqrt N$ 缩小，标准差 $\sqrt{\operatorname{tr}\Sigma / N}$ 由分布精确算出
# （无基线，$b = 0$）。我们断言每个误差都在这个标准差的 4 倍以内，并且在最大的 $N$ 上，每个坐标
# 都在由抽样本身算出的 4 个标准误差以内。

# %%
NS = [10, 100, 1_000, 10_000] + ([20_000] if FAST else [100_000, 400_000])
errors = []
for n in NS:
    grad, per_draw = reinforce_estimate(n, 0.0, seed=n)
    assert torch.allclose(grad, per_draw.mean(0), atol=1e-10)  # the surrogate is the estimator
    errors.append((grad - exact).norm().item())
    sd = math.sqrt(exact_variance(0.0) / n)
    print(f"N = {n:>7}: |estimate − exact| = {errors[-1]:.4f}  (expected about {sd:.4f})")
    assert errors[-1] < 4 * sd
assert errors[-1] < errors[0] / 10  # 2000 times the draws: about 45 times smaller
se = per_draw.std(0) / math.sqrt(NS[-1])
assert torch.all((grad - exact).abs() < 4 * se), (grad - exact) / se
print("largest N: estimate", grad.numpy().round(4), "within 4 SE of the exact", exact.numpy().round(4))

# %% [markdown]
# ### 基线：仍然无偏，方差小得多
#
# 因为 $\sum_s p_\theta(s) = 1$，只要 $b$ 不依赖于抽样，就有 $\mathbb E[b\,\nabla_\theta\log
# p_\theta(s)] = b\,\nabla_\theta \sum_s p_\theta(s) = 0$：从奖励中减去 $b$ 后估计仍然无偏。但它会
# 改变方差：奖励在 $-20$ 左右时，不用基线的每次抽样估计约为 $-20\,(\mathbf e_s - \mathbf p)$，
# 这是一个很大的向量，方向大多是噪声。$b$ 接近 $\mathbb E[f]$ 时，剩下的只有各位置之间的*差别*。
# 方差 $\operatorname{tr}\Sigma(b)$ 是 $b$ 的抛物线；我们精确计算它，并在 $b = 0$ 和
# $b = \mathbb E[f]$ 处测量它。

# %%
N_VAR = 20_000 if FAST else 200_000
mean_reward = (p * reward_of).sum().item()
measured = {}
for b in (0.0, mean_reward):
    grad, per_draw = reinforce_estimate(N_VAR, b, seed=7)
    se = per_draw.std(0) / math.sqrt(N_VAR)
    assert torch.all((grad - exact).abs() < 4 * se), (b, (grad - exact) / se)  # unbiased, whatever b
    sq_dev = ((per_draw - per_draw.mean(0)) ** 2).sum(1)  # (N,) per-draw squared deviation
    measured[b] = sq_dev.mean().item()
    var_se = (sq_dev.std() / math.sqrt(N_VAR)).item()
    print(f"b = {b:8.3f}: tr Σ measured {measured[b]:8.4f} ± {var_se:.4f}, exact {exact_variance(b):8.4f}")
    assert abs(measured[b] - exact_variance(b)) < 5 * var_se
ratio = measured[mean_reward] / measured[0.0]
print(f"variance with b = E[f] is {ratio:.1%} of the variance without a baseline")
assert measured[mean_reward] < measured[0.0] and ratio < 0.05

# %%
bs = torch.linspace(-30, 5, 141, dtype=torch.float64)
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(bs, [exact_variance(b) for b in bs.tolist()], label=r"exact tr $\Sigma(b)$")
ax.plot(list(measured), list(measured.values()), "o", label="measured")
ax.axvline(mean_reward, color="gray", linestyle=":", label=r"$b = \mathbb{E}[f]$")
ax.set(xlabel="baseline $b$", ylabel="variance of one draw's estimate", yscale="log")
ax.legend()
plt.show()

# %% [markdown]
# 训练时并不知道 $\mathbb E[f]$。Xu 等人保留见过的奖励的滑动平均
# $b \leftarrow 0.9\,b + 0.1\,\bar r$；attnlab 的 `MovingAverageBaseline` 从第一个批量的平均奖励
# 开始，`score_function_loss` 在每个批量之后更新它。在每批 64 次抽样下，它稳定在 $\mathbb E[f]$
# 附近，偏差不超过它自身标准差的几倍；对独立同分布的批量均值做滑动平均，这个标准差是
# $\sqrt{(1-m)/(1+m)}\;\sigma_f/\sqrt{64}$，其中 $m = 0.9$：

# %%
baseline = MovingAverageBaseline(momentum=0.9)
gen = torch.Generator().manual_seed(3)
history = []
for _ in range(80):
    z = logits.clone().requires_grad_()
    sample = sample_location(z.expand(64, 1, 4), None, gen)
    keep = torch.ones(64, 1, dtype=torch.bool)
    score_function_loss(sample.weights[:, 0] @ reward_of, sample, keep, baseline, 1.0, 0.0, 64)
    history.append(baseline.value.item())
sigma_f = math.sqrt((p * (reward_of - mean_reward) ** 2).sum().item())
sd_b = math.sqrt(0.1 / 1.9) * sigma_f / 8
print(f"baseline after 80 batches: {history[-1]:.3f}; E[f] = {mean_reward:.3f}; its sd {sd_b:.3f}")
assert abs(history[-1] - mean_reward) < 4 * sd_b

# %% [markdown]
# ### 熵奖励
#
# Xu 等人更新式的第三项 $\lambda_e\,\partial H/\partial\theta$ 奖励分散的分布
# $H = -\sum_s p_s \log p_s$，让抽样继续探索其他位置，而不是过早坍缩到一个位置上。它对 logits 的
# 梯度是 $\partial H/\partial a_k = -p_k(\log p_k + H)$；替代目标（$\lambda_r = 0$ 时）传回的恰好是
# 它的 $-\lambda_e$ 倍，对替代目标做一步梯度下降会提高熵：

# %%
LAMBDA_E = 0.1
z = logits.clone().requires_grad_()
sample = sample_location(z.view(1, 1, 4), None, torch.Generator().manual_seed(0))
reward = torch.tensor([-20.0], dtype=torch.float64)  # any reward: λ_r = 0 switches REINFORCE off
keep = torch.ones(1, 1, dtype=torch.bool)
surrogate, _ = score_function_loss(reward, sample, keep, MovingAverageBaseline(), 0.0, LAMBDA_E, 1)
surrogate.backward()
entropy = -(p * p.log()).sum()
dH = -p * (p.log() + entropy)
assert torch.allclose(z.grad, -LAMBDA_E * dH, atol=1e-12)
stepped = torch.softmax(logits - 1.0 * z.grad, 0)
entropy_after = -(stepped * stepped.log()).sum()
print(f"entropy {entropy.item():.4f} -> {entropy_after.item():.4f} nats after one step")
print(f"(the largest possible, uniform: log 4 = {math.log(4):.4f})")
assert entropy < entropy_after <= math.log(4)

# %% [markdown]
# ## 4. 直通 Gumbel-softmax
#
# 绕过缺失梯度的第二条路（Jang 等人 2017，2.2 节；Maddison 等人 2017）。**Gumbel-max 技巧**
# 通过加上独立的 Gumbel(0, 1) 噪声 $g_i$ 再取 arg-max 来从 $\operatorname{softmax}(\mathbf a)$ 中
# 抽样：$s = \arg\max_i (a_i + g_i)$。**直通**（straight-through）估计器在前向传播中使用这个独热
# 样本，在反向传播中使用松弛后的 $\mathbf y = \operatorname{softmax}((\mathbf a + \mathbf g)/\tau)$
# （用*同一份*噪声）的梯度。attnlab 的 `straight_through_gumbel` 就是这样做的（并且掩蔽填充的键）。
# 我们在三个温度 $\tau$ 下检查这三点：前向恰好是独热的，而且就是 $\mathbf a + \mathbf g$ 的
# arg-max（所以与 $\tau$ 无关）；反向就是自动微分对松弛 softmax 求出的梯度；样本服从 $\mathbf p$
# （在固定随机种子上做卡方检验）。

# %%
N_ST = 5_000 if FAST else 50_000
TAUS = (0.5, 1.0, 2.0)
gain = torch.tensor([1.0, 3.0, -2.0, 0.5], dtype=torch.float64)  # f(s) = gain_s: the output w · gain
exact_st = p * (gain - (p * gain).sum())  # the exact gradient of E[w · gain]
st_grads, st_samples = {}, {}
for tau in TAUS:
    z = logits.expand(N_ST, 1, 4).clone().requires_grad_()
    w = straight_through_gumbel(z, None, tau, torch.Generator().manual_seed(11))
    (w[:, 0] @ gain).sum().backward()
    g = gumbel_noise(z, torch.Generator().manual_seed(11))  # the same noise, drawn again
    assert torch.all((w == 0) | (w == 1)) and torch.all(w.sum(-1) == 1)  # exactly one-hot
    assert torch.equal(w.detach(), masked_hardmax(z.detach() + g, None))  # arg-max of a + g
    z_ref = z.detach().clone().requires_grad_()
    (masked_softmax((z_ref + g) / tau, None)[:, 0] @ gain).sum().backward()
    assert torch.allclose(z.grad, z_ref.grad, atol=1e-12)  # backward = relaxed softmax's gradient
    st_grads[tau], st_samples[tau] = z.grad[:, 0], w.detach()[:, 0]
# the forward pass does not depend on tau: the same noise gives the same samples at every tau
assert all(torch.equal(st_samples[tau], st_samples[1.0]) for tau in TAUS)
counts = st_samples[1.0].sum(0)
chi2 = stats.chisquare(counts.numpy(), (N_ST * p).numpy())
print(
    f"frequencies of {N_ST} samples {(counts / N_ST).numpy().round(3)} vs p {p.numpy().round(3)}: "
    f"chi-square p-value {chi2.pvalue:.3f}"
)
assert chi2.pvalue > 0.001

# %% [markdown]
# 它用什么换来了什么？REINFORCE 是无偏的（第 3 节）；直通梯度不是：它的均值是松弛 softmax 的
# 期望梯度，而不是 $\mathbb E[f]$ 的梯度。作为交换，它对输出本身（经由松弛后的权重）求导，而不是
# 用一次抽样的奖励去加权 $\nabla\log p$，所以不需要基线。在同一个类别分布上，取
# $f(s) = $ `gain[s]`，我们在每个 $\tau$ 下测量偏差（以标准误差计）和方差：温度越高，梯度越平滑、
# 方差越小，但离真值越远。

# %%
bias, var = {}, {}
for tau in TAUS:
    g_tau = st_grads[tau]
    bias[tau] = (g_tau.mean(0) - exact_st).norm().item()
    var[tau] = g_tau.var(0).sum().item()
    z_scores = (g_tau.mean(0) - exact_st) / (g_tau.std(0) / math.sqrt(N_ST))
    print(
        f"tau = {tau}: |bias| = {bias[tau]:.4f} (largest {z_scores.abs().max().item():5.1f} SE), "
        f"variance {var[tau]:.4f}"
    )
    if tau >= 1.0:
        assert z_scores.abs().max() > 10  # a bias far beyond the noise
assert bias[0.5] < bias[1.0] < bias[2.0]  # lower temperature, less bias ...
assert var[0.5] > var[1.0] > var[2.0]  # ... and more variance

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
labels = [str(tau) for tau in TAUS]
ax1.bar(labels, [bias[tau] for tau in TAUS])
ax2.bar(labels, [var[tau] for tau in TAUS])
ax1.set(xlabel=r"temperature $\tau$", ylabel="|mean gradient − exact gradient|")
ax2.set(xlabel=r"temperature $\tau$", ylabel="variance (trace) of one gradient")
plt.show()

# %% [markdown]
# ## 5. 玩具任务：哪个键存着答案？
#
# 现在用这四种方式训练一个模型。每个样本有 $K = 8$ 个键 $\mathbf k_i$ 和值 $\mathbf v_i$
# （$\mathbb R^8$ 中的随机向量），以及一个描述其中某个键的查询
# $\mathbf q = A\mathbf k_{i^*} + \text{噪声}$，其中 $A$ 是模型不知道的一个固定随机旋转。答案是
# 那个键的值 $\mathbf y = \mathbf v_{i^*}$。模型用可学习的 $W$（评分层）打分
# $a_i = \mathbf q^\top W\mathbf k_i$，做注意力，再把注意力得到的值送入可学习的输出层 $U$；损失是
# 平方误差 $\|U(\text{注意力输出}) - \mathbf y\|^2$。**准确率**是留出样本中评分最高的键恰为
# $i^*$ 的比例（随机猜测：$1/8$）。四种方式只在注意力权重上不同：
#
# - **软**：`masked_softmax(scores)`，用反向传播训练；
# - **arg-max**：`masked_hardmax(scores)`：$U$ 照样学习，但 $W$ 得不到梯度；
# - **REINFORCE**：由 `sample_location` 抽取一个位置；损失加上 `score_function_loss`，奖励为
#   $-\text{误差}$，使用滑动平均基线和 $\lambda_e = 0.01$（attnlab 的 `hard_reinforce` 默认值）；
# - **Gumbel**：`straight_through_gumbel(scores, tau=1)`。
#
# 在每个随机种子上，四者都从相同的初始权重出发，用 Adam 训练；快速模式的种子和步数更少，并在
# 每个种子上做同样的断言。

# %%
K, D, BATCH, LR = 8, 8, 64, 0.02
SEEDS = range(3) if FAST else range(5)
STEPS = 200 if FAST else 300
EVAL_EVERY = 10
METHODS = ("soft", "arg-max", "REINFORCE", "Gumbel")


def draw_batch(A: torch.Tensor, gen: torch.Generator, n: int):
    """n examples: queries (n, 1, D), keys (n, K, D), values (n, K, D), answer index (n,)."""
    keys = torch.randn(n, K, D, generator=gen)
    values = torch.randn(n, K, D, generator=gen)
    target = torch.randint(K, (n,), generator=gen)
    queries = keys[torch.arange(n), target] @ A.T + 0.3 * torch.randn(n, D, generator=gen)
    return queries[:, None], keys, values, target


class Toy(nn.Module):
    """Scores q^T W k_i (the scoring layer W), then the output layer U on the attended value."""

    def __init__(self):
        super().__init__()
        self.W = nn.Linear(D, D, bias=False)
        self.U = nn.Linear(D, D)

    def scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return queries @ self.W(keys).transpose(1, 2)  # (n, 1, K)


def train(method: str, seed: int) -> dict:
    task = torch.Generator().manual_seed(1000 + seed)
    A = torch.linalg.qr(torch.randn(D, D, generator=task))[0]  # the hidden rotation
    held_out = draw_batch(A, task, 1000)
    torch.manual_seed(seed)  # the same initial model for the four methods
    model = Toy()
    W0, U0 = model.W.weight.detach().clone(), model.U.weight.detach().clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    baseline, noise = MovingAverageBaseline(), torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(2000 + seed)  # the same batches for the four methods

    def accuracy() -> float:
        with torch.no_grad():
            q, k, _, target = held_out
            return (model.scores(q, k)[:, 0].argmax(-1) == target).float().mean().item()

    accs, losses = [accuracy()], []
    for step in range(STEPS):
        q, k, v, target = draw_batch(A, data, BATCH)
        scores = model.scores(q, k)  # (BATCH, 1, K)
        if method == "soft":
            weights = masked_softmax(scores, None)
        elif method == "arg-max":
            weights = masked_hardmax(scores, None)
        elif method == "Gumbel":
            weights = straight_through_gumbel(scores, None, 1.0, noise)
        else:
            sample = sample_location(scores, None, noise)
            weights = sample.weights
        error = ((model.U((weights @ v)[:, 0]) - v[torch.arange(BATCH), target]) ** 2).sum(-1)  # (BATCH,)
        loss = error.mean()
        if method == "REINFORCE":
            keep = torch.ones(BATCH, 1, dtype=torch.bool)
            surrogate, _ = score_function_loss(-error.detach(), sample, keep, baseline, 1.0, 0.01, BATCH)
            loss = loss + surrogate
        optimizer.zero_grad()
        loss.backward()
        if method == "arg-max":
            assert model.W.weight.grad is None  # nothing reaches the scoring layer
        optimizer.step()
        losses.append(loss.item() if method != "REINFORCE" else error.mean().item())
        if (step + 1) % EVAL_EVERY == 0:
            accs.append(accuracy())
    return {
        "W0": W0,
        "acc": accs,
        "loss": losses,
        "W_unchanged": torch.equal(W0, model.W.weight),
        "U_unchanged": torch.equal(U0, model.U.weight),
    }


runs = {m: [train(m, seed) for seed in SEEDS] for m in METHODS}
print(f"{'seed':>4} " + " ".join(f"{m:>10}" for m in METHODS) + "   (held-out accuracy: start -> end)")
for i, seed in enumerate(SEEDS):
    cells = [f"{runs[m][i]['acc'][0]:.2f}->{runs[m][i]['acc'][-1]:.2f}" for m in METHODS]
    print(f"{seed:>4} " + " ".join(f"{c:>10}" for c in cells))

# %%
CHANCE = 1 / K
for i, seed in enumerate(SEEDS):
    start = runs["soft"][i]["acc"][0]
    assert all(torch.equal(runs[m][i]["W0"], runs["soft"][i]["W0"]) for m in METHODS)  # same start
    assert abs(start - CHANCE) < 0.15, (seed, start)  # an untrained scorer is near chance
    for m in ("soft", "REINFORCE", "Gumbel"):
        assert runs[m][i]["acc"][-1] > 0.6, (seed, m, runs[m][i]["acc"][-1])  # far above chance (0.125)
        assert not runs[m][i]["W_unchanged"]
    argmax = runs["arg-max"][i]
    assert argmax["W_unchanged"], seed  # the scoring layer's weights are bitwise the initial ones
    assert not argmax["U_unchanged"]  # while the output layer did train
    assert all(a == start for a in argmax["acc"]), (seed, argmax["acc"])  # stuck at its initial accuracy
    first, last = sum(argmax["loss"][:20]) / 20, sum(argmax["loss"][-20:]) / 20
    assert last < first, (seed, first, last)  # the output layer alone lowers the error a little
    mean_acc = {m: sum(runs[m][i]["acc"]) / len(runs[m][i]["acc"]) for m in METHODS}  # area under the curve
    assert mean_acc["REINFORCE"] < min(mean_acc["soft"], mean_acc["Gumbel"]), (seed, mean_acc)
print(
    f"on all {len(SEEDS)} seeds: soft, REINFORCE and Gumbel end above 0.6 (chance {CHANCE:.3f}); "
    "arg-max's scoring layer never changes and its accuracy stays where it started"
)

# %%
steps_axis = [0] + list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
for m in METHODS:
    acc = torch.tensor([r["acc"] for r in runs[m]]).mean(0)
    loss = torch.tensor([r["loss"] for r in runs[m]]).mean(0)
    smooth = torch.nn.functional.avg_pool1d(loss[None, None], 10, stride=1)[0, 0]  # moving mean over 10 steps
    ax1.plot(steps_axis, acc, label=m)
    ax2.plot(range(10, STEPS + 1), smooth, label=m)
ax1.axhline(CHANCE, color="gray", linestyle=":", label="chance")
ax1.set(xlabel="training step", ylabel="held-out accuracy", ylim=(0, 1))
ax2.set(xlabel="training step", ylabel="training squared error (10-step mean)")
ax1.legend()
ax2.legend()
fig.suptitle(f"mean over {len(SEEDS)} seeds")
plt.show()

# %% [markdown]
# arg-max 模型的输出层学到了它能学的（平方误差略有下降），但它的评分层纹丝不动：它一直关注
# 随机初始 $W$ 偏爱的那个键。其余三种学会了隐藏的旋转。在这个玩具任务上，REINFORCE 比两种基于
# 梯度的方式爬升得晚（在每个种子上都有断言：它在整个训练过程中的平均准确率是三者中最低的），
# 正如更嘈杂的梯度所预期的；晚多少取决于学习率和奖励的尺度。
#
# ## 6. 翻译模型中的同样开关
#
# attnlab 的 Bahdanau 模型（中文版 10.4 节，英文版 11.4 节）在解码器对编码器状态的注意力上有同样的
# 选择：`model.net.attention=soft`（默认，即 D2L 的模型）、`hard_reinforce`（训练时取一个抽样得到
# 的编码器状态，用 `score_function_loss` 训练，以句子的对数似然为奖励，并使用 Xu 等人的滑动平均
# 基线和熵奖励）或 `hard_gumbel`（直通 Gumbel-softmax）；两种硬注意力在推理时都关注 arg-max
# 位置。`model.net.scoring=additive|dot` 选择评分函数（加性注意力或缩放点积注意力）。训练它们：
#
# ```bash
# python src/train.py model=bahdanau model.net.attention=hard_reinforce
# python src/train.py model=bahdanau model.net.attention=hard_gumbel
# ```
#
# [消融实验指南](../../how-to/ablations/)运行与软注意力的对比，训练好的模型的得分见
# [结果](../../results/)页面。相关设置（`reinforce_weight`、`entropy_weight`、`gumbel_tau`）
# 见 [API 参考](../../reference/api/models/#attnlab.models.bahdanau.Bahdanau)。

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
