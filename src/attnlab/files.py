"""Atomic file writes: a temporary file beside the target, then a rename.

A killed process leaves either the old file or the new one, never half of one.
:func:`staged_dir` does for a whole folder what the writers do for a file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def _atomic_file(path: Path, binary: bool):
    """Open a temp file beside ``path``; on success chmod 644 and ``os.replace`` it onto ``path``.
    The temp file is gone afterwards in every case."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.chmod(tmp, 0o644)  # mkstemp makes 0600
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # still there on error


def write_text_atomic(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` (parents created) via temp file + ``os.replace``."""
    path = Path(path)
    with _atomic_file(path, binary=False) as f:
        f.write(text)
    return path


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (parents created) via temp file + ``os.replace``."""
    path = Path(path)
    with _atomic_file(path, binary=True) as f:
        f.write(data)
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


@contextmanager
def staged_dir(out: Path):
    """Build a folder beside ``out`` and put it in the place of ``out`` when done.

    Yields an empty folder (``.<name>.<random>.tmp`` beside ``out``, parents created,
    mode 755) to write into. When the block ends normally, ``out`` (a folder, a link or
    a file, if it exists) is renamed aside, the new folder renamed onto ``out``, and
    only then is the old one deleted (a link is deleted, not what it points to; a folder
    that cannot be deleted stays as ``.<name>.<random>.tmp.old``); should
    the second rename fail, the old one is put back. When the block raises, the new
    folder is deleted and ``out`` is left as it was. A process killed inside the block
    leaves ``out`` as it was, plus the temp folder; one killed in the instant between the
    two renames leaves no ``out`` and the old folder as ``.<name>.<random>.tmp.old``.

    Raises:
        Whatever the block raises; ``OSError`` if ``out`` cannot be replaced (``out`` is
        then as it was).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700
        yield tmp
        old = tmp.with_name(f"{tmp.name}.old") if out.exists() or out.is_symlink() else None
        if old:
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            if old:
                os.rename(old, out)
            raise
        if old and (old.is_symlink() or not old.is_dir()):
            old.unlink(missing_ok=True)
        elif old:  # ``out`` is replaced by now: a leftover old folder is no reason to fail
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


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
                e.errno,
                f"cannot write to output directory {d} ({e.strerror or e}): free disk "
                "space or fix its permissions, or choose another place with paths.root=<dir>",
            ) from None


def rebase(path: str | None, old_dir: str, new_dir: str) -> str | None:
    """``path`` moved with the folder ``old_dir`` to ``new_dir``: ``old_dir`` itself or anything
    under it, with that prefix replaced; ``None`` if ``path`` is not under ``old_dir`` (or is ``None``).

    >>> rebase("/old/proj/checkpoints/best.ckpt", "/old/proj", "/new/proj")
    '/new/proj/checkpoints/best.ckpt'
    >>> rebase("/old/project2/x", "/old/proj", "/new/proj") is None
    True
    """
    old = old_dir.rstrip("/")
    if path is None or not (path == old or path.startswith(old + "/")):
        return None
    return new_dir.rstrip("/") + path[len(old) :]
