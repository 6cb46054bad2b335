"""The numbers the console shows for a training epoch, and how it writes them.

Shared by :mod:`attnlab.console.summaries` and :mod:`attnlab.console.runs` (the
end-of-training summary) and :mod:`attnlab.lit.progress` (a line per epoch). It imports
nothing, so they can all use it without importing each other, and the stages that never
train stay free of Lightning.
"""

from __future__ import annotations

# (logged metric, label, format): the numbers of an epoch line, as MLflow has them.
EPOCH_COLUMNS = (
    ("train_loss", "train_loss", ".4f"),
    ("val_loss", "val_loss", ".4f"),
    ("val_bleu", "val_bleu", ".2f"),
    ("val_chrf", "val_chrf", ".2f"),
    ("tokens_per_sec", "tokens/s", ".0f"),
)
# The columns a validation run logs (an epoch without validation has none of them).
VAL_KEYS = ("val_loss", "val_bleu", "val_chrf")


def as_float(v) -> float:
    """A logged value (a tensor of one element, or a number) as a Python float."""
    return float(v.item() if hasattr(v, "item") else v)


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``counted(3, "epoch") == "3 epochs"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
