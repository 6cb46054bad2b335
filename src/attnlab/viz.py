"""Attention heatmaps as PNG files (matplotlib, Agg backend, no display needed)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def heatmap_grid(weights: torch.Tensor, xlabels: Sequence[str] | None,
                 ylabels: Sequence[str] | None, title: str, path: Path,
                 panel_titles: Sequence[str] | None = None,
                 xlabel: str = "keys", ylabel: str = "queries", vmax: float | None = 1.0) -> Path:
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
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=(1.5 + cols * (K * cell + 0.8), 1 + rows * (Q * cell + 0.8)))
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


def nw_figures(x_train, y_train, x_test, y_test, predictions: dict[str, torch.Tensor],
               weights: torch.Tensor, out_dir: Path) -> list[Path]:
    """D2L 11.2's two figures: the fits (``nw_fit.png``) and the test×train weights (``nw_weights.png``).

    Args:
        x_train, y_train (n,), x_test, y_test (m,): float tensors.
        predictions: name → (m,) predictions on x_test.
        weights: (m, n) attention weights of test queries over training keys.
    """
    out_dir = Path(out_dir)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x_test, y_test, label="truth f(x)")
    for name, pred in predictions.items():
        ax.plot(x_test, pred.detach(), label=name)
    ax.plot(x_train, y_train, "o", alpha=0.5, label="training data")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend()
    ax.set_title("Nadaraya–Watson kernel regression")
    fit = _save(fig, out_dir / "nw_fit.png")
    w = heatmap_grid(weights[None], None, None, "attention weights: test queries × sorted training keys",
                     out_dir / "nw_weights.png", xlabel="training inputs (keys)",
                     ylabel="test inputs (queries)", vmax=None)
    return [fit, w]


def _pieces(tokenizer, ids) -> list[str]:
    return [tokenizer.id_to_piece(int(i)) for i in ids]


@torch.no_grad()
def translation_heatmaps(net, tokenizer, sentences: Sequence[str], out_dir: Path,
                         device="cpu") -> list[Path]:
    """Attention maps of a seq2seq model for ``sentences``, one PNG per (sentence, kind, layer).

    Each sentence is greedy-decoded, then run once more teacher-forced on its own
    output with weights recorded (identical to the weights seen while decoding,
    by causality). Kinds: ``alignment`` (Bahdanau: target × source);
    ``encoder_self``, ``decoder_self``, ``encoder_decoder`` (Transformer), heads
    as panels. Axis labels are sentencepiece tokens.
    """
    from attnlab.data.tokenizer import BOS_ID, EOS_ID
    from attnlab.decoding import encode_sources, translate

    was_training = net.training
    net.eval()
    outputs = translate(net.init_state, net.step, tokenizer, sentences, device=device)
    paths = []
    for i, (sentence, out_ids) in enumerate(zip(sentences, outputs)):
        src, valid = encode_sources(tokenizer, [sentence])
        tgt_in = torch.tensor([[BOS_ID] + out_ids], dtype=torch.long)
        maps = net.attention_maps(src.to(device), valid.to(device), tgt_in.to(device))
        src_labels = _pieces(tokenizer, src[0])
        out_labels = _pieces(tokenizer, out_ids + [EOS_ID])
        in_labels = _pieces(tokenizer, tgt_in[0])
        axes = {"encoder_self": (src_labels, src_labels, "source (keys)", "source (queries)"),
                "decoder_self": (in_labels, out_labels, "target prefix (keys)", "target (queries)"),
                "encoder_decoder": (src_labels, out_labels, "source (keys)", "target (queries)"),
                "alignment": (src_labels, out_labels, "source (keys)", "target (queries)")}
        for kind, layers in maps.items():
            xl, yl, xn, yn = axes[kind]
            for layer, w in enumerate(layers, 1):  # w: (1, H, Q, K)
                H = w.shape[1]
                paths.append(heatmap_grid(
                    w[0], xl, yl, f"{kind} layer {layer}: {sentence!r} → {tokenizer.decode(out_ids)!r}",
                    Path(out_dir) / f"sent{i}_{kind}_layer{layer}.png",
                    panel_titles=[f"head {h + 1}" for h in range(H)] if H > 1 else None,
                    xlabel=xn, ylabel=yn))
    net.train(was_training)
    return paths
