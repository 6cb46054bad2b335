"""Atomic file writes: a temporary file beside the target, then a rename.

A killed process leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def _atomic_file(path: Path, binary: bool):
    """Open a temp file beside ``path``; on success chmod 644 and rename it onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.chmod(tmp, 0o644)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` (parents created) via temp file + ``os.replace``."""
    path = Path(path)
    with _atomic_file(path, binary=False) as f:
        f.write(text)
    return path


def write_lines_atomic(path: Path, lines) -> Path:
    """One line per item, each ending in a newline."""
    return write_text_atomic(path, "".join(line + "\n" for line in lines))


def write_json_atomic(path: Path, obj) -> Path:
    """``obj`` as indented, key-sorted JSON."""
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_npz_atomic(path: Path, **arrays) -> Path:
    """NumPy arrays as an uncompressed ``.npz`` (``np.savez``), via temp file + ``os.replace``."""
    import numpy as np

    path = Path(path)
    with _atomic_file(path, binary=True) as f:
        np.savez(f, **arrays)
    return path


class OutputDirError(OSError):
    """An output directory cannot be created or written (permissions, full disk, a file in the way)."""


def ensure_writable(*dirs: Path) -> None:
    """Create each directory if needed and prove it takes a file (written, flushed, removed).

    Call before long work, so a run fails in its first second rather than after hours.

    Raises:
        OutputDirError: names the directory, the OS error and the fix; nothing is changed
            in a directory that exists.
    """
    for d in map(Path, dirs):
        try:
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=d) as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise OutputDirError(
                e.errno, f"cannot write to output directory {d} ({e.strerror or e}): free disk "
                "space or fix its permissions, or choose another place with paths.root=<dir>") from None
