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
# # 超出本章：图像如何变成序列
#
# [English](../../tutorials/vit/) · *中文*
#
# 本页比注意力一章再往前走一步：英文版《Dive into Deep Learning》**11.8 节 "Transformers for
# Vision"**。中文版《动手学深度学习》没有这一节；不过视觉 Transformer（ViT）所用的部件中文版里都有：
# 自注意力和位置编码在 **10.6 节 自注意力和位置编码**（英文版 11.6），Transformer 编码器在 **10.7
# 节 Transformer**（英文版 11.7）。模型出自 Dosovitskiy 等人的论文 *An Image is Worth 16x16 Words:
# Transformers for Image Recognition at Scale*（ICLR 2021）。我们用 attnlab 自己的代
# 码：`VisionTransformer`、`PatchEmbedding` 和基线 `SmallCNN`（`src/attnlab/vision/vit.py`），数字数
# 据集的划分（`src/attnlab/vision/data.py`），以及 `conf/model/vit.yaml` 和 `conf/model/cnn.yaml` 的
# 默认规模。下文的每个结论都在本页计算，并用 `assert` 检查；网站构建时会运行本页，测试也会运行它
# （`tests/test_tutorials.py`），所以结论一旦不再成立，CI 就会失败。
#
# 你将：
#
# 1. 把一张 8×8 的数字图像切成**图块**（patch），并检查图块嵌入按行优先的顺序读取它们；
# 2. 跟着序列走过**类别词元**（class token）、可学习的位置和 attnlab 的 Transformer 编码器块，直到分
#    类器；手算参数量，并检查分类器只读位置 0；
# 3. 在数字数据集上**训练** ViT 和一个参数量相近的小型 CNN，并比较二者；
# 4. 画出**类别词元对各图块的注意力**；
# 5. 了解如何在 attnlab 的流水线中运行同样的模型。
#
# **运行时间。** 本页自己计时：最后一个单元格打印这里所示运行的耗时（完整模式：配置中的规模，各训练
# 50 轮）。快速模式（`ATTNLAB_TUTORIAL_FAST=1`，CI 运行的模式）只训练 10 轮，检查同样的断言。不需要
# GPU，也不需要下载：数字图像是 scikit-learn 自带的 8×8 图像。自己运
# 行：`python docs/tutorials/vit.py`，或用 [jupytext](https://jupytext.readthedocs.io/) 在 Jupyter
# 中打开。

# %%
import math
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.nn import functional as F

import attnlab
from attnlab.analysis.provenance import git_commit
from attnlab.models import TransformerEncoderBlock
from attnlab.vision.data import load_image_splits
from attnlab.vision.vit import PatchEmbedding, SmallCNN, VisionTransformer, build_image_net

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # fewer epochs, same assertions
torch.set_num_threads(1)  # small tensors: one thread is faster than two on a busy machine
torch.manual_seed(0)
print("mode:", "fast" if FAST else "full")

CONF = Path(attnlab.__file__).resolve().parents[2] / "conf"  # the repository's Hydra configs
assert (CONF / "model" / "vit.yaml").is_file(), f"no attnlab configs under {CONF}"

# %% [markdown]
# ## 1. 图块
#
# 数据是 scikit-learn 的手写数字（1,797 张 8×8 灰度图像，十个类别），由 attnlab 的读取函数用固定的随
# 机种子、按类别分层划分（`conf/data/digits.yaml`）：

# %%
data_cfg = OmegaConf.load(CONF / "data" / "digits.yaml")
digits = load_image_splits(data_cfg)
splits = digits.splits
for name, (x, y) in splits.items():
    print(f"{name:>5}: images {tuple(x.shape)} {x.dtype}, labels {tuple(y.shape)} {y.dtype}")
assert sum(len(y) for _, y in splits.values()) == 1797
assert all(x.shape[1:] == (1, 8, 8) and x.min() >= 0 and x.max() <= 1 for x, _ in splits.values())
train_x, train_y = splits["train"]
test_x, test_y = splits["test"]

# %% [markdown]
# Transformer 读取的是向量序列。D2L 11.8.1 (no zh section) 把图像变成序列的办法是：
# 把它切成 $p \times p$ 的图块，从左到右、从上到下排列，再把每个图块线性映射为长度为 `d_model` 的向量。
# attnlab 的 `PatchEmbedding`
# 用一个卷积核大小和步幅都为 $p$ 的卷积一次完成这两步。按配置的 $p = 2$，一张 8×8 的数字有
# $(8/2)^2 = 16$ 个图块：

# %%
net_cfg = {
    name: OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml").net)
    for name in ("vit", "cnn")
}
P = net_cfg["vit"]["patch_size"]
G = 8 // P  # patches per side
image, label = train_x[0, 0], int(train_y[0])  # (8, 8)
patches = [image[r * P : (r + 1) * P, c * P : (c + 1) * P] for r in range(G) for c in range(G)]
print(f"patch size {P}: a {G}×{G} grid, {len(patches)} patches of {P}×{P} pixels")

fig = plt.figure(figsize=(11, 3.2), layout="constrained")
left, right = fig.subfigures(1, 2, width_ratios=[1, 2.6])
ax = left.subplots()
ax.imshow(image, cmap="gray_r", vmin=0, vmax=1)
for k in range(1, G):
    ax.axhline(k * P - 0.5, color="tab:red", lw=1.5)
    ax.axvline(k * P - 0.5, color="tab:red", lw=1.5)
for k in range(G * G):
    r, c = divmod(k, G)
    ax.text(
        c * P + P / 2 - 0.5,
        r * P + P / 2 - 0.5,
        str(k),
        color="tab:blue",
        ha="center",
        va="center",
        bbox={"facecolor": "white", "alpha": 0.8, "pad": 1, "linewidth": 0},
    )
ax.set(title=f"a digit {label}, cut into {P}×{P} patches", xticks=[], yticks=[])
strip = right.subplots(2, (G * G + 2) // 2)
for i, a in enumerate(strip.flat):
    a.set(xticks=[], yticks=[])
    if i == 0:
        a.set_box_aspect(1)
        a.text(0.5, 0.5, "[class]", ha="center", va="center", transform=a.transAxes)
        a.set_title("0", fontsize=8)
    elif i <= G * G:
        a.imshow(patches[i - 1], cmap="gray_r", vmin=0, vmax=1)
        a.set_title(f"{i} (patch {i - 1})", fontsize=7)
    else:
        a.axis("off")
right.suptitle("the encoder's input: position 0 the class token, then the patches in order", fontsize=9)
plt.show()

# %% [markdown]
# 卷积读取图块的顺序真是图中画的顺序吗？和 `tests/test_vit.py` 一样，我们把卷积的权重设成把图块的像
# 素 $(i, j)$ 复制到特征 $p\,i + j$（单位卷积核，`d_model` $= p^2$，无偏置）：这样图块 $k$ 的嵌入*就
# 是*展平后的图块 $k$。我们在这张数字上、对每个能整除 8 的图块大小，与按行优先顺序手工切出的图块比
# 较。

# %%
for p in (1, 2, 4, 8):
    g = 8 // p
    embed = PatchEmbedding(image_size=8, patch_size=p, in_channels=1, d_model=p * p)
    with torch.no_grad():
        embed.conv.weight.copy_(torch.eye(p * p).reshape(p * p, 1, p, p))
        embed.conv.bias.zero_()
        out = embed(image[None, None])  # (1, g·g, p·p)
    by_hand = torch.stack(
        [image[r * p : (r + 1) * p, c * p : (c + 1) * p].flatten() for r in range(g) for c in range(g)]
    )
    assert out.shape == (1, g * g, p * p) and torch.equal(out[0], by_hand), p
print("patch k of the embedding is the k-th patch in row-major order, for p = 1, 2, 4, 8")

# %% [markdown]
# 编码器读取这些图块，前面再加一个位置，即**类别词元**，所以序列长度为 $(8/p)^2 + 1$：从 $p = 1$ 时
# 的 65 个位置（每个像素一个词元）到 $p = 8$ 时的 2 个（整张图像一个词元）。每个头的注意力权重是一
# 个“长度 × 长度”的矩阵，所以注意力的开销随长度的平方增长：这就是论文把 224×224 的图像切成 16×16 的
# 图块、得到 $(224/16)^2 + 1 = 197$ 个位置，而不是按像素切分的原因。

# %%
print(f"{'p':>2} {'patches':>8} {'sequence length':>16}")
for p in (1, 2, 4, 8):
    vit_p = VisionTransformer(image_size=8, in_channels=1, num_classes=10, patch_size=p).eval()
    with torch.no_grad():
        length = vit_p.encode(image[None, None], need_weights=True).shape[1]
    print(f"{p:>2} {vit_p.patch_embedding.num_patches:>8} {length:>16}")
    assert length == (8 // p) ** 2 + 1 == vit_p.pos_embedding.shape[1]
    assert vit_p.blks[0].attention.attention_weights.shape == (1, 4, length, length)  # (B, heads, S, S)

# %% [markdown]
# ## 2. 从图块到类别：模型
#
# D2L 11.8.3 (no zh section) 和论文（式 1–4）把这些部件组合起来：
#
# 1. 图块嵌入，$N = (8/p)^2$ 个长度为 $d$ = `d_model` 的向量；
# 2. 一个可学习的**类别词元**（`cls_token`，一个长度为 $d$ 的向量）放在最前面，即位置 0；
# 3. 可学习的**位置嵌入**（`pos_embedding`，每个位置一个向量，共 $N + 1$ 个）加到每个位置上：注意力
#    本身不知道图块原来在哪里（D2L 11.6 (zh 10.6)，中文版 10.6）；
# 4. `num_layers` 个 attnlab 的 `TransformerEncoderBlock`，与翻译用的 Transformer 是同一个类（D2L
#    11.7，中文版 10.7）；
# 5. 对类别词元的最终状态做分类的线性层 `head`。
#
# 下面是 `conf/model/vit.yaml` 为数字数据集给出的 ViT：

# %%
print("conf/model/vit.yaml net:", net_cfg["vit"])
vit = build_image_net(net_cfg["vit"], image_size=8, in_channels=1, num_classes=10).eval()
assert isinstance(vit, VisionTransformer)
assert all(isinstance(blk, TransformerEncoderBlock) for blk in vit.blks)
print(vit)

# %% [markdown]
# 用模块的各个部件一步步写出同样的前向传播（在评估模式下，暂退法关闭），结果与 `vit.encode` 完全相
# 同：

# %%
X = test_x[:5]  # (5, 1, 8, 8)
with torch.no_grad():
    seq = vit.patch_embedding(X)  # (5, N, d): the patches
    seq = torch.cat([vit.cls_token.expand(len(X), -1, -1), seq], dim=1)  # class token at position 0
    seq = seq + vit.pos_embedding  # learned positions, (1, N + 1, d), broadcast over the batch
    for blk in vit.blks:
        seq = blk(seq, None)  # no padding: valid_lens None
    logits = vit.head(seq[:, 0])  # the classifier reads position 0
    torch.testing.assert_close(seq, vit.encode(X), rtol=0, atol=0)
    torch.testing.assert_close(logits, vit(X), rtol=0, atol=0)
print("encode:", tuple(seq.shape), "logits:", tuple(logits.shape))

# %% [markdown]
# **手算参数量。** 设输入通道数为 $C$，$d$ = `d_model`，$h$ = `ffn_hidden`，$L$ = `num_layers`，$N$
# 个图块，$K$ 个类别：
#
# - 图块嵌入：一个 $p \times p$ 卷积，$p^2 C d + d$；
# - 类别词元 $d$；位置嵌入 $(N + 1)\,d$；
# - 每个编码器块：无偏置的 $W_q, W_k, W_v, W_o$，$4d^2$；两个层规范化，$2 \cdot 2d$；基于位置的前馈
#   网络，$dh + h + hd + d$；
# - 分类头，$dK + K$。

# %%
d, h, L = net_cfg["vit"]["d_model"], net_cfg["vit"]["ffn_hidden"], net_cfg["vit"]["num_layers"]
C, K, N = 1, 10, G * G
by_part = {
    "patch_embedding": P * P * C * d + d,
    "cls_token": d,
    "pos_embedding": (N + 1) * d,
    "blks": L * (4 * d * d + 2 * 2 * d + (d * h + h + h * d + d)),
    "head": d * K + K,
}
for name, count in by_part.items():
    param = getattr(vit, name)
    measured = (
        param.numel() if isinstance(param, torch.nn.Parameter) else sum(q.numel() for q in param.parameters())
    )
    print(f"{name:>16}: {measured:>6,} (by hand {count:,})")
    assert measured == count, name
vit_params = sum(q.numel() for q in vit.parameters())
print(f"{'total':>16}: {vit_params:>6,}")
assert vit_params == sum(by_part.values())

# %% [markdown]
# **分类器只读位置 0。** 每个位置都关注所有其他位置，所以类别词元的最终状态已经从各图块汇聚了它所需
# 的信息；其他位置的最终状态随后被丢弃。我们用最后一个块上的前向钩子（forward hook）检查这一点：把它
# 在位置 1 … N 的输出改成噪声，logits 纹丝不动。同样的噪声加在位置 0 上则会改变 logits；加在*第一
# 个*块之后的位置 1 … N 上也会改变，因为最后一个块的注意力还要读取它们。


# %%
def overwrite(positions: slice):
    """A forward hook that replaces a block's output at ``positions`` with noise."""

    def hook(module, inputs, output):
        output = output.clone()
        output[:, positions] = torch.randn_like(output[:, positions]) * 10
        return output

    return hook


def logits_with_noise(block: torch.nn.Module, positions: slice) -> torch.Tensor:
    handle = block.register_forward_hook(overwrite(positions))
    try:
        with torch.no_grad():
            return vit(X)
    finally:
        handle.remove()


with torch.no_grad():
    clean = vit(X)
last, first = vit.blks[-1], vit.blks[0]
assert torch.equal(logits_with_noise(last, slice(1, None)), clean)  # exactly the same
assert not torch.allclose(logits_with_noise(last, slice(0, 1)), clean, atol=1e-3)
assert not torch.allclose(logits_with_noise(first, slice(1, None)), clean, atol=1e-3)
print("noise at the last block's positions 1..N: logits unchanged; at position 0, or after block 1: changed")

# %% [markdown]
# ## 3. 训练 ViT 和一个同样大小的 CNN
#
# 基线是 attnlab 的 `SmallCNN`（`conf/model/cnn.yaml`）：三个带 ReLU 的 3×3 卷积和两个 2×2 最大汇聚
# 层，再接一个线性分类器，是一个不含注意力的类 LeNet 网络。它的通道数是为了让参数量与 ViT 相近而选
# 的：

# %%
print("conf/model/cnn.yaml net:", net_cfg["cnn"])
cnn = build_image_net(net_cfg["cnn"], image_size=8, in_channels=1, num_classes=10)
assert isinstance(cnn, SmallCNN)
c1, c2, c3 = net_cfg["cnn"]["channels"]
cnn_by_hand = (9 * C * c1 + c1) + (9 * c1 * c2 + c2) + (9 * c2 * c3 + c3) + (c3 * (8 // 4) ** 2 * K + K)
cnn_params = sum(q.numel() for q in cnn.parameters())
print(f"ViT {vit_params:,} parameters, CNN {cnn_params:,} (by hand {cnn_by_hand:,})")
assert cnn_params == cnn_by_hand
assert abs(cnn_params / vit_params - 1) < 0.2  # within 20%

# %% [markdown]
# 两者都在一个普通的训练循环中训练，所用的正是 `src/train.py` 为它们用的设置：配置中的
# AdamW（`conf/optimizer/adamw.yaml`），大小为 `model.batch_size` = 64、用固定种子打乱的小批量，交叉
# 熵损失；两者训练轮数相同，随机种子相同。每轮结束后我们在验证集上测量准确率；最后在测试集上测一次（
# 各 270 张图像）。

# %%
EPOCHS = 10 if FAST else 50
BATCH = OmegaConf.load(CONF / "model" / "vit.yaml").batch_size
make_optimizer = instantiate(OmegaConf.load(CONF / "optimizer" / "adamw.yaml"))  # a partial
print("optimizer:", make_optimizer.func.__name__, make_optimizer.keywords, f"batch {BATCH}, {EPOCHS} epochs")


@torch.no_grad()
def accuracy(net: torch.nn.Module, split: str) -> float:
    net.eval()
    x, y = splits[split]
    return (net(x).argmax(-1) == y).float().mean().item()


def train(name: str, seed: int = 0) -> tuple[torch.nn.Module, list[float], float]:
    """(net, validation accuracy after each epoch, seconds) for conf/model/<name>.yaml's net."""
    torch.manual_seed(seed)
    net = build_image_net(net_cfg[name], image_size=8, in_channels=1, num_classes=10)
    optimizer = make_optimizer(params=net.parameters())
    curve, t0 = [], time.perf_counter()
    for epoch in range(EPOCHS):
        net.train()
        for xb, yb in digits.loader("train", BATCH, shuffle=True, seed=1000 * seed + epoch):
            optimizer.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            optimizer.step()
        curve.append(accuracy(net, "val"))
    return net.eval(), curve, time.perf_counter() - t0


runs = {name: train(name) for name in ("vit", "cnn")}
for name, (_, curve, seconds) in runs.items():
    print(f"{name}: val accuracy by epoch {[round(a, 2) for a in curve]} ({seconds:.1f} s, illustrative)")

# %%
vit_net, vit_curve, _ = runs["vit"]
cnn_net, cnn_curve, _ = runs["cnn"]
test_acc = {"vit": accuracy(vit_net, "test"), "cnn": accuracy(cnn_net, "test")}
n_test = len(test_y)
print(f"test accuracy after {EPOCHS} epochs ({n_test} images):")
print(f"ViT {test_acc['vit']:.3f}, CNN {test_acc['cnn']:.3f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
epochs = range(1, EPOCHS + 1)
ax.plot(epochs, vit_curve, "o-", ms=3, label=f"ViT ({vit_params:,} parameters)")
ax.plot(epochs, cnn_curve, "s-", ms=3, label=f"CNN ({cnn_params:,} parameters)")
ax.axhline(0.1, color="gray", linestyle=":", label="chance (10%)")
ax.set(
    xlabel="epoch", ylabel="validation accuracy", ylim=(0, 1.02), title="digits, 8×8, 1,257 training images"
)
ax.legend()
plt.show()

# %% [markdown]
# 训练结果说明了什么？首先，两个网络都学到了东西：随机猜测的准确率是 10%，测试集有 270 张图像，准确
# 率在随机水平附近的标准误差为 $\sqrt{0.1 \cdot 0.9 / 270} \approx 1.8$ 个百分点；所以即使在快速模式
# 只训练 10 轮之后，我们也要求远高于随机水平：至少 50%。

# %%
se_chance = math.sqrt(0.1 * 0.9 / n_test)
for name, acc in test_acc.items():
    assert acc > 0.5, (name, acc)  # more than 20 standard errors above chance
print(
    f"both above 50%: {(min(test_acc.values()) - 0.1) / se_chance:.0f} standard errors above chance, or more"
)

# %% [markdown]
# 其次，CNN 学得快得多。我们数一数每个网络的验证准确率第一次达到 90% 需要多少轮，并计算所有轮次验证
# 准确率的平均值（每条曲线下的面积除以轮数）：


# %%
def epochs_to(curve: list[float], level: float) -> float:
    """The first epoch (1-based) whose accuracy reaches ``level``; inf if none."""
    return next((i + 1 for i, a in enumerate(curve) if a >= level), math.inf)


reach = {"vit": epochs_to(vit_curve, 0.9), "cnn": epochs_to(cnn_curve, 0.9)}
mean_val = {"vit": sum(vit_curve) / EPOCHS, "cnn": sum(cnn_curve) / EPOCHS}
print(f"epochs to 90% validation accuracy: ViT {reach['vit']}, CNN {reach['cnn']}")
print(f"mean validation accuracy over the epochs: ViT {mean_val['vit']:.3f}, CNN {mean_val['cnn']:.3f}")
assert reach["cnn"] < reach["vit"], reach
assert mean_val["cnn"] > mean_val["vit"] + 0.05, mean_val

# %% [markdown]
# 第三，训练结束时 CNN 领先或与 ViT 持平。两个测试准确率是在同样的 270 张图像上测得的；我们允许 ViT
# 最多领先两倍的差值标准误差（在平均准确率 $a$ 处为 $\sqrt{2\,a(1-a)/270}$），所以两者持平时检查成
# 立，只有 ViT 明显胜出时才会失败：

# %%
a = (test_acc["vit"] + test_acc["cnn"]) / 2
se_diff = math.sqrt(2 * a * (1 - a) / n_test)
gap = test_acc["cnn"] - test_acc["vit"]
print(f"CNN − ViT on test: {gap:+.3f} (two standard errors of the difference: {2 * se_diff:.3f})")
assert gap > -2 * se_diff, (test_acc, se_diff)

# %% [markdown]
# 这就是卷积的**归纳偏置**在起作用。3×3 卷积只看相邻的像素（局部性），并在各处使用同样的权重（平移等
# 变性）：网络一开始就“知道”图像是什么样的。ViT 对这两点一无所知：哪些图块彼此相邻，它必须通过可学习
# 的位置嵌入和注意力权重从数据中学出来，而只有 1,257 张训练图像时，这需要多得多的轮次。Dosovitskiy
# 等人在大规模上报告了同样的现象（论文第 1 节和 4.3 节）：只在 ImageNet（130 万张图像）上训练、且不
# 加强正则化时，ViT 比规模相当的 ResNet 低几个百分点；只有在 1,400 万到 3 亿张图像
# （ImageNet-21k、JFT-300M）上预训练后，它才超过 ResNet，即“大规模训练胜过归纳偏置”（"large scale
# training trumps inductive bias"）。这个关于数据规模的结论是论文的，本页并没有测量它：我们只在一个
# 小数据集上训练。还要注意，attnlab 的编码器块是 D2L 11.7 (zh 10.7)（中文版 10.7）的后规范化（post-norm）块，
# 前馈网络用 ReLU；而 D2L 11.8.2 (no zh section) 和论文用的是前规范化（pre-norm）块和 GELU 的 MLP。
#
# ## 4. 类别词元在看哪里
#
# 在每个块中，类别词元和其他位置一样是一个查询：在每个头中，它对类别词元自身和 $N$ 个图块的注意力权
# 重之和为 1。`VisionTransformer.class_token_attention` 按层返回对各图块的权重，排布与图像相同，形状
# 为（图像数, 头数, $G$, $G$）。我们取训练好的 ViT 最后一层，看几张测试图像：

# %%
shown = test_x[:4]
with torch.no_grad():
    predicted = vit_net(shown).argmax(-1)
    maps = vit_net.class_token_attention(shown)  # per layer: (4, heads, G, G)
weights_last = vit_net.blks[-1].attention.attention_weights  # (4, heads, N + 1, N + 1), kept by the call
heads = net_cfg["vit"]["num_heads"]
assert len(maps) == L and maps[-1].shape == (4, heads, G, G)
assert torch.all(maps[-1] >= 0)
total = maps[-1].sum((-2, -1)) + weights_last[:, :, 0, 0]  # the patches + the class token itself
torch.testing.assert_close(total, torch.ones(4, heads))
print("class token → patches + itself: every head's weights sum to 1;")
print("weight on the class token itself, per image and head:\n", weights_last[:, :, 0, 0].numpy().round(3))

# %%
fig, axes = plt.subplots(
    len(shown), heads + 1, figsize=(1.9 * (heads + 1), 1.9 * len(shown)), layout="constrained"
)
for i in range(len(shown)):
    axes[i, 0].imshow(shown[i, 0], cmap="gray_r", vmin=0, vmax=1)
    axes[i, 0].set_title(f"label {int(test_y[i])}, predicted {int(predicted[i])}", fontsize=8)
    for head in range(heads):
        ax = axes[i, head + 1]
        im = ax.imshow(maps[-1][i, head], cmap="Reds", vmin=0, vmax=float(maps[-1].max()))
        ax.set_title(f"head {head + 1}", fontsize=8)
    for ax in axes[i]:
        ax.set(xticks=[], yticks=[])
fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="class token's weight on the patch")
fig.suptitle(f"last layer: the class token's attention over the {G}×{G} patches", fontsize=9)
plt.show()

# %% [markdown]
# 每一行是一张测试图像，每张热图是最后一个块的一个头：每个格子是类别词元给该位置图块的权重。各个头挑
# 出了什么，请你自己在这里读图；本页不断言任何解读。流水线在训练后会画出同样的图
# （`src/attnlab/vision/lit.py` 中的 `class_token_figures`，每张验证图像一个 PNG，位于
# `plots/vit/attention/`），并在第一个面板标出墨迹所在的位置。
#
# ## 5. 在流水线中运行同样的模型
#
# 本页用一个普通的循环训练，以便几秒钟内跑完。attnlab 的流水线用同样的配置、通过 Lightning 训练同样
# 的网络，把运行记录到 MLflow，并评估和导出它们：
#
# ```bash
# python src/train.py model=vit data=digits
# python src/train.py model=cnn data=digits
# python src/evaluate.py model=vit     # test accuracy → metrics/vit.json
# ```
#
# `data=digits` 本来就是两个模型配置的默认值。另见讲解本模型所复用的编码器块的 [Transformer 页
# 面](../../tutorials/transformer.zh/)，以及它的 [API 参
# 考](../../reference/api/models/#attnlab.models.transformer.TransformerEncoderBlock)。

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")
