"""Fetch the raw corpora, verify SHA-256, write atomically.

Each file comes from ``$ATTNLAB_DATA_MIRROR/<relative path>`` when that
variable is set (a folder laid out like ``../shared/data``), else from its
canonical URL. A file is accepted only if its SHA-256 (or SHA-1) is one of the
known digests for it; it is written to a temporary file beside the target and
renamed, so a failed or corrupt download leaves nothing behind. A target that
already exists with a known digest is not fetched again; one that does not
match (e.g. a truncated archive from an interrupted copy) is fetched again and
replaced only once the new copy verifies.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

from attnlab.errors import UserError
from attnlab.files import remove_stale_staging, temp_prefix, write_error

MIRROR_ENV = "ATTNLAB_DATA_MIRROR"


class DownloadError(UserError, RuntimeError):
    """A source could not be fetched, or its checksum did not match."""


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest (``sha256`` or ``sha1``) of a file, read in 1 MiB chunks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verified(path: Path, digests: dict[str, list[str]]) -> tuple[bool, str]:
    """Whether ``path`` matches one of the known ``{algorithm: [hex, ...]}`` digests,
    and its SHA-256 (for error messages)."""
    sha256 = file_digest(path, "sha256")
    for algorithm, known in digests.items():
        actual = sha256 if algorithm == "sha256" else file_digest(path, algorithm)
        if actual in {d.lower() for d in known}:
            return True, sha256
    return False, sha256


def _open_source(relpath: str, url: str, mirror: str | None):
    if mirror:
        src = Path(mirror) / relpath
        if not src.exists():
            raise DownloadError(
                f"{src} not found in the mirror {MIRROR_ENV}={mirror}; "
                "the mirror must be laid out like ../shared/data"
            )
        return open(src, "rb"), str(src)
    try:
        return urllib.request.urlopen(url, timeout=60), url
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(
            f"cannot fetch {url} ({e}); offline? set {MIRROR_ENV} to a folder holding "
            f"{relpath} (e.g. {MIRROR_ENV}=../shared/data)"
        ) from None


def _copy(stream, out, what: str) -> None:
    """Copy ``stream`` to ``out`` in 1 MiB chunks; a failed *read* is a DownloadError."""
    while True:
        try:
            chunk = stream.read(1 << 20)
        except (OSError, http.client.HTTPException) as e:  # connection reset, IncompleteRead, …
            raise DownloadError(
                f"{what} was cut short ({type(e).__name__}: {e}); nothing was "
                "written: re-run `dvc repro download`"
            ) from None
        if not chunk:
            return
        out.write(chunk)


class Fetched(NamedTuple):
    """What :func:`fetch` did: the verified file, and whether it was written now
    (``False``: a verified copy was there already and was kept)."""

    path: Path
    downloaded: bool


def fetch(
    relpath: str, url: str, digests: dict[str, list[str]], dest_root: Path, mirror: str | None = None
) -> Fetched:
    """Make ``dest_root/relpath`` a verified copy of the source.

    Args:
        relpath: path under the raw-data root and under the mirror, e.g. ``multi30k/train.en.gz``.
        url: canonical address used when no mirror is given.
        digests: accepted hex digests by algorithm, e.g. ``{"sha256": [...], "sha1": [...]}``
            (a source may have several known versions).
        dest_root: raw-data root, e.g. ``data/raw``.
        mirror: mirror folder; defaults to ``$ATTNLAB_DATA_MIRROR``.
    Returns:
        :class:`Fetched`: the file's path, and ``downloaded``: ``True`` if it was written
        now (it was missing, or did not match ``digests``), ``False`` if kept.
    Raises:
        DownloadError: unreachable source (names the URL and the variable); a
            transfer cut short; or a digest not in ``digests``, e.g. a truncated
            or corrupt archive (names the file and source). In every case no
            file is left behind and an existing target is not touched.
        attnlab.files.FileWriteError: the file cannot be written (a full disk: names it and
            the fix); likewise nothing is left behind and the target is not touched.
    """
    mirror = os.environ.get(MIRROR_ENV) if mirror is None else mirror
    dest = Path(dest_root) / relpath
    if dest.exists() and verified(dest, digests)[0]:
        return Fetched(dest, downloaded=False)
    dest.parent.mkdir(parents=True, exist_ok=True)
    stream, origin = _open_source(relpath, url, mirror)
    remove_stale_staging(dest, suffix=".part")  # the .part files of downloads killed before
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(dest), suffix=".part", dir=dest.parent)
    try:
        with stream, os.fdopen(fd, "wb") as out:
            _copy(stream, out, f"the transfer of {relpath} from {origin}")
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: a crash leaves no short file
        ok, digest = verified(Path(tmp), digests)
        if not ok:
            size = Path(tmp).stat().st_size
            persists = (
                f"replace the mirror's copy {origin} with a fresh one from {url}"
                if mirror
                else f"{url} may now serve another version: check it"
            )
            raise DownloadError(
                f"checksum mismatch for {relpath} from {origin}: got sha256 {digest} ({size} bytes), "
                f"expected one of {dict(digests)}; the file was discarded. A truncated or corrupt "
                f"copy gives this: re-run `dvc repro download`; if it persists, {persists}"
            )
        os.replace(tmp, dest)
    except OSError as e:  # writing it (a read that fails is a DownloadError)
        Path(tmp).unlink(missing_ok=True)
        raise write_error(dest, e) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Fetched(dest, downloaded=True)
