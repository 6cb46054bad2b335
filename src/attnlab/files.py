"""Atomic file writes: a temporary file beside the target, flushed to disk, then a rename.

A killed process, a full disk or any other failed write leaves either the old file or the
new one, never half of one; a failed write is a :class:`FileWriteError` naming the file and
the cause. :func:`staged_dir` does for a whole folder what the writers do for a file, and
removes the staging folders of its own killed runs when it starts. Every file the project
writes for later goes through these (Lightning's checkpoints too:
:class:`attnlab.lit.checkpoints.AtomicCheckpointIO`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

from attnlab.errors import UserError

log = logging.getLogger(__name__)


class FileWriteError(UserError, OSError):
    """A file could not be written (a full disk, a quota, permissions): names the file, the
    cause and the fix; the file at that path is as it was. ``errno``, ``strerror`` and
    ``filename`` are the failed write's; ``str()`` is the message alone."""

    def __str__(self) -> str:
        return str(self.args[0])


# What a failed write's errno means for the user, when it is about room on the disk.
NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file would be larger than the system allows this process",
}


def write_error(path: Path, e: OSError) -> FileWriteError:
    """The :class:`FileWriteError` for ``e``, raised while ``path`` was written atomically."""
    path = Path(path)
    before = "it is as it was" if path.exists() else "no file was left there"
    cause = f"{e.strerror or e}" + (f": {NO_ROOM[e.errno]}" if e.errno in NO_ROOM else "")
    fix = (
        f"free space on the disk that holds {path.parent} (`df -h {path.parent}`)"
        if e.errno in NO_ROOM
        else f"check that {path.parent} is writable"
    )
    err = FileWriteError(f"could not write {path} ({cause}); {before}. To go on, {fix}")
    err.errno, err.strerror, err.filename = e.errno, e.strerror, str(path)
    return err


def _fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries (a rename in it) to disk; a filesystem that cannot is skipped."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # EINVAL: this filesystem does not sync folders
        pass
    finally:
        os.close(fd)


@contextmanager
def _atomic_file(path: Path, binary: bool):
    """Open a temp file beside ``path``; on success flush it to disk, chmod 644 and
    ``os.replace`` it onto ``path`` (and flush the folder). The temp file is gone afterwards
    in every case.

    Raises:
        FileWriteError: the temp file could not be created, written or renamed, an
            ``OSError`` of the block's writes included (``path`` unchanged).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(path)  # the temp files of writers of ``path`` killed before
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise write_error(path, e) from e
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash leaves the old file or this one
        os.chmod(tmp, 0o644)  # mkstemp makes 0600
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)  # first: what it took of a full disk is free again
        raise write_error(path, e) from e
    finally:
        Path(tmp).unlink(missing_ok=True)  # still there on error
    _fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` (parents created) via temp file + ``os.replace``.

    Raises:
        FileWriteError: as every writer here: the disk is full, … (``path`` unchanged).
    """
    path = Path(path)
    with _atomic_file(path, binary=False) as f:
        f.write(text)
    return path


def write_bytes_atomic(path: Path, data: bytes | memoryview) -> Path:
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


def temp_prefix(out: Path) -> str:
    """The start of the name of a temp file or staging folder of ``out``: it names this
    process and host, so a later run knows whether its writer is gone."""
    return f".{out.name}.attnlab-{os.getpid()}@{socket.gethostname()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_staging(out: Path, suffix: str = ".tmp") -> list[Path]:
    """Remove the temp files and staging folders of ``out`` that writers killed on this host
    left (their process is gone); other files, and those of live or other hosts' runs, stay.

    A killed run's ``….tmp`` file (an atomic writer's; ``suffix``: a download's ``.part``) or
    folder (:func:`staged_dir`'s) is deleted. Its ``….tmp.old`` folder (killed between the two
    renames) is the previous ``out``: put back when ``out`` is missing, else deleted. Each is
    logged. Returns the paths removed or put back.
    """
    out = Path(out)
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.attnlab-(\d+)@(.+)\.[^.]+{re.escape(suffix)}(\.old)?$")
    host, done = socket.gethostname(), []
    if not out.parent.is_dir():
        return done
    for path in sorted(out.parent.iterdir(), key=lambda p: p.name.endswith(".old")):  # .tmp first
        m = pattern.match(path.name)
        if not m or m[2] != host or _alive(int(m[1])):
            continue
        if not path.is_dir():  # a writer's temp file: never the only copy of anything
            if not m[3] and not path.is_symlink():
                path.unlink(missing_ok=True)
                log.warning("removed %s, left by a killed run (pid %s)", path, m[1])
                done.append(path)
            continue
        if m[3] and not (out.exists() or out.is_symlink()):
            os.rename(path, out)
            log.warning("put back %s from %s, where a killed run (pid %s) had moved it", out, path, m[1])
        else:
            shutil.rmtree(path, ignore_errors=True)
            log.warning("removed %s, left by a killed run (pid %s)", path, m[1])
        done.append(path)
    return done


def _fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` and every folder's entries to disk (links not followed)."""
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))


@contextmanager
def staged_dir(out: Path):
    """Build a folder beside ``out`` and put it in the place of ``out`` when done.

    Yields an empty folder (``.<name>.attnlab-<pid>@<host>.<random>.tmp`` beside ``out``,
    parents created, mode 755) to write into, after :func:`remove_stale_staging`. When the
    block ends normally, ``out`` (a folder, a link or a file, if it exists) is renamed aside,
    the new folder renamed onto ``out``, and only then is the old one deleted (a link is
    deleted, not what it points to; a folder that cannot be deleted stays as ``….tmp.old``);
    should the second rename fail, the old one is put back. When the block raises, the new
    folder is deleted and ``out`` is left as it was. A process killed inside the block
    leaves ``out`` as it was, plus the temp folder; one killed in the instant between the
    two renames leaves no ``out`` and the old folder as ``….tmp.old``. The next
    ``staged_dir`` of ``out`` removes the first and puts the second back.

    Every file and folder of the new folder is flushed to disk before the renames, so a
    crash after them cannot leave empty or short files in ``out``.

    Raises:
        Whatever the block raises, except that running out of room (a full disk or quota:
        ``ENOSPC``, ``EDQUOT``, ``EFBIG``) is a :class:`FileWriteError` naming ``out``;
        ``OSError`` if ``out`` cannot be replaced (``out`` is then as it was).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), suffix=".tmp", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700
        try:
            yield tmp
            _fsync_tree(tmp)
        except OSError as e:
            if e.errno not in NO_ROOM:
                raise  # (an inner writer's FileWriteError named a file of the staging folder)
            shutil.rmtree(tmp, ignore_errors=True)  # first: what it took of a full disk is free again
            raise write_error(out, e) from e
        old = tmp.with_name(f"{tmp.name}.old") if out.exists() or out.is_symlink() else None
        if old:
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            if old:
                os.rename(old, out)
            raise
        _fsync_dir(out.parent)
        if old and (old.is_symlink() or not old.is_dir()):
            old.unlink(missing_ok=True)
        elif old:  # ``out`` is replaced by now: a leftover old folder is no reason to fail
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


class OutputDirError(UserError, OSError):
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
