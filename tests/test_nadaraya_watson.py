"""Nadaraya–Watson with the four kernels of D2L 11.2 (zh 10.2): weights by hand, limits in σ, the
no-mass rule, the evaluation numbers and the figures.

Kernels (D2L eq. 11.2.1, applied to u = (x - x_i)/σ): gaussian exp(-u²/2), boxcar 1[|u| < 1],
constant 1, epanechnikov max(0, 1 - |u|); weights α_i = k(u_i) / Σ_j k(u_j) (D2L eq. 11.2.2).
"""

import math
import struct
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from attnlab.analysis.viz import nw_figures
from attnlab.data.synthetic import synthetic_regression
from attnlab.models.nadaraya_watson import KERNELS, NadarayaWatson, kernel, kernel_weights, nw_evaluation

CONF = str(Path(__file__).resolve().parents[1] / "conf")
KEYS = torch.tensor([0.0, 1.0, 3.0])
VALUES = torch.tensor([1.0, 2.0, 4.0])


def _nw(kernel_name, width, queries, keys=KEYS, values=VALUES):
    net = NadarayaWatson(parametric=False, kernel=kernel_name, width=width)
    return net(torch.tensor(queries), keys, values), net.attention_weights


# --- weights by hand -----------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5])
def test_gaussian_weights_are_softmax_of_squared_distance_over_two_sigma_squared(sigma):
    pred, w = _nw("gaussian", sigma, [1.5])
    logits = [-((1.5 - xi) ** 2) / (2 * sigma**2) for xi in (0.0, 1.0, 3.0)]
    z = sum(math.exp(v) for v in logits)
    expected = [math.exp(v) / z for v in logits]
    assert w[0].tolist() == pytest.approx(expected, abs=1e-7)
    assert pred.item() == pytest.approx(sum(a * y for a, y in zip(expected, (1, 2, 4))), abs=1e-6)


def test_gaussian_stays_a_softmax_where_the_plain_kernel_ratio_is_0_over_0():
    # σ = 0.01: logits -(0.5)²/2e-4 = -1250 and -(1.5)²/2e-4 = -11250; exp underflows to 0 in all
    sigma, q = 0.01, torch.tensor([1.5])
    k = torch.exp(-((q[:, None] - KEYS) ** 2) / (2 * sigma**2))
    assert torch.isnan(k / k.sum(-1, keepdim=True)).all()  # D2L's k / k.sum() form
    pred, w = _nw("gaussian", sigma, [1.5])
    assert w[0].tolist() == [0.0, 1.0, 0.0] and pred.item() == 2.0


def test_boxcar_weights_by_hand_with_a_strict_edge():
    keys, values = torch.tensor([0.0, 0.5, 1.2, 3.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    # query 0.4, σ = 1: |u| = 0.4, 0.1, 0.8, 2.6 → keys 0, 1, 2 inside, 1/3 each
    pred, w = _nw("boxcar", 1.0, [0.4], keys, values)
    assert w[0].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0], abs=1e-7)
    assert pred.item() == pytest.approx(2.0, abs=1e-6)
    # query 1, σ = 1: |u| = 1, 0, 2 → |u| = 1 is outside (D2L's code: abs(x) < 1)
    _, w = _nw("boxcar", 1.0, [1.0])
    assert w[0].tolist() == [0.0, 1.0, 0.0]
    # σ = 2.5 widens the box: |u| = 0.4, 0, 0.8 → all three inside
    _, w = _nw("boxcar", 2.5, [1.0])
    assert w[0].tolist() == pytest.approx([1 / 3] * 3, abs=1e-7)


@pytest.mark.parametrize(
    "sigma, masses",
    [
        (1.0, [0.6, 0.9, 0.2, 0.0]),  # |u| = .4 .1 .8 2.6
        (2.0, [0.8, 0.95, 0.6, 0.0]),
    ],
)  # |u| = .2 .05 .4 1.3
def test_epanechnikov_weights_by_hand(sigma, masses):
    keys, values = torch.tensor([0.0, 0.5, 1.2, 3.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    pred, w = _nw("epanechnikov", sigma, [0.4], keys, values)
    total = sum(masses)
    assert w[0].tolist() == pytest.approx([m / total for m in masses], abs=1e-6)
    assert pred.item() == pytest.approx(sum(m * y for m, y in zip(masses, (1, 2, 3, 4))) / total, abs=1e-6)


@pytest.mark.parametrize("sigma", [1e-3, 1.0, 1e3])
def test_constant_kernel_is_average_pooling_at_any_width(sigma):
    pred, w = _nw("constant", sigma, [-7.0, 0.5, 2.0])
    assert torch.equal(w, torch.full((3, 3), 1 / 3))
    assert pred.tolist() == pytest.approx([7 / 3] * 3, abs=1e-6)  # mean(1, 2, 4)


def test_kernel_shapes_match_d2l_eq_11_2_1():
    u = torch.tensor([-1.5, -1.0, -0.5, 0.0, 0.5, 1.0])
    assert kernel("gaussian", u).tolist() == pytest.approx([math.exp(-v * v / 2) for v in u.tolist()])
    assert kernel("boxcar", u).tolist() == [0, 0, 1, 1, 1, 0]
    assert kernel("constant", u).tolist() == [1] * 6
    assert kernel("epanechnikov", u).tolist() == pytest.approx([0, 0, 0.5, 1, 0.5, 0], abs=1e-7)


# --- limits in σ ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["gaussian", "boxcar", "epanechnikov"])
def test_narrow_width_is_nearest_neighbour(name):
    """σ → 0: the y of the nearest x_i. Gaussian: softmax sharpens; boxcar/Epanechnikov:
    most queries have no key within σ and take the no-mass rule's nearest key.
    Not the constant kernel (always mean(y), see above)."""
    d = synthetic_regression(seed=0)
    net = NadarayaWatson(parametric=False, kernel=name, width=1e-4)
    pred = net(d["x_test"], d["x_train"], d["y_train"])
    nearest = (d["x_test"][:, None] - d["x_train"]).abs().argmin(-1)
    assert torch.allclose(pred, d["y_train"][nearest], atol=1e-5)
    assert not torch.isnan(net.attention_weights).any()


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("sigma", [1e6, math.inf])
def test_wide_width_is_average_pooling(name, sigma):
    """σ → ∞: every kernel tends to k(0) for all keys, so f(x) → mean(y) (all four kernels)"""
    d = synthetic_regression(seed=0)
    pred = NadarayaWatson(parametric=False, kernel=name, width=sigma)(d["x_test"], d["x_train"], d["y_train"])
    assert torch.allclose(pred, d["y_train"].mean().expand_as(pred), atol=1e-4)


# --- the no-mass rule ------------------------------------------------------------


@pytest.mark.parametrize("name", ["boxcar", "epanechnikov"])
def test_no_kernel_mass_falls_back_to_the_nearest_key(name):
    # σ = 0.5, keys 0, 1, 3: query 2.2 has |u| = 4.4, 2.4, 1.6 → no mass → nearest key 3, y = 4;
    # query 2.0 has |u| = 4, 2, 2 → no mass, keys 1 and 3 tie → half each (y = 3);
    # query 1.2 has |u| = 2.4, 0.4, 3.6 → key 1 has mass, the rule does not apply.
    pred, w = _nw(name, 0.5, [2.2, 2.0, 1.2])
    assert w.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.5, 0.5], [0.0, 1.0, 0.0]]
    assert pred.tolist() == [4.0, 3.0, 2.0]


def test_gaussian_whose_scores_overflow_takes_the_nearest_key_never_nan():
    # σ = 1e-30: u² overflows float32 to inf, every score is -inf
    pred, w = _nw("gaussian", 1e-30, [2.2, 0.0])
    assert w.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]] and pred.tolist() == [4.0, 1.0]


# --- the parametric model -------------------------------------------------------


def test_width_and_init_w_are_one_parameter():
    net = NadarayaWatson(parametric=True, kernel="epanechnikov", width=0.5)
    assert net.w.item() == 2.0 and net.width == 0.5 and net.w.requires_grad
    assert list(net.state_dict()) == ["w"]  # checkpoint.load_net rebuilds NW from init_w alone
    assert NadarayaWatson(True, 4.0).width == 0.25 and NadarayaWatson().kernel == "gaussian"


def test_parametric_gradients_are_finite_outside_the_support():
    x, y = torch.tensor([0.0, 0.4, 0.9, 3.0]), torch.tensor([1.0, 2.0, 0.0, 4.0])
    grads = {}
    for name in ("epanechnikov", "boxcar", "constant"):
        net = NadarayaWatson(parametric=True, kernel=name, width=1.0)
        (net(torch.tensor([0.3]), x, y) ** 2).sum().backward()
        grads[name] = net.w.grad.item()
    assert math.isfinite(grads["epanechnikov"]) and grads["epanechnikov"] != 0
    # the boxcar's loss is flat in w almost everywhere, the constant's everywhere: no width to learn
    assert grads["boxcar"] == 0.0 and grads["constant"] == 0.0


# --- user errors ----------------------------------------------------------------


def test_unknown_kernel_lists_the_valid_names():
    for make in (
        lambda: NadarayaWatson(kernel="triangular"),
        lambda: kernel_weights(KEYS, KEYS, "triangular"),
        lambda: nw_evaluation(synthetic_regression(), 1.0, kernels=["triangular"]),
    ):
        with pytest.raises(ValueError, match="triangular") as e:
            make()
        assert all(k in str(e.value) for k in KERNELS)


def test_bad_widths_and_shapes_are_errors():
    with pytest.raises(ValueError, match="width must be > 0"):
        NadarayaWatson(width=0.0)
    with pytest.raises(ValueError, match="not both"):
        NadarayaWatson(init_w=2.0, width=0.5)
    with pytest.raises(ValueError, match="K ≥ 1"):
        kernel_weights(torch.tensor([1.0]), torch.tensor([]))


def test_the_module_rejects_an_unknown_kernel_before_training(monkeypatch):
    from attnlab.lit.regression import RegressionModule

    with pytest.raises(ValueError, match="choose one of gaussian, boxcar, constant, epanechnikov"):
        RegressionModule.from_config(_cfg(monkeypatch, "model.kernels=[gaussian,triangle]"))


# --- evaluation numbers and figures ---------------------------------------------


def test_nw_evaluation_per_kernel_mse_on_d2l_data():
    """Width 1, synthetic_regression(seed=0), trained w = 1 (numbers from this implementation)."""
    s = nw_evaluation(synthetic_regression(seed=0), w=1.0)["scores"]
    assert set(s) == {
        "mse",
        "mse_nonparametric",
        "mse_average_pooling",
        "w",
        "kernel_width",
        "mse_gaussian",
        "mse_boxcar",
        "mse_constant",
        "mse_epanechnikov",
    }
    assert s["mse_gaussian"] == s["mse_nonparametric"] == s["mse"]  # all Gaussian, σ = 1
    assert s["mse_constant"] == pytest.approx(s["mse_average_pooling"], abs=1e-6)
    assert s["mse_gaussian"] == pytest.approx(0.4276, abs=1e-3)
    assert s["mse_boxcar"] == pytest.approx(0.2112, abs=1e-3)
    assert s["mse_constant"] == pytest.approx(0.9050, abs=1e-3)
    assert s["mse_epanechnikov"] == pytest.approx(0.0854, abs=1e-3)


def _cfg(monkeypatch, *overrides):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(
            config_name="config", overrides=["paths.root=/tmp/attnlab-root", "model=nw", *overrides]
        )


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_heatmaps_write_one_figure_per_configured_kernel(monkeypatch, tmp_path):
    from attnlab.lit.regression import RegressionModule

    cfg = _cfg(monkeypatch)
    assert list(cfg.model.kernels) == list(KERNELS) and cfg.model.width == 1.0
    assert cfg.model.task.module == "attnlab.lit.regression.RegressionModule"
    module, _ = RegressionModule.from_config(cfg)
    paths = module.figures(module.net, tmp_path)
    names = {"nw_fit.png", "nw_weights.png", "nw_gaussian_widths.png", *(f"nw_{k}.png" for k in KERNELS)}
    pngs = [p for p in paths if p.suffix == ".png"]
    assert {p.name for p in pngs} == names == {p.name for p in (tmp_path / "attention").iterdir()}
    assert [p for p in paths if p not in pngs] == [tmp_path / "explorer.html"]  # beside attention/
    for p in pngs:
        w, h = _png_size(p)
        assert w >= 500 and h >= 350 and p.stat().st_size > 20_000, (p.name, w, h)


def test_nw_figures_without_kernels_keeps_the_two_d2l_figures(tmp_path):
    d = synthetic_regression(seed=0)
    ev = nw_evaluation(d, 1.0, kernels=[])
    paths = nw_figures(
        d["x_train"], d["y_train"], d["x_test"], d["y_test"], ev["predictions"], ev["weights"], tmp_path
    )
    assert [p.name for p in paths] == ["nw_fit.png", "nw_weights.png"]
