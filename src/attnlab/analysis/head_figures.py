"""Figures of head importance (Michel et al. 2019): a layers × heads map per attention kind and
the score as heads are pruned (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from attnlab.analysis.viz import save_figure


def importance_map(grid: dict[str, list[list[float]]], path: Path, score_name: str = "BLEU") -> Path:
    """One panel per kind: the importance (``score_name`` lost when the head alone is masked) of
    each layer (rows, from 1) and head (columns, from 1), the value written in each cell.

    Args:
        grid: kind → (layers × heads) importances (:func:`attnlab.analysis.heads.importance_grid`).
    Returns:
        ``path``, the PNG written.
    """
    kinds = list(grid)
    top = max(abs(v) for g in grid.values() for row in g for v in row) or 1.0
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        g = grid[kind]
        image = ax.imshow(g, cmap="RdBu_r", vmin=-top, vmax=top)
        ax.set_title(kind.replace("_", " "))
        ax.set_xticks(range(len(g[0])), [str(h) for h in range(1, len(g[0]) + 1)])
        ax.set_yticks(range(len(g)), [str(layer) for layer in range(1, len(g) + 1)])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        for i, row in enumerate(g):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), label=f"{score_name} lost when masked alone")
    fig.suptitle(f"Head importance: {score_name} lost when one head is masked")
    return save_figure(fig, path, dpi=110)


def pruning_curve(pruning: list[dict], path: Path, score_name: str = "BLEU") -> Path:
    """``score_name`` against the number of heads pruned, least important first."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot([p["pruned"] for p in pruning], [p["score"] for p in pruning], marker="o")
    ax.set_xlabel("heads pruned (least important first)")
    ax.set_ylabel(score_name)
    ax.set_title(f"{score_name} as heads are pruned")
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=110)
