"""The synthetic regression data of D2L 11.2 (zh 10.2) for Nadaraya–Watson: y = 2 sin x + x^0.8 + noise.

As D2L zh 10.2.1 (生成数据集; the English 0.17 edition's 10.2.1) generates it: the English 1.0
edition's D2L 11.2.1 (zh 10.2.1) uses y = 2 sin x + x instead; ``conf/data/synthetic.yaml``
holds its sizes.
"""

from __future__ import annotations

import torch

from attnlab.errors import ConfigError


def true_function(x: torch.Tensor) -> torch.Tensor:
    """D2L's target f(x) = 2 sin(x) + x^0.8, elementwise, float."""
    return 2 * torch.sin(x) + x**0.8


def synthetic_regression(
    n_train: int = 50, noise_std: float = 0.5, x_max: float = 5.0, seed: int = 0
) -> dict[str, torch.Tensor]:
    """The data of D2L zh 10.2.1: sorted x_train ~ U(0, x_max),
    y = f(x) + N(0, noise_std²), ``n_train`` evenly spaced test points on [0, x_max)
    with noise-free targets.

    Returns float32 tensors x_train, y_train (n_train,), x_test, y_test (n_train,).
    """
    g = torch.Generator().manual_seed(seed)
    x_train, _ = torch.sort(torch.rand(n_train, generator=g) * x_max)
    y_train = true_function(x_train) + torch.randn(n_train, generator=g) * noise_std
    x_test = torch.arange(0, x_max, x_max / n_train)[:n_train]
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": true_function(x_test)}


def synthetic_from_config(data_cfg, seed: int) -> dict[str, torch.Tensor]:
    """:func:`synthetic_regression` with the sizes of a ``conf/data/synthetic.yaml`` config.

    Raises:
        ValueError: if the config is not ``data=synthetic`` (NW trains on nothing else).
    """
    if data_cfg.name != "synthetic":
        raise ConfigError(
            f"model=nw trains on data=synthetic, not data={data_cfg.name}; drop the data= override"
        )
    return synthetic_regression(data_cfg.n_train, data_cfg.noise_std, data_cfg.x_max, seed=seed)
