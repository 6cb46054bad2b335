"""Nadaraya–Watson kernel regression as attention pooling (D2L 11.2 (zh 10.2); Nadaraya 1964, Watson 1964).

D2L 11.2 (zh 10.2) "Attention Pooling by Similarity" (current edition):

* eq. 11.2.1, the kernels, applied to u = (x - x_i) / σ with width σ
  (D2L 11.2.3 (zh 10.2.4) "Adapting Attention Pooling" introduces σ for the Gaussian)::

      gaussian      k(u) = exp(-u² / 2)
      boxcar        k(u) = 1 if |u| < 1 else 0
      constant      k(u) = 1                      (drawn in D2L's code and figures)
      epanechnikov  k(u) = max(0, 1 - |u|)        (D2L's form, spelled "Epanechikov" there)

  The boxcar follows D2L's code (``abs(x) < 1``); eq. 11.2.1 writes ≤.
* eq. 11.2.2, the estimator::

      f(x) = Σ_i α_i(x) y_i,   α_i(x) = k((x - x_i)/σ) / Σ_j k((x - x_j)/σ)

The weights are computed as softmax_i(log k(u_i)), which equals the ratio
above wherever some key has kernel mass; for the Gaussian the scores are
-u²/2, so narrow widths never underflow to 0/0.

**No-mass rule.** When no key has non-zero kernel mass for a query (boxcar or
Epanechnikov with every key at |x - x_i| ≥ σ; a Gaussian whose scores all
overflow to -inf), the query attends to its nearest key(s): weight 1 on the
key closest to x, split equally between keys tied at that distance. This is
the σ → 0 limit of the Gaussian estimator, so every compact kernel also tends
to the nearest-neighbour prediction as σ → 0, and no output is ever NaN.

The model holds w = 1/σ. It is fixed (non-parametric) or learned (parametric,
previous edition's eq. 11.2.7, f(x) = Σ_i softmax(-((x - x_i) w)²/2) y_i).
Average pooling, f(x) = mean(y_i), is the baseline. The synthetic data of the
D2L zh 10.2.1 (the previous English edition's 10.2.1) is in :mod:`attnlab.data.synthetic`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


def _log_gaussian(u: torch.Tensor) -> torch.Tensor:
    return -(u**2) / 2


# boxcar and constant keep u in the graph (u * 0) so a parametric w gets a zero gradient, not an
# error; torch.where never selects u * 0 where u = ±inf (where it would be NaN)
def _log_boxcar(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u.abs() < 1, u * 0, float("-inf"))


def _log_constant(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u.isfinite(), u * 0, 0.0)


def _log_epanechnikov(u: torch.Tensor) -> torch.Tensor:
    mass = 1 - u.abs()
    # clamp first so neither log(0) nor its gradient appears; masked entries get -inf
    log_mass = torch.log(mass.clamp_min(torch.finfo(u.dtype).tiny))
    return log_mass.masked_fill(mass <= 0, float("-inf"))


LOG_KERNELS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gaussian": _log_gaussian,
    "boxcar": _log_boxcar,
    "constant": _log_constant,
    "epanechnikov": _log_epanechnikov,
}
KERNELS: tuple[str, ...] = tuple(LOG_KERNELS)


def check_kernel(name: str) -> str:
    """``name`` if it is one of :data:`KERNELS`.

    Raises:
        ValueError: unknown kernel name; the message lists the valid names.
    """
    if name not in LOG_KERNELS:
        raise ValueError(
            f"unknown kernel {name!r}; choose one of {', '.join(KERNELS)} "
            "(model.kernels in conf/model/nw.yaml)"
        )
    return name


def check_width(width: float) -> float:
    """``width`` as a float if it is a valid kernel width σ, 0 < σ ≤ ∞.

    Raises:
        ValueError: σ ≤ 0 or NaN.
    """
    width = float(width)
    if not width > 0:  # also rejects NaN
        raise ValueError(f"kernel width must be > 0 (σ = ∞ is allowed), got {width}")
    return width


def kernel(name: str, u: torch.Tensor) -> torch.Tensor:
    """k(u) of D2L eq. 11.2.1 for the kernel ``name``, elementwise; float in, same dtype out.

    Raises:
        ValueError: unknown kernel name.
    """
    return torch.exp(LOG_KERNELS[check_kernel(name)](u))


def kernel_weights(
    queries: torch.Tensor, keys: torch.Tensor, kernel: str = "gaussian", w: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Attention weights α_i(x) = k((x - x_i) w) / Σ_j k((x - x_j) w), D2L eq. 11.2.2.

    Args:
        queries: (Q,) float.
        keys: (K,) float, shared by all queries, or (Q, K), one row per query.
        kernel: one of :data:`KERNELS`.
        w: inverse width 1/σ, a float or a 0-dim float tensor (may require grad).
    Returns:
        (Q, K) float, rows summing to 1; queries without kernel mass follow the
        module's no-mass rule (all weight on the nearest key(s)).
    Raises:
        ValueError: unknown kernel, queries not 1-D, keys not 1-D or 2-D, or no keys.
    """
    log_k = LOG_KERNELS[check_kernel(kernel)]
    if queries.dim() != 1 or keys.dim() not in (1, 2) or keys.shape[-1] == 0:
        raise ValueError(
            f"need queries (Q,) and keys (K,) or (Q, K) with K ≥ 1; got queries "
            f"{tuple(queries.shape)}, keys {tuple(keys.shape)}"
        )
    diff = queries[:, None] - keys  # (Q, K)
    scores = log_k(diff * w)  # (Q, K), -inf where k = 0
    dist = diff.abs()
    nearest = torch.zeros_like(dist).masked_fill(dist > dist.amin(-1, keepdim=True), float("-inf"))
    no_mass = torch.isneginf(scores).all(-1, keepdim=True)  # (Q, 1)
    return torch.softmax(torch.where(no_mass, nearest, scores), dim=-1)


class NadarayaWatson(nn.Module):
    """Kernel attention pooling f(x) = Σ_i α_i(x) y_i (D2L eq. 11.2.2) with a scalar w = 1/σ.

    Args:
        parametric: learn ``w`` (else no parameter trains). For the boxcar the
            loss is flat in w almost everywhere and for the constant kernel
            everywhere, so only the Gaussian and Epanechnikov learn a width.
        init_w: initial w = 1/σ (default 1).
        kernel: one of :data:`KERNELS` (keyword only).
        width: initial σ, the alternative to ``init_w`` (keyword only).
    Shapes: queries (Q,), keys (K,) or (Q, K), values like keys → (Q,), float.
        ``self.attention_weights`` is (Q, K).
    Raises:
        ValueError: unknown kernel, σ ≤ 0, or both ``init_w`` and ``width`` given.
    """

    kind = "nw"

    def __init__(
        self,
        parametric: bool = True,
        init_w: float | None = None,
        *,
        kernel: str = "gaussian",
        width: float | None = None,
    ):
        super().__init__()
        if init_w is not None and width is not None:
            raise ValueError(f"give the width σ={width} or init_w=1/σ={init_w}, not both")
        w = 1.0 / check_width(width) if width is not None else (1.0 if init_w is None else init_w)
        self.kernel = check_kernel(kernel)
        self.w = nn.Parameter(torch.tensor(float(w)), requires_grad=parametric)
        self.attention_weights: torch.Tensor | None = None

    @property
    def width(self) -> float:
        """The current σ = 1/|w| (∞ when w = 0)."""
        w = abs(float(self.w.detach()))
        return float("inf") if w == 0 else 1.0 / w

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}, w={float(self.w.detach()):.4g}"

    def forward(self, queries, keys, values):
        self.attention_weights = kernel_weights(queries, keys, self.kernel, self.w)  # (Q, K)
        return (self.attention_weights * values).sum(dim=-1)  # (Q,)


def leave_one_out(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values for training queries x (n,): each row holds the other n-1 points (D2L zh 10.2.4)."""
    n = x.shape[0]
    mask = ~torch.eye(n, dtype=torch.bool)
    return x.expand(n, n)[mask].reshape(n, n - 1), y.expand(n, n)[mask].reshape(n, n - 1)


@torch.no_grad()
def nw_evaluation(
    data: dict[str, torch.Tensor],
    w: float,
    kernels: Iterable[str] = KERNELS,
    width: float = 1.0,
    width_sweep: Iterable[float] = (),
) -> dict:
    """Test MSE of average pooling, NW with each kernel at width σ, and the trained model.

    Args:
        data: :func:`attnlab.data.synthetic.synthetic_regression`'s dict; keys are x_train (n,),
            queries x_test (m,).
        w: the trained (parametric, Gaussian) model's w = 1/σ.
        kernels: kernel names for the non-parametric models; width: their σ.
        width_sweep: σ values for the Gaussian sweep of D2L 11.2.3 (zh 10.2.4) (may be empty).
    Returns:
        ``scores``: the JSON-ready metrics: ``mse`` (parametric), ``mse_nonparametric``
        (Gaussian, σ = 1), ``mse_average_pooling``, ``w``, ``mse_<kernel>`` per kernel
        and ``kernel_width`` (σ); the same keys also at the top level.
        ``predictions``: label → (m,) for the fit plot (average pooling,
        non-parametric, parametric); ``weights``: the parametric model's (m, n).
        ``kernels``: kernel → {"prediction": (m,), "weights": (m, n)} at σ.
        ``width_sweep``: σ → the same for the Gaussian.
    Raises:
        ValueError: unknown kernel name or σ ≤ 0.
    """
    x, y, xt, yt = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    kernels = [check_kernel(k) for k in kernels]
    width = check_width(width)

    def fit(kernel: str, **kw) -> dict[str, torch.Tensor]:
        net = NadarayaWatson(parametric=False, kernel=kernel, **kw)
        return {"prediction": net(xt, x, y), "weights": net.attention_weights}

    def mse(pred: torch.Tensor) -> float:
        return float(((pred - yt) ** 2).mean())

    average = y.mean().expand_as(yt)
    nonparametric, parametric = fit("gaussian", init_w=1.0), fit("gaussian", init_w=w)
    per_kernel = {k: fit(k, width=width) for k in kernels}
    sweep = {float(s): fit("gaussian", width=s) for s in width_sweep}
    scores = {
        "mse": mse(parametric["prediction"]),
        "mse_nonparametric": mse(nonparametric["prediction"]),
        "mse_average_pooling": mse(average),
        "w": float(w),
        **{f"mse_{k}": mse(f["prediction"]) for k, f in per_kernel.items()},
        "kernel_width": width,
    }
    predictions = {
        "average pooling": average,
        "non-parametric Gaussian (σ=1)": nonparametric["prediction"],
        f"parametric Gaussian (learned w={w:.2f})": parametric["prediction"],
    }
    return {
        **scores,
        "scores": scores,
        "predictions": predictions,
        "weights": parametric["weights"],
        "kernels": per_kernel,
        "width_sweep": sweep,
    }
