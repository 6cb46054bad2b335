"""Which code produced an output: the project's git commit, and whether the checkout had changes.

The executed tutorials print it beside their running time, so that the site says which commit
its figures and numbers come from.
"""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Iterable
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[3]  # src/attnlab/analysis/ → the project root (editable install)


def git_commit(root: Path | str = PROJECT) -> str:
    """``"<short sha>"``, ``"<short sha> with local changes"`` (tracked files differ from it), or
    ``"unknown (not a git checkout)"`` where ``root`` is not one or git is missing."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{sha} with local changes" if dirty else sha


def append_rows(path: Path | str, columns: list[str], rows: Iterable[dict]) -> None:
    """Append ``rows`` to the results CSV ``path`` (``results/*.csv``, a benchmark's ``--record``),
    writing the header ``columns`` first when the file is new or empty. The header is checked
    before ``rows`` is read (a generator's errors come after it), and every row is built before
    any is written.

    Raises:
        ValueError: the file's header is not ``columns`` (names both).
    """
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f))
        if header != columns:
            raise ValueError(f"{path}: columns {header}, expected {columns}")
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns, lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerows(rows)
