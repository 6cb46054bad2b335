"""Atomic file writes: a temporary file beside the target, then a rename.

A killed process leaves either the old file or the new one, never half of one.
:func:`write_json_exclusive` creates a file only if it does not exist yet (one of
several racing processes wins); :func:`staged_dir` does for a whole folder what
the writers do for a file.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def _atomic_file(path: Path, binary: bool, place=os.replace):
    """Open a temp file beside ``path``; on success chmod 644 and ``place(tmp, path)``
    (by default ``os.replace``). The temp file is gone afterwards in every case."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.chmod(tmp, 0o644)  # mkstemp makes 0600
        place(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # still there on error, or after a hard link


def write_text_atomic(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` (parents created) via temp file + ``os.replace``."""
    path = Path(path)
    with _atomic_file(path, binary=False) as f:
        f.write(text)
    return path


def write_lines_atomic(path: Path, lines) -> Path:
    """One line per item, each ending in a newline."""
    return write_text_atomic(path, "".join(line + "\n" for line in lines))


def _json_text(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: Path, obj) -> Path:
    """``obj`` as indented, key-sorted JSON."""
    return write_text_atomic(path, _json_text(obj))


def _create_from(tmp: str, path: Path) -> bool:
    """Make ``path`` a copy of the finished file ``tmp`` unless ``path`` exists; whether
    this call created it.

    A hard link: ``os.link`` fails with ``FileExistsError`` when ``path`` exists, and
    ``path`` appears with all its content at once. Where the file system has no hard
    links (``os.link`` raises another ``OSError``, e.g. ``EPERM`` or ``ENOTSUP`` on some
    FUSE, SMB or FAT mounts), ``os.open(O_CREAT | O_EXCL)`` + write + fsync instead.
    That still lets exactly one caller create ``path``, but weaker: ``path`` exists,
    empty or partly written, until the write ends, so a reader racing the creator
    can see a short file, and a crash mid-write leaves one.
    """
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        pass  # no hard links here: the fallback below
    data = Path(tmp).read_bytes()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # as the hard-linked file; os.open's mode is masked by umask
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)  # ours: no half-written file stays
        raise
    return True


def write_json_exclusive(path: Path, obj) -> bool:
    """Create ``path`` (parents created) holding ``obj`` as :func:`write_json_atomic`
    writes it, unless ``path`` exists; ``path`` is then left as it is.

    Safe for racing processes: exactly one of them creates the file, and on file systems
    with hard links its content is complete before the file is visible (else see
    :func:`_create_from` for the fallback's weaker guarantee).

    Returns:
        ``True`` if this call created ``path``, ``False`` if it existed.
    Raises:
        OSError: the folder cannot be written (no file is left behind).
    """
    created = False

    def place(tmp: str, dest: Path) -> None:
        nonlocal created
        created = _create_from(tmp, dest)

    with _atomic_file(Path(path), binary=False, place=place) as f:
        f.write(_json_text(obj))
    return created


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
                e.errno, f"cannot write to output directory {d} ({e.strerror or e}): free disk "
                "space or fix its permissions, or choose another place with paths.root=<dir>") from None
