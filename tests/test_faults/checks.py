"""What "whole" means for each kind of file the project writes, and the invariants a fault must keep.

:func:`whole` loads a file the way its reader does (a checkpoint with ``torch.load``, a
program's zip directory and CRCs, an array with ``np.load``, the store with SQLite's own check,
…). :func:`manifest` is a project's files and their digests; :func:`kept_whole` compares
one from before a fault with the project after it; :func:`strays` names temporary and staging
files; :func:`pending_models` the MLflow logged models left unfinished.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import hashlib
import json
import re
import shutil
import sqlite3
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from test_faults.inject import manifest  # noqa: F401 - part of this module's API (one walk, one digest)

PNG_END = b"IEND\xaeB`\x82"
# A temporary or staging name: attnlab.files' ".<name>.<random>.tmp" files and
# ".<name>.attnlab-<pid>@<host>.<random>.tmp(.old)" folders, Lightning/fsspec ".part" files,
# SQLite's journals, tempfile's "tmp<random>", MLflow's ".artifact.uploading.<random>".
TEMPORARY = re.compile(
    r"(^\..*\.tmp(\.old)?$|\.tmp$|\.part$|-journal$|-wal$|-shm$|^tmp[a-z0-9_]{8}$|^\.artifact\.uploading\.)"
)


def _check_ckpt(p: Path) -> None:
    import torch

    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    assert isinstance(ckpt, dict) and ckpt.get("state_dict"), "no state_dict"


def _check_zip(p: Path) -> None:
    with zipfile.ZipFile(p) as z:
        bad = z.testzip()
        assert bad is None, f"CRC of {bad} is wrong"


def _check_db(p: Path) -> None:
    """SQLite's own check, on a copy with its rollback journal: a writer killed while it
    committed leaves a hot journal, which the next connection rolls back (read-only ones
    cannot), and the store is whole again."""
    with tempfile.TemporaryDirectory() as d:
        for name in (p.name, f"{p.name}-journal"):
            if (p.parent / name).exists():
                shutil.copyfile(p.parent / name, Path(d) / name)
        with contextlib.closing(sqlite3.connect(Path(d) / p.name)) as con:
            (result,) = con.execute("PRAGMA quick_check").fetchone()
            assert result == "ok", result


def _check_spm(p: Path) -> None:
    import sentencepiece as spm

    spm.SentencePieceProcessor(model_file=str(p))


def _check_png(p: Path) -> None:
    data = p.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(PNG_END), "not a whole PNG"


CHECKS = {
    ".ckpt": _check_ckpt,
    ".pt2": _check_zip,
    ".zip": _check_zip,
    ".db": _check_db,
    ".model": _check_spm,
    ".png": _check_png,
    ".npy": lambda p: np.load(p),
    ".json": lambda p: json.loads(p.read_text(encoding="utf-8")),
    ".gz": lambda p: gzip.decompress(p.read_bytes()),
}


def whole(path: Path) -> str | None:
    """None if ``path`` loads as its kind (by suffix; other files must be UTF-8 text), else why not."""
    path = Path(path)
    check = CHECKS.get(path.suffix, lambda p: p.read_bytes().decode("utf-8"))
    try:
        check(path)
    except Exception as e:  # noqa: BLE001 - any failure to load is the answer
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def is_temporary(rel: str) -> bool:
    return any(TEMPORARY.search(part) for part in Path(rel).parts)


def kept_whole(before: dict[str, set[str]], root: Path, may_remove: tuple[str, ...] = ()) -> list[str]:
    """The files of ``before`` (``{path: the digests it had}``, from :func:`manifest`, taken
    before a fault) that are no longer whole under ``root``: changed to bytes that do not load,
    or gone. Temporary files may go, and so may the paths matching the ``may_remove``
    patterns (what the stage deletes on purpose)."""
    problems = []
    for rel, shas in before.items():
        p = Path(root) / rel
        if is_temporary(rel):
            continue
        if not p.exists():
            if not any(fnmatch.fnmatch(rel, pat) for pat in may_remove):
                problems.append(f"{rel}: gone")
        elif digest(p) not in shas and (why := whole(p)):
            problems.append(f"{rel}: damaged ({why})")
    return problems


def strays(root: Path) -> list[str]:
    """Temporary and staging files and folders under ``root``."""
    root = Path(root)
    return sorted(
        str(p.relative_to(root)) + ("/" if p.is_dir() else "")
        for p in root.rglob("*")
        if TEMPORARY.search(p.name) and not is_temporary(str(p.parent.relative_to(root)))
    )


def pending_models(root: Path) -> list[str]:
    """The MLflow logged models of the project's store that are not finished (PENDING)."""
    db = Path(root) / "mlflow.db"
    if not db.exists():
        return []
    with contextlib.closing(
        sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    ) as con:  # after a run that succeeded
        # mlflow.entities.LoggedModelStatus as stored: 1 is LOGGED_MODEL_PENDING (service.proto)
        rows = con.execute("SELECT model_id, name FROM logged_models WHERE status = 1").fetchall()
    return [f"{name} ({model_id}) is PENDING" for model_id, name in rows]


def files_under(root: Path, *folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((Path(root) / f).rglob("*")) if p.is_file()]
