"""Draw the ablations' training curves for the results page at build time (mkdocs-gen-files).

From results/ablation_history.csv and results/runs.csv (scripts/results_tables.py reads the same
files and links the figures from docs/results/index.md): per epoch, the validation loss and the
mean attention entropy of each Transformer switch (results/ablation_curves_transformer.png) and of
each Bahdanau switch and the seq2seq model (results/ablation_curves_bahdanau.png). Run it alone
to write the two PNGs into a folder: ``python docs/gen_results_figures.py OUT_DIR``.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {  # file → (models, the entropy column drawn on the right, its label)
    "ablation_curves_transformer.png": (("transformer",), "entropy_encoder_self", "encoder self-attention"),
    "ablation_curves_bahdanau.png": (("bahdanau", "seq2seq"), "entropy_alignment", "alignment"),
}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _label(run: dict[str, str]) -> str:
    if run["profile"] == "ablation":
        return run["recipe"].partition("+")[2]
    return f"default ({run['model']})"


def figures(root: Path = ROOT) -> dict[str, bytes]:
    """PNG bytes of each figure of :data:`FIGURES` ({} without results/ablation_history.csv)."""
    path = root / "results" / "ablation_history.csv"
    if not path.exists():
        return {}
    history = _rows(path)
    runs = {r["mlflow_run_id"]: r for r in _rows(root / "results" / "runs.csv") if r["mlflow_run_id"]}
    out = {}
    for name, (models, entropy, kind) in FIGURES.items():
        fig, (loss_ax, ent_ax) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
        for run_id in dict.fromkeys(h["mlflow_run_id"] for h in history if h["model"] in models):
            rows = sorted((h for h in history if h["mlflow_run_id"] == run_id), key=lambda h: int(h["epoch"]))
            epochs = [int(h["epoch"]) for h in rows]
            label = _label(runs[run_id])
            style = {"color": "black", "linewidth": 2.5} if runs[run_id]["profile"] != "ablation" else {}
            loss_ax.plot(epochs, [float(h["val_loss"]) for h in rows], marker="o", label=label, **style)
            if all(h[entropy] for h in rows):
                ent_ax.plot(epochs, [float(h[entropy]) for h in rows], marker="o", label=label, **style)
        loss_ax.set(xlabel="epoch", ylabel="validation loss (cross-entropy)", title="validation loss")
        ent_ax.set(
            xlabel="epoch", ylabel="mean entropy (nats)", title=f"{kind} entropy (lower: nearer one-hot)"
        )
        ent_ax.set_ylim(bottom=0)
        for ax in (loss_ax, ent_ax):
            ax.xaxis.get_major_locator().set_params(integer=True)
        loss_ax.legend(fontsize=7)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
        plt.close(fig)
        out[name] = buffer.getvalue()
    return out


def _build() -> None:
    import mkdocs_gen_files

    for name, png in figures().items():
        with mkdocs_gen_files.open(f"results/{name}", "wb") as f:
            f.write(png)


if __name__ == "__main__":  # by hand: write the PNGs into a folder
    for name, png in figures().items():
        (Path(sys.argv[1]) / name).write_bytes(png)
        print(Path(sys.argv[1]) / name)
elif __name__ == "<run_path>":  # mkdocs-gen-files runs its scripts with runpy.run_path
    _build()
