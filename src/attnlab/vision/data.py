"""Image classification data for the Vision Transformer (D2L 11.8 (no zh section)) and its CNN baseline.

Each ``conf/data/<name>.yaml`` of images names its reader as ``load``; the reader returns
:class:`ImageSplits`: float32 images (N, C, H, W) in [0, 1] and int64 labels (N,) for
``train``, ``val`` and ``test``.

* :func:`load_digits_splits`: scikit-learn's bundled 8×8 digits (``sklearn.datasets.load_digits``,
  1,797 images, no download), split train/val/test with a fixed seed, stratified by class.
* :func:`load_torchvision_splits`: MNIST or CIFAR-10 read from files the user already has by
  ``torchvision.datasets.MNIST`` / ``CIFAR10`` (``download=False``, their ``root``); val is a
  fixed-seed part of the official training set, test the official test set.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hydra.utils import get_method
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Sampler, TensorDataset

from attnlab.errors import ConfigError, MissingFileError

SPLITS = ("train", "val", "test")


@dataclass
class ImageSplits:
    """``{split: (images (N, C, H, W) float32 in [0, 1], labels (N,) int64)}`` and class names."""

    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]
    classes: list[str]

    def loader(
        self,
        split: str,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        sampler: Sampler | None = None,
    ) -> DataLoader:
        """Batches of (images, labels) of ``split``; shuffled with a generator seeded by ``seed``,
        or in the order of ``sampler`` (the indices of the images to read)."""
        g = torch.Generator().manual_seed(seed) if shuffle else None
        return DataLoader(
            TensorDataset(*self.splits[split]), batch_size, shuffle=shuffle, generator=g, sampler=sampler
        )


def _check_image_config(data: DictConfig, images: torch.Tensor) -> None:
    """The images' shape must be the one the data config promises (the nets are sized from it)."""
    expected = (data.channels, data.image_size, data.image_size)
    if tuple(images.shape[1:]) != expected:
        raise ConfigError(
            f"data={data.name}: images of shape {tuple(images.shape[1:])} (C, H, W), but the config "
            f"says channels={data.channels}, image_size={data.image_size}: fix conf/data/{data.name}.yaml"
        )


def _subset(splits: dict, subset: int | None) -> dict:
    """The first ``subset`` images of each split (``None``: all)."""
    if subset is None:
        return splits
    if subset < 1:
        raise ConfigError(f"data.subset={subset}; give a positive number of images per split, or null")
    return {k: (x[:subset], y[:subset]) for k, (x, y) in splits.items()}


def load_image_splits(data: DictConfig) -> ImageSplits:
    """The splits of the images ``data`` describes, by its reader (``data.load``), cut to
    ``data.subset`` images per split and checked against ``data.channels``/``data.image_size``.

    Raises:
        ValueError: a data config without ``load`` (not an image data set: names the ones that
            are), a non-positive ``subset``, images of another shape than the config's.
    """
    if data.get("load") is None:
        raise ConfigError(
            f"data={data.name} holds no images; the image models train on data=digits, data=mnist "
            "or data=cifar10"
        )
    read = get_method(data.load)(data)
    splits = _subset(read.splits, data.get("subset"))
    for x, _ in splits.values():
        _check_image_config(data, x)
    return ImageSplits(splits, read.classes)


def load_digits_splits(data: DictConfig) -> ImageSplits:
    """scikit-learn's 8×8 digits (pixel values 0–16, divided by 16), split with
    ``train_test_split(stratify=labels, random_state=data.split_seed)``: ``data.test_fraction``
    of all images for test, then ``data.val_fraction`` of all images for val, the rest train.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    X = torch.from_numpy(bunch.images.astype(np.float32) / 16.0)[:, None]  # (1797, 1, 8, 8)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    idx = np.arange(len(y))
    rest, test = train_test_split(
        idx, test_size=data.test_fraction, stratify=bunch.target, random_state=data.split_seed
    )
    val_share = data.val_fraction / (1.0 - data.test_fraction)  # of what is left
    train, val = train_test_split(
        rest, test_size=val_share, stratify=bunch.target[rest], random_state=data.split_seed
    )
    pick = lambda i: (X[np.sort(i)], y[np.sort(i)])
    return ImageSplits(
        {"train": pick(train), "val": pick(val), "test": pick(test)}, [str(c) for c in bunch.target_names]
    )


def _torchvision_dataset(name: str):
    """The class ``torchvision.datasets.<name>``; a clear error where torchvision does not import."""
    try:
        datasets = importlib.import_module("torchvision.datasets")
    except (ImportError, RuntimeError) as e:  # RuntimeError: a torchvision built for another torch
        raise RuntimeError(
            f"data needs torchvision, which does not import here ({type(e).__name__}: "
            f"{str(e).splitlines()[0]}); install the torchvision build that matches torch "
            f"{torch.__version__} (pip install torchvision==0.28.0 for torch 2.13)"
        ) from None
    return getattr(datasets, name)


def _as_nchw(images) -> torch.Tensor:
    """uint8 images (N, H, W) (MNIST) or (N, H, W, C) (CIFAR-10) → float32 (N, C, H, W) in [0, 1]."""
    x = torch.as_tensor(np.asarray(images))
    x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x.contiguous().float() / 255.0


def load_torchvision_splits(data: DictConfig) -> ImageSplits:
    """MNIST or CIFAR-10 (``data.dataset``: ``MNIST`` or ``CIFAR10``, a class of
    ``torchvision.datasets``) from ``data.root`` with ``download=False``: their own file checks
    run (CIFAR-10 verifies each batch's MD5). Val: ``data.val_size`` images of the official
    training set, drawn with ``data.split_seed``; test: the official test set.

    Raises:
        FileNotFoundError: the files are not under ``data.root`` (names the layout to put there).
        RuntimeError: torchvision does not import (names the build to install).
    """
    cls = _torchvision_dataset(data.dataset)
    root = Path(data.root)
    try:
        train_set, test_set = (cls(str(root), train=flag, download=False) for flag in (True, False))
    except RuntimeError as e:
        raise MissingFileError(
            f"data={data.name}: {e} (torchvision.datasets.{data.dataset}, root {root}). Put the "
            f"files there: {data.files}; or set data.root"
        ) from None
    x, y = _as_nchw(train_set.data), torch.as_tensor(np.asarray(train_set.targets), dtype=torch.long)
    if not 0 < data.val_size < len(y):
        raise ConfigError(
            f"data.val_size={data.val_size}; give 1 to {len(y) - 1} (the training set has {len(y)})"
        )
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(data.split_seed))
    val, train = perm[: data.val_size].sort().values, perm[data.val_size :].sort().values
    test = (_as_nchw(test_set.data), torch.as_tensor(np.asarray(test_set.targets), dtype=torch.long))
    return ImageSplits(
        {"train": (x[train], y[train]), "val": (x[val], y[val]), "test": test}, list(train_set.classes)
    )
