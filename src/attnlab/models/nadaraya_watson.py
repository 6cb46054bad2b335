"""Nadaraya–Watson kernel regression as attention pooling (D2L 11.2).

f(x) = Σ_i softmax_i(-((x - x_i) w)² / 2) y_i, the Gaussian kernel with
bandwidth 1/w. ``w`` is fixed to 1 (non-parametric, D2L eq. 11.2.6) or
learned (parametric, D2L eq. 11.2.7). Average pooling, f(x) = mean(y_i),
is the baseline. Also: the synthetic data of D2L 11.2.1.
"""
from __future__ import annotations

import torch
from torch import nn


def true_function(x: torch.Tensor) -> torch.Tensor:
    """D2L's target f(x) = 2 sin(x) + x^0.8, elementwise, float."""
    return 2 * torch.sin(x) + x ** 0.8


def synthetic_regression(n_train: int = 50, noise_std: float = 0.5, x_max: float = 5.0,
                         seed: int = 0) -> dict[str, torch.Tensor]:
    """D2L 11.2.1's data: sorted x_train ~ U(0, x_max), y = f(x) + N(0, noise_std²),
    ``n_train`` evenly spaced test points on [0, x_max) with noise-free targets.

    Returns float32 tensors x_train, y_train (n_train,), x_test, y_test (n_train,).
    """
    g = torch.Generator().manual_seed(seed)
    x_train, _ = torch.sort(torch.rand(n_train, generator=g) * x_max)
    y_train = true_function(x_train) + torch.randn(n_train, generator=g) * noise_std
    x_test = torch.arange(0, x_max, x_max / n_train)[:n_train]
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test,
            "y_test": true_function(x_test)}


def synthetic_from_config(data_cfg, seed: int) -> dict[str, torch.Tensor]:
    """:func:`synthetic_regression` with the sizes of a ``conf/data/synthetic.yaml`` config.

    Raises:
        ValueError: if the config is not ``data=synthetic`` (NW trains on nothing else).
    """
    if data_cfg.name != "synthetic":
        raise ValueError(f"model=nw trains on data=synthetic, not data={data_cfg.name}; "
                         "drop the data= override")
    return synthetic_regression(data_cfg.n_train, data_cfg.noise_std, data_cfg.x_max, seed=seed)


class NadarayaWatson(nn.Module):
    """Gaussian-kernel attention pooling.

    Args:
        parametric: learn the scalar ``w`` (else w = 1, no parameters train).
    Shapes: queries (Q,), keys (Q, K) or (K,), values like keys → (Q,).
        ``self.attention_weights`` is (Q, K).
    """

    kind = "nw"

    def __init__(self, parametric: bool = True, init_w: float = 1.0):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(float(init_w)), requires_grad=parametric)
        self.attention_weights: torch.Tensor | None = None

    def forward(self, queries, keys, values):
        if keys.dim() == 1:
            keys = keys.expand(queries.shape[0], -1)
            values = values.expand(queries.shape[0], -1)
        diff = (queries[:, None] - keys) * self.w  # (Q, K)
        self.attention_weights = torch.softmax(-diff ** 2 / 2, dim=1)
        return (self.attention_weights * values).sum(dim=1)  # (Q,)


def leave_one_out(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values for training queries x (n,): each row holds the other n-1 points (D2L 11.2.4)."""
    n = x.shape[0]
    mask = ~torch.eye(n, dtype=torch.bool)
    return x.expand(n, n)[mask].reshape(n, n - 1), y.expand(n, n)[mask].reshape(n, n - 1)


def nw_evaluation(data: dict[str, torch.Tensor], w: float) -> dict:
    """Test MSE of average pooling, non-parametric NW (w=1) and parametric NW (learned w).

    Returns ``{"mse": parametric, "mse_nonparametric": …, "mse_average_pooling": …, "w": w}``
    and the (m, n) weight matrix of the parametric model under key ``"weights"``,
    predictions under ``"predictions"``.
    """
    x, y, xt, yt = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    preds = {"average pooling": y.mean().expand_as(yt)}
    with torch.no_grad():
        preds["non-parametric (w=1)"] = NadarayaWatson(parametric=False)(xt, x, y)
        param = NadarayaWatson(parametric=False, init_w=w)
        preds[f"parametric (w={w:.2f})"] = param(xt, x, y)
    mse = {k: float(((p - yt) ** 2).mean()) for k, p in preds.items()}
    names = list(preds)
    return {"mse": mse[names[2]], "mse_nonparametric": mse[names[1]],
            "mse_average_pooling": mse[names[0]], "w": w,
            "weights": param.attention_weights, "predictions": preds}
