"""Attention heatmaps as PNG files (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from attnlab.files import write_bytes_atomic


def save_figure(fig, path: Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (parents created; the format from its suffix, e.g. ``.png``)
    whole or not at all (:func:`attnlab.files.write_bytes_atomic`), and close it.

    Raises:
        attnlab.files.FileWriteError: the file cannot be written (``path`` unchanged).
    """
    path = Path(path)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format=path.suffix.lstrip(".") or "png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return write_bytes_atomic(path, buffer.getbuffer())


def _save(fig, path: Path) -> Path:
    return save_figure(fig, path, dpi=100)


def heatmap_grid(
    weights: torch.Tensor,
    xlabels: Sequence[str] | None,
    ylabels: Sequence[str] | None,
    title: str,
    path: Path,
    panel_titles: Sequence[str] | None = None,
    xlabel: str = "keys",
    ylabel: str = "queries",
    vmax: float | None = 1.0,
) -> Path:
    """One PNG with a heatmap per panel (e.g. per head) and a shared colour bar.

    Args:
        weights: (P, Q, K) float, P panels of Q×K attention weights in [0, 1].
        xlabels: K key labels (tokens) or None; ylabels: Q query labels or None.
        title: figure title (e.g. the sentence); path: output .png.
        vmax: top of the colour scale (1.0 to compare maps; None to fit the data).
    Returns the path written.
    """
    weights = weights.detach().float().cpu()
    P, Q, K = weights.shape
    cols = math.ceil(math.sqrt(P))
    rows = math.ceil(P / cols)
    cell = max(0.25, min(0.45, 8 / max(Q, K))) if xlabels is not None else 0.12  # inches
    fig, axes = plt.subplots(
        rows,
        cols,
        squeeze=False,
        layout="constrained",
        figsize=(1.5 + cols * (K * cell + 0.8), 1 + rows * (Q * cell + 0.8)),
    )
    im = None
    for p, ax in enumerate(axes.flat):
        if p >= P:
            ax.axis("off")
            continue
        im = ax.imshow(weights[p].numpy(), cmap="Reds", vmin=0.0, vmax=vmax, aspect="auto")
        if xlabels is not None:
            ax.set_xticks(range(K), xlabels, rotation=90, fontsize=7)
        if ylabels is not None:
            ax.set_yticks(range(Q), ylabels, fontsize=7)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        if panel_titles:
            ax.set_title(panel_titles[p], fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
    return _save(fig, path)


_KERNEL_TITLES = {"gaussian": "Gaussian", "epanechnikov": "Epanechnikov"}


def _index_ticks(set_ticks, x: torch.Tensor) -> None:
    """Label an index axis of a heatmap with x values: ticks at the entries nearest to round x."""
    x = x.detach().float().cpu()
    nice = torch.arange(math.floor(x.min()), math.ceil(x.max()) + 1, dtype=torch.float32)
    idx = sorted({int((x - v).abs().argmin()) for v in nice})
    set_ticks(idx, [f"{float(x[i]):.1f}" for i in idx])


def _nw_fit_axes(
    ax, x_train, y_train, x_test, y_test, predictions: dict[str, torch.Tensor], title: str
) -> None:
    """Truth, predictions and training points on one axes (the fit plot of D2L 11.2 (zh 10.2))."""
    ax.plot(x_test, y_test, "k--", lw=1.2, label="truth f(x)")
    for name, pred in predictions.items():
        ax.plot(x_test, pred.detach(), lw=1.8, label=name)
    ax.plot(x_train, y_train, "o", ms=4, alpha=0.4, color="tab:gray", label="training data")
    ax.set_xlabel("x (test queries)")
    ax.set_ylabel("y")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")


def _nw_weights_axes(
    fig, ax, x_train, x_test, weights: torch.Tensor, title: str, vmax: float | None = None
) -> None:
    """The (m, n) weights of test queries over sorted training keys, ticks in x units."""
    im = ax.imshow(
        weights.detach().float().cpu().numpy(),
        cmap="Reds",
        vmin=0.0,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
    )
    _index_ticks(ax.set_xticks, x_train)
    _index_ticks(ax.set_yticks, x_test)
    ax.set_xlabel("training input $x_i$ (keys, sorted)")
    ax.set_ylabel("test input $x$ (queries)")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.9, label=r"attention weight $\alpha_i(x)$")


def _mse(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(((pred.detach() - y) ** 2).mean())


def nw_kernel_figure(
    x_train,
    y_train,
    x_test,
    y_test,
    prediction: torch.Tensor,
    weights: torch.Tensor,
    kernel: str,
    width: float,
    path: Path,
    vmax: float | None = None,
) -> Path:
    """One PNG for one kernel (D2L 11.2.2 (zh 10.2.3)): the fit (left) and its test × train weights (right).

    Args:
        x_train, y_train (n,), x_test, y_test (m,): float tensors, x_train sorted.
        prediction: (m,) float, the kernel's prediction on x_test; weights: (m, n) float.
        kernel: its name, width: its σ (for the titles); path: output .png.
        vmax: top of the colour scale (None: the largest weight), to compare kernels.
    Returns the path written.
    """
    fig, (ax_fit, ax_w) = plt.subplots(
        1, 2, figsize=(11, 4.2), layout="constrained", gridspec_kw={"width_ratios": [1.15, 1]}
    )
    name = _KERNEL_TITLES.get(kernel, kernel)
    _nw_fit_axes(
        ax_fit,
        x_train,
        y_train,
        x_test,
        y_test,
        {f"{name} kernel": prediction},
        f"fit: test MSE {_mse(prediction, y_test):.3f}",
    )
    shared = "" if vmax is None else " (colour scale shared by all kernels)"
    _nw_weights_axes(fig, ax_w, x_train, x_test, weights, f"attention weights{shared}", vmax)
    fig.suptitle(f"Nadaraya–Watson regression, {name} kernel, width σ = {width:g}", fontsize=11)
    return _save(fig, path)


def nw_width_figure(
    x_train, y_train, x_test, y_test, fits: dict[float, dict[str, torch.Tensor]], kernel: str, path: Path
) -> Path:
    """The width sweep of D2L 11.2.3 (zh 10.2.4): fits (top row) and weights (bottom row), one column per σ.

    Args:
        fits: σ → {"prediction": (m,), "weights": (m, n)} float tensors.
        kernel: name for the title; path: output .png.
    Returns the path written.
    """
    cols = len(fits)
    fig, axes = plt.subplots(2, cols, squeeze=False, figsize=(4 * cols, 7), layout="constrained")
    for c, (sigma, fit) in enumerate(fits.items()):
        _nw_fit_axes(
            axes[0, c],
            x_train,
            y_train,
            x_test,
            y_test,
            {f"σ = {sigma:g}": fit["prediction"]},
            f"σ = {sigma:g}: test MSE {_mse(fit['prediction'], y_test):.3f}",
        )
        _nw_weights_axes(fig, axes[1, c], x_train, x_test, fit["weights"], f"weights, σ = {sigma:g}")
    fig.suptitle(
        f"Nadaraya–Watson regression, {_KERNEL_TITLES.get(kernel, kernel)} kernel: "
        "the narrower the width σ, the more local the attention",
        fontsize=11,
    )
    return _save(fig, path)


def nw_figures(
    x_train,
    y_train,
    x_test,
    y_test,
    predictions: dict[str, torch.Tensor],
    weights: torch.Tensor,
    out_dir: Path,
    kernels: dict[str, dict[str, torch.Tensor]] | None = None,
    width: float = 1.0,
    width_sweep: dict[float, dict[str, torch.Tensor]] | None = None,
    trained_w: float | None = None,
) -> list[Path]:
    """The figures of D2L 11.2 (zh 10.2) as PNGs in ``out_dir``; returns the paths written.

    * ``nw_fit.png``: truth, training data and ``predictions`` (average pooling,
      non-parametric and trained parametric model);
    * ``nw_weights.png``: the trained model's test × train weights;
    * ``nw_<kernel>.png`` per entry of ``kernels`` (:func:`nw_kernel_figure`, width σ = ``width``),
      all on one colour scale so the kernels compare;
    * ``nw_gaussian_widths.png`` when ``width_sweep`` is given (:func:`nw_width_figure`).

    Args:
        x_train, y_train (n,), x_test, y_test (m,): float tensors, x_train sorted.
        predictions: label → (m,) predictions on x_test.
        weights: (m, n) attention weights of the trained model, test queries × training keys.
        kernels: kernel → {"prediction": (m,), "weights": (m, n)}, as ``nw_evaluation`` returns.
        width_sweep: σ → the same, for the Gaussian.
        trained_w: the trained model's w = 1/σ, for the weights' title.
    """
    out_dir = Path(out_dir)
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    _nw_fit_axes(
        ax,
        x_train,
        y_train,
        x_test,
        y_test,
        predictions,
        "Nadaraya–Watson kernel regression vs. average pooling",
    )
    paths = [_save(fig, out_dir / "nw_fit.png")]
    fig, ax = plt.subplots(figsize=(5.8, 4.6), layout="constrained")
    learned = ""
    if trained_w is not None:
        sigma = 1 / abs(trained_w) if trained_w else math.inf
        learned = f" (learned w = {trained_w:.2f}, σ = {sigma:.2f})"
    _nw_weights_axes(
        fig, ax, x_train, x_test, weights, f"trained parametric Gaussian model{learned}:\nattention weights"
    )
    paths.append(_save(fig, out_dir / "nw_weights.png"))
    kernels = kernels or {}
    vmax = max((float(f["weights"].max()) for f in kernels.values()), default=None)
    for kernel, fit in kernels.items():
        paths.append(
            nw_kernel_figure(
                x_train,
                y_train,
                x_test,
                y_test,
                fit["prediction"],
                fit["weights"],
                kernel,
                width,
                out_dir / f"nw_{kernel}.png",
                vmax,
            )
        )
    if width_sweep:
        paths.append(
            nw_width_figure(
                x_train, y_train, x_test, y_test, width_sweep, "gaussian", out_dir / "nw_gaussian_widths.png"
            )
        )
    return paths


def _pieces(tokenizer, ids, source: bool = False) -> list[str]:
    """Token strings of ``ids``; source ids in the source vocabulary (the joint one for sentencepiece)."""
    to_piece = tokenizer.source_id_to_piece if source else tokenizer.id_to_piece
    return [to_piece(int(i)) for i in ids]


@dataclass(frozen=True)
class KindMaps:
    """One attention kind of one sentence: its weights in every layer and the tokens on its axes.

    Attributes:
        kind: ``encoder_self``, ``decoder_self``, ``encoder_decoder`` (Transformer) or
            ``alignment`` (Bahdanau).
        layers: one (H, Q, K) float32 CPU tensor per layer (H heads, 1 for Bahdanau; Q queries;
            K keys); each row sums to 1 over the keys.
        keys: the K key tokens; queries: the Q query tokens (sentencepiece pieces).
        key_axis, query_axis: axis titles, e.g. ``"source (keys)"``, ``"target (queries)"``.
    """

    kind: str
    layers: list[torch.Tensor]
    keys: list[str]
    queries: list[str]
    key_axis: str
    query_axis: str


@dataclass(frozen=True)
class SentenceMaps:
    """The attention maps of one source sentence and its greedy translation.

    Attributes:
        sentence: the source text; translation: the detokenized greedy output.
        kinds: kind → :class:`KindMaps`, every kind the model has, in the model's order.
    """

    sentence: str
    translation: str
    kinds: dict[str, KindMaps]


KIND_AXES = {  # kind → (key tokens, query tokens, key axis title, query axis title)
    "encoder_self": ("source", "source", "source (keys)", "source (queries)"),
    "decoder_self": ("target_in", "target_out", "target prefix (keys)", "target (queries)"),
    "encoder_decoder": ("source", "target_out", "source (keys)", "target (queries)"),
    "alignment": ("source", "target_out", "source (keys)", "target (queries)"),
}


@torch.no_grad()
def collect_translation_maps(net, tokenizer, sentences: Sequence[str], device="cpu") -> list[SentenceMaps]:
    """The attention weights and token labels of a seq2seq model for ``sentences`` (no drawing).

    Each sentence is greedy-decoded, then run once more teacher-forced on its own output
    (``<bos>`` + output ids) with weights recorded by ``net.attention_maps``: identical to
    the weights seen while decoding, by causality. Source tokens include the ``<eos>`` (and any
    padding) the tokenizer's ``encode_sources`` adds; query rows are the output tokens + ``<eos>``.
    ``net`` is put in eval mode while collecting and back in its mode afterwards.

    Args:
        net: a model with ``init_state``, ``step`` and ``attention_maps(src, valid, tgt_in)``
            (``attnlab.models``); tokenizer: its tokenizer (``encode_sources``, ``decode``,
            ``id_to_piece``, ``source_id_to_piece``); sentences: source texts.
        device: where ``net`` is.
    Returns:
        One :class:`SentenceMaps` per sentence, in order.
    Raises:
        KeyError: ``net.attention_maps`` returned a kind that is not in :data:`KIND_AXES`.
    """
    from attnlab.data.tokenizer import BOS_ID, EOS_ID
    from attnlab.inference.decoding import translate

    was_training = net.training
    net.eval()
    outputs = translate(net.init_state, net.step, tokenizer, sentences, device=device)
    collected = []
    for sentence, out_ids in zip(sentences, outputs):
        src, valid = tokenizer.encode_sources([sentence])
        tgt_in = torch.tensor([[BOS_ID] + out_ids], dtype=torch.long)
        maps = net.attention_maps(src.to(device), valid.to(device), tgt_in.to(device))
        tokens = {
            "source": _pieces(tokenizer, src[0], source=True),
            "target_out": _pieces(tokenizer, out_ids + [EOS_ID]),
            "target_in": _pieces(tokenizer, tgt_in[0]),
        }
        kinds = {}
        for kind, layers in maps.items():
            keys, queries, key_axis, query_axis = KIND_AXES[kind]
            kinds[kind] = KindMaps(
                kind,
                [w[0].detach().float().cpu() for w in layers],  # (H, Q, K)
                tokens[keys],
                tokens[queries],
                key_axis,
                query_axis,
            )
        collected.append(SentenceMaps(sentence, tokenizer.decode(out_ids), kinds))
    net.train(was_training)
    return collected


def draw_translation_maps(
    collected: Sequence[SentenceMaps],
    out_dir: Path,
    kinds: Sequence[str] | None = None,
    title_prefix: str = "",
) -> list[Path]:
    """One PNG per (sentence, kind, layer) of ``collected`` (:func:`collect_translation_maps`),
    heads as panels, named ``sent<i>_<kind>_layer<l>.png`` (``i`` the sentence's position,
    ``l`` 1-based) in ``out_dir``; returns their paths.

    ``kinds`` keeps only those kinds (``None``: all); a kind a sentence does not have is
    skipped. ``title_prefix`` (e.g. ``"epoch 3, "``) starts every title.
    """
    paths = []
    for i, maps in enumerate(collected):
        for kind, km in maps.kinds.items():
            if kinds is not None and kind not in kinds:
                continue
            for layer, w in enumerate(km.layers, 1):  # w: (H, Q, K)
                H = w.shape[0]
                paths.append(
                    heatmap_grid(
                        w,
                        km.keys,
                        km.queries,
                        f"{title_prefix}{kind} layer {layer}: {maps.sentence!r} → {maps.translation!r}",
                        Path(out_dir) / f"sent{i}_{kind}_layer{layer}.png",
                        panel_titles=[f"head {h + 1}" for h in range(H)] if H > 1 else None,
                        xlabel=km.key_axis,
                        ylabel=km.query_axis,
                    )
                )
    return paths


def translation_heatmaps(
    net,
    tokenizer,
    sentences: Sequence[str],
    out_dir: Path,
    device="cpu",
    kinds: Sequence[str] | None = None,
    title_prefix: str = "",
) -> list[Path]:
    """Attention maps of a seq2seq model for ``sentences``, one PNG per (sentence, kind, layer):
    :func:`collect_translation_maps` then :func:`draw_translation_maps`.

    Kinds: ``alignment`` (Bahdanau: target × source); ``encoder_self``, ``decoder_self``,
    ``encoder_decoder`` (Transformer), heads as panels. Axis labels are sentencepiece tokens.
    ``kinds`` keeps only those kinds (``None``: all); a kind the model does not have is skipped.
    Files are named ``sent<i>_<kind>_layer<l>.png``; returns their paths. ``title_prefix``
    (e.g. ``"epoch 3, "``) starts every title.
    """
    return draw_translation_maps(
        collect_translation_maps(net, tokenizer, sentences, device), out_dir, kinds, title_prefix
    )
