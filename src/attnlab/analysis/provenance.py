"""Which code produced an output: the project's git commit, and whether the checkout had changes.

The executed tutorials print it beside their running time, so that the site says which commit
its figures and numbers come from.
"""

from __future__ import annotations

import subprocess
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
