"""LightningModule for image classification: the Vision Transformer (D2L 11.8 (no zh section))
and its CNN baseline.

``conf/model/vit.yaml`` and ``conf/model/cnn.yaml`` name it as their ``task.module`` (see
:mod:`attnlab.lit.translation`); the data are ``conf/data/{digits,mnist,cifar10}.yaml``
(:mod:`attnlab.vision.data`).
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.nn import functional as F
from torch.utils.data import DataLoader
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from attnlab.analysis.explorer import translation_epoch, translation_explorer, write_explorer
from attnlab.analysis.viz import KindMaps, SentenceMaps, heatmap_grid
from attnlab.lit.shards import RankShard
from attnlab.vision.data import load_image_splits
from attnlab.vision.vit import VisionTransformer, build_image_net


class ClassificationModule(pl.LightningModule):
    """Trains an image classifier (``attnlab.vision.vit``) by cross-entropy.

    Args:
        net: plain config dict of the model (``_target_`` and sizes, ``model.net``).
        optimizer: plain config dict of a partial ``torch.optim`` optimizer.
        image_size, channels, num_classes: of the data (``conf/data/<name>.yaml``).
    Logged metrics: ``train_loss``, ``val_loss`` (mean cross-entropy per image), ``val_acc``
    (top-1 accuracy in [0, 1]), per epoch; both val metrics are reduced across DDP ranks.
    """

    def __init__(self, net: dict, optimizer: dict, image_size: int, channels: int, num_classes: int):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = build_image_net(net, image_size, channels, num_classes)
        self.val_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.figure_images: tuple[torch.Tensor, torch.Tensor] | None = None  # (images, labels)

    def forward(self, X):
        return self.net(X)

    def training_step(self, batch, batch_idx):
        X, y = batch
        loss = F.cross_entropy(self.net(X), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        X, y = batch
        logits = self.net(X)
        self.val_loss.update(F.cross_entropy(logits, y, reduction="none"))
        self.val_acc.update(logits, y)
        self.log("val_loss", self.val_loss, prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def configure_optimizers(self):
        return instantiate(self.hparams.optimizer)(params=self.parameters())

    # --- what train.py asks of its task (conf/model/{vit,cnn}.yaml: task.module) -------------

    @classmethod
    def from_config(cls, cfg: DictConfig) -> tuple[ClassificationModule, tuple[DataLoader, DataLoader]]:
        """(module, (train loader, val loader)) for ``trainer.fit(module, *loaders)``: the images
        of ``data`` (:func:`attnlab.vision.data.load_image_splits`) in batches of
        ``model.batch_size``, training shuffled with ``seed``; the module keeps the val images at
        ``heatmaps.sentences`` (indices; those past the split are skipped) for its figures.

        Raises:
            ValueError: data that hold no images (names the ones that do); a bad model config.
        """
        data = cfg.data
        splits = load_image_splits(data)
        module = cls(
            net=OmegaConf.to_container(cfg.model.net, resolve=True),
            optimizer=OmegaConf.to_container(cfg.optimizer, resolve=True),
            image_size=data.image_size,
            channels=data.channels,
            num_classes=data.num_classes,
        )
        val_x, val_y = splits.splits["val"]
        keep = [i for i in cfg.heatmaps.sentences if i < len(val_y)]
        module.figure_images = (val_x[keep], val_y[keep])
        b = cfg.model.batch_size
        # under DDP each rank validates its share of the images, each image once (RankShard)
        val = splits.loader("val", b, sampler=RankShard(len(val_y)))
        return module, (splits.loader("train", b, shuffle=True, seed=cfg.seed), val)

    @staticmethod
    def run_tags(cfg: DictConfig) -> dict[str, str]:
        """Nothing beyond the model and data tags every run has."""
        return {}

    def epoch_callbacks(self, cfg: DictConfig, folder: Path, logger) -> list[pl.Callback]:
        """None: the attention is drawn once, at the end."""
        return []

    def figures(self, net: torch.nn.Module, folder: Path) -> list[Path]:
        """A ViT's class-token attention over the patches, last layer, every head, for each kept
        val image (:func:`class_token_figures`), in ``<folder>/attention``, and the attention
        explorer of every layer and head (:func:`vit_explorer`) in ``<folder>/explorer.html``;
        a CNN has no attention: none."""
        if not isinstance(net, VisionTransformer) or self.figure_images is None:
            return []
        images, labels = self.figure_images
        pngs = class_token_figures(net, images, labels, Path(folder) / "attention")
        title = "Vision Transformer, D2L 11.8 (no zh section): self-attention over [CLS] and the patches"
        page = vit_explorer(net, images, labels, title, epoch=max(self.current_epoch, 1))
        return [*pngs, write_explorer(Path(folder) / "explorer.html", page)]


def patch_tokens(grid: int) -> list[str]:
    """The token labels of a ViT's sequence: ``[CLS]``, then each patch as ``row,column``
    (0-based, row-major, as :class:`attnlab.vision.vit.PatchEmbedding` orders them)."""
    return ["[CLS]", *(f"{r},{c}" for r in range(grid) for c in range(grid))]


def vit_explorer(
    net: VisionTransformer, images: torch.Tensor, labels: torch.Tensor, title: str, epoch: int = 1
) -> str:
    """The attention explorer page (:func:`attnlab.analysis.explorer.translation_explorer`) of a
    ViT's self-attention: one entry per image ("val image i, label y" → "predicted ŷ"), the kind
    ``encoder_self`` with every layer and head over the class token and the patches
    (:func:`patch_tokens`), weights from :meth:`VisionTransformer.attention_weights`.

    Args:
        images: (N, C, H, W) float32; labels: (N,) int64; epoch: the epochs trained (one slider
            position, labelled "trained").
    """
    was_training = net.training
    net.eval()
    with torch.no_grad():
        layers = net.attention_weights(images)  # each (N, H, 1 + P, 1 + P)
        predicted = net(images).argmax(-1)
    net.train(was_training)
    tokens = patch_tokens(net.patch_embedding.grid)
    maps = [
        SentenceMaps(
            sentence=f"val image {i}, label {int(labels[i])}",
            translation=f"predicted {int(predicted[i])}",
            kinds={
                "encoder_self": KindMaps(
                    "encoder_self",
                    [w[i].float().cpu() for w in layers],
                    tokens,
                    tokens,
                    "class token and patches (keys)",
                    "class token and patches (queries)",
                )
            },
        )
        for i in range(len(images))
    ]
    return translation_explorer([translation_epoch(maps, epoch, label="trained")], title)


def class_token_figures(
    net: VisionTransformer, images: torch.Tensor, labels: torch.Tensor, out_dir: Path
) -> list[Path]:
    """One PNG per image, ``image<i>_cls_attention.png`` in ``out_dir``: the class token's attention
    over the patches in the last layer (:meth:`VisionTransformer.class_token_attention`), a panel
    per head laid out like the image (g × g patches), after a first panel with each patch's mean
    pixel value scaled to the largest weight (where the ink is). Drawn with
    :func:`attnlab.analysis.viz.heatmap_grid`, colour scale fitted to the weights.

    Args:
        images: (N, C, H, W) float32; labels: (N,) int64.
    Returns the paths written.
    """
    was_training = net.training
    net.eval()
    with torch.no_grad():
        weights = net.class_token_attention(images)[-1]  # (N, H, g, g)
        predicted = net(images).argmax(-1)
    net.train(was_training)
    g = weights.shape[-1]
    ink = F.adaptive_avg_pool2d(images.mean(1), g)  # (N, g, g): mean pixel value per patch
    paths = []
    for i in range(len(images)):
        w = weights[i]  # (H, g, g)
        top = float(w.max())
        scaled = ink[i] / ink[i].max().clamp_min(1e-8) * top
        paths.append(
            heatmap_grid(
                torch.cat([scaled[None], w]),
                [str(j) for j in range(g)],
                [str(j) for j in range(g)],
                f"class token attention over {g}x{g} patches, last layer: "
                f"val image {i}, label {int(labels[i])}, predicted {int(predicted[i])}",
                Path(out_dir) / f"image{i}_cls_attention.png",
                panel_titles=["patch mean (scaled)", *(f"head {h + 1}" for h in range(w.shape[0]))],
                xlabel="patch column",
                ylabel="patch row",
                vmax=None,
            )
        )
    return paths
