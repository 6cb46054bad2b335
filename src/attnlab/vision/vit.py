"""Vision Transformer (D2L 11.8 (no zh section); Dosovitskiy et al. 2021) and a
small CNN of about the same size to compare it with.

The ViT cuts an image into patch_size × patch_size patches, embeds each (a convolution whose
kernel and stride are the patch size, D2L 11.8.1 (no zh section)), puts a learned class token at position 0,
adds learned positions and runs :class:`attnlab.models.transformer.TransformerEncoderBlock`
over the sequence; the classifier reads the class token's output. Our encoder blocks are
the post-norm blocks of D2L 11.7 (zh 10.7) with a ReLU FFN, where D2L 11.8.2 (no zh section)
and the paper use pre-norm blocks with a GELU MLP; the head is therefore a plain linear layer
(the blocks end in a layer norm).

Images are float32 (B, C, H, W); labels int64 (B,); logits float32 (B, num_classes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import cast

import torch
from torch import nn

from attnlab.errors import ConfigError
from attnlab.models.transformer import TransformerEncoderBlock


class PatchEmbedding(nn.Module):
    """Patches → vectors: a convolution with kernel = stride = ``patch_size`` (D2L 11.8.1 (no zh section)).

    Shapes: X (B, C, H, W) → (B, (H/p)·(W/p), d_model); patches in row-major order (left to
    right, then top to bottom), so patch k covers rows p·(k // (W/p)) … and columns p·(k % (W/p)) ….
    Raises:
        ValueError: ``image_size`` not divisible by ``patch_size`` (names both).
    """

    def __init__(self, image_size: int, patch_size: int, in_channels: int, d_model: int):
        super().__init__()
        if image_size % patch_size:
            raise ConfigError(
                f"image_size={image_size} is not divisible by patch_size={patch_size}; "
                "set model.net.patch_size to a divisor of the image size"
            )
        self.grid = image_size // patch_size  # patches per side
        self.num_patches = self.grid**2
        self.conv = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.conv(X).flatten(2).transpose(1, 2)  # (B, d, g, g) → (B, g·g, d)


class VisionTransformer(nn.Module):
    """ViT for classification (D2L 11.8.3 (no zh section); Dosovitskiy et al. 2021, eq. 1-4).

    Args:
        image_size, in_channels, num_classes: of the data (square images).
        patch_size: side p of a patch; the sequence is 1 + (image_size/p)² long.
        d_model, num_heads, num_layers, ffn_hidden, dropout: as in
            :class:`attnlab.models.transformer.Transformer` (D2L: num_hiddens, num_heads,
            num_blks, mlp_num_hiddens, dropout). Defaults: conf/model/vit.yaml's.
    Shapes: X (B, C, H, W) float32 → logits (B, num_classes).
    Raises:
        ValueError: ``image_size`` not divisible by ``patch_size``; ``d_model`` not divisible
            by ``num_heads``.
    """

    kind = "vit"

    def __init__(
        self,
        image_size: int,
        in_channels: int,
        num_classes: int,
        patch_size: int = 2,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        ffn_hidden: int = 128,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.patch_embedding = PatchEmbedding(image_size, patch_size, in_channels, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        num_steps = self.patch_embedding.num_patches + 1  # the class token and the patches
        self.pos_embedding = nn.Parameter(torch.randn(1, num_steps, d_model) * 0.02)
        self.dropout = nn.Dropout(dropout)
        self.blks = nn.ModuleList(
            TransformerEncoderBlock(d_model, num_heads, ffn_hidden, dropout) for _ in range(num_layers)
        )
        self.head = nn.Linear(d_model, num_classes)

    def _blocks(self) -> Iterator[TransformerEncoderBlock]:
        return cast("Iterator[TransformerEncoderBlock]", iter(self.blks))

    def encode(self, X: torch.Tensor, need_weights: bool = False) -> torch.Tensor:
        """X (B, C, H, W) → encoder outputs (B, 1 + num_patches, d_model), the class token first.

        With ``need_weights`` each block's ``attention.attention_weights`` is kept,
        (B, H, 1 + num_patches, 1 + num_patches)."""
        X = self.patch_embedding(X)  # (B, N, d)
        X = torch.cat([self.cls_token.expand(X.shape[0], -1, -1), X], 1)  # (B, 1 + N, d)
        X = self.dropout(X + self.pos_embedding)
        for blk in self._blocks():
            X = blk(X, None, need_weights)
        return X

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(X)[:, 0])  # the class token's output → (B, num_classes)

    @torch.no_grad()
    def attention_weights(self, X: torch.Tensor) -> list[torch.Tensor]:
        """Every block's self-attention weights, bottom first: each (B, num_heads, 1 + N, 1 + N)
        float32 over the class token (position 0) and the N patches in row-major order; each row
        sums to 1."""
        self.encode(X, need_weights=True)
        maps = []
        for blk in self._blocks():
            w = blk.attention.attention_weights
            assert w is not None
            maps.append(w)
        return maps

    def class_token_attention(self, X: torch.Tensor) -> list[torch.Tensor]:
        """The class token's attention over the patches, per layer (bottom first): each
        (B, num_heads, g, g) float32, g = image_size / patch_size, laid out like the image.
        Each head's weights over the class token and the patches sum to 1; the weight on the
        class token itself is left out."""
        g = self.patch_embedding.grid
        return [w[:, :, 0, 1:].reshape(w.shape[0], w.shape[1], g, g) for w in self.attention_weights(X)]


class SmallCNN(nn.Module):
    """The ViT's baseline: three 3×3 convolutions with ReLU, 2×2 max pooling after the second
    and third, then a linear classifier (a LeNet-like net, D2L 7.6 (zh 6.6), without attention).

    Args:
        image_size, in_channels, num_classes: of the data (square images, size divisible by 4).
        channels: the three convolutions' output channels.
    Shapes: X (B, C, H, W) float32 → logits (B, num_classes).
    Raises:
        ValueError: ``image_size`` not divisible by 4, or not three ``channels``.
    """

    kind = "cnn"

    def __init__(
        self,
        image_size: int,
        in_channels: int,
        num_classes: int,
        channels: Sequence[int] = (32, 64, 72),
        dropout: float = 0.1,
    ):
        super().__init__()
        if image_size % 4 or len(channels) != 3:
            raise ValueError(
                f"SmallCNN needs an image size divisible by 4 and three channels; got "
                f"image_size={image_size}, channels={list(channels)}"
            )
        c1, c2, c3 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # H/2
            nn.Conv2d(c2, c3, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # H/4
            nn.Flatten(),
            nn.Dropout(dropout),
        )
        self.head = nn.Linear(c3 * (image_size // 4) ** 2, num_classes)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(X))


# The `_target_` strings an image model config may name (conf/model/{vit,cnn}.yaml).
IMAGE_NET_TARGETS = ("attnlab.vision.vit.VisionTransformer", "attnlab.vision.vit.SmallCNN")


def build_image_net(config: Mapping, image_size: int, in_channels: int, num_classes: int) -> nn.Module:
    """The image classifier ``config`` describes (``{"_target_": <class>, size: value, …}``),
    sized to the data. Like :func:`attnlab.models.build_net`, it builds only attnlab's own
    classes (:data:`IMAGE_NET_TARGETS`) and imports or calls nothing a config names.

    Raises:
        ValueError: ``_target_`` is not one of :data:`IMAGE_NET_TARGETS`, or a key starts
            with ``_`` (names it and the accepted targets).
    """
    target = config.get("_target_")
    classes = {f"{c.__module__}.{c.__qualname__}": c for c in (VisionTransformer, SmallCNN)}
    if target not in classes:
        raise ConfigError(
            f"image model config names _target_={target!r}; attnlab builds only "
            f"{', '.join(IMAGE_NET_TARGETS)}: set model.net._target_ to one of them"
        )
    args = {k: v for k, v in config.items() if k != "_target_"}
    bad = [k for k in args if k.startswith("_")]
    if bad:
        raise ConfigError(f"image model config {target}: keys {bad} are not model settings; remove them")
    return classes[target](image_size=image_size, in_channels=in_channels, num_classes=num_classes, **args)
