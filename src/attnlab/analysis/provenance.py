"""Which code produced an output: the project's git commit, and whether the checkout had changes.

The executed tutorials print it beside their running time, so that the site says which commit
its figures and numbers come from.
"""

from __future__ import annotations

import csv
import io
import subprocess
from collections.abc import Iterable
from pathlib import Path

from attnlab.files import write_text_atomic

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

    The file is rewritten whole (its rows, then the new ones) and renamed into place
    (:func:`attnlab.files.write_text_atomic`): a full disk leaves it as it was, never a
    half-written row.

    Raises:
        ValueError: the file's header is not ``columns`` (names both).
        attnlab.files.FileWriteError: the file cannot be written (it is as it was).
    """
    path = Path(path)
    old = path.read_bytes().decode("utf-8") if path.exists() else ""
    if old:
        header = next(csv.reader(io.StringIO(old)))
        if header != columns:
            raise ValueError(f"{path}: columns {header}, expected {columns}")
    rows = list(rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    if not old:
        writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, old + ("" if not old or old.endswith("\n") else "\n") + out.getvalue())
