"""An export folder is whole, or says which file is not: SHA-256 sums written last, checked on load.

The export stage ends every folder it writes (``models/<model>/``, and each CTranslate2 folder
in it) with :func:`write_checksums`: ``SHA256SUMS``, one ``<sha256>  <file>`` line per file in
``sha256sum``'s format, so ``cd models/transformer && sha256sum -c SHA256SUMS`` checks a folder
by hand too. :class:`ExportFiles` checks each file against it before the file is loaded, so a
truncated file, a flipped byte in the weights (which torch's and CTranslate2's readers do not
notice: the weights load and translate differently) or a file replaced by another is refused
with :class:`DamagedExportError`, which names the file and the command that exports the model
again. A folder without ``SHA256SUMS`` (written before it existed) is loaded unchecked, and a
file its reader cannot read still gets that error.

Only the standard library: the served model's runtime imports this.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnlab.errors import DamagedFileError
from attnlab.files import write_text_atomic

CHECKSUMS = "SHA256SUMS"
_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")


class DamagedExportError(DamagedFileError):
    """A file of an export folder is missing, cut short, changed since the export wrote it, or
    unreadable; the message names it and the command that writes the folder again."""


class DamagedExportWarning(UserWarning):
    """A damaged file of an export folder was passed over for a whole one that does the same
    (the portable program beside a damaged AOTInductor build)."""


_warned: set[str] = set()  # the DamagedExportWarning messages this process showed


def warn_once(message: str) -> None:
    """Warn ``message`` as a :class:`DamagedExportWarning` (stderr, or the server's log), once per
    process: a folder loaded again (a second translator, the served model's workers) says it
    once."""
    if message in _warned:
        return
    _warned.add(message)
    warnings.warn(message, DamagedExportWarning, stacklevel=3)


def sha256(path: Path) -> str:
    """SHA-256 (hex) of the file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_checksums(folder: Path) -> Path:
    """Write ``folder/SHA256SUMS``: the SHA-256 of every file under ``folder`` (sub-folders
    included, ``SHA256SUMS`` itself not), by path relative to it, sorted. Call it last, when
    every other file of the folder is written.

    Returns:
        the file written.
    """
    folder = Path(folder)
    files = sorted(
        p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != CHECKSUMS
    )
    lines = [f"{sha256(p)}  {p.relative_to(folder).as_posix()}\n" for p in files]
    return write_text_atomic(folder / CHECKSUMS, "".join(lines))


def export_command(model: str | None) -> str:
    """The commands that export ``model`` again (``<name>`` when it is not known)."""
    name = model or "<name>"
    return f"`python src/export.py model={name}` (or `dvc repro export@{name}`)"


def damaged(path: Path, why: str, model: str | None) -> DamagedExportError:
    """The error for export file ``path``: what is wrong with it (``why``) and the fix."""
    return DamagedExportError(
        f"{path} is damaged ({why}): export the model again with {export_command(model)}"
    )


def reason(e: BaseException) -> str:
    """``<type>: <first line of the message>`` of a reader's error, at most 200 characters."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
    return f"{type(e).__name__}: {text[:200]}"


class ExportFiles:
    """The files of one export folder, each checked against the folder's ``SHA256SUMS`` as it
    is loaded.

    Args:
        folder: an export folder (or a CTranslate2 folder in one).
        model: the model's name, for the fix the errors name (``python src/export.py
            model=<model>``); None: the ``model`` of the folder's ``config.json`` if it
            reads, else the folder's name (``models/<model>/``).
    Raises:
        DamagedExportError: ``SHA256SUMS`` is there but not in ``sha256sum``'s format.
    """

    def __init__(self, folder: Path, model: str | None = None):
        self.folder, self.model = Path(folder), model
        self.sums: dict[str, str] | None = None  # None: no SHA256SUMS, nothing to check against
        listing = self.folder / CHECKSUMS
        if listing.is_file():
            self.sums = {}
            try:
                lines = listing.read_text(encoding="utf-8").splitlines()
            except (OSError, ValueError) as e:
                raise damaged(listing, reason(e), self.model_name()) from e
            for n, line in enumerate(lines, 1):
                if not (m := _LINE.fullmatch(line)):
                    raise damaged(listing, f"line {n} is not `<sha256>  <file>`", self.model_name())
                self.sums[m[2]] = m[1]

    def model_name(self) -> str:
        """The model the folder holds, for the fix an error names (see the class's ``model``)."""
        if self.model:
            return self.model
        try:
            named = json.loads((self.folder / "config.json").read_text(encoding="utf-8")).get("model")
        except (OSError, ValueError, AttributeError):  # missing, damaged, not an object
            named = None
        return named if isinstance(named, str) and named else self.folder.name

    def damaged(self, name: str, why: str) -> DamagedExportError:
        """:func:`damaged` for the folder's file ``name`` (relative, ``/``-separated)."""
        return damaged(self.folder / name, why, self.model_name())

    def whole(self, name: str) -> bool:
        """Whether :meth:`check` passes file ``name``."""
        try:
            self.check(name)
        except DamagedExportError:
            return False
        return True

    def check(self, name: str) -> Path:
        """The path of file ``name`` (relative to the folder, ``/``-separated), checked.

        Raises:
            DamagedExportError: the file is missing, ``SHA256SUMS`` does not list it (a
                listing cut short: it names ``SHA256SUMS``), or its SHA-256 is not the one
                listed (names the file and the fix).
        """
        path = self.folder / name
        if not path.is_file():
            raise self.damaged(name, "the file is missing")
        if self.sums is None:  # an export written before SHA256SUMS: nothing to check against
            return path
        if name not in self.sums:
            raise self.damaged(CHECKSUMS, f"it lists no SHA-256 for {name}, which every export has")
        if (actual := sha256(path)) != (expected := self.sums[name]):
            size = path.stat().st_size
            raise self.damaged(
                name,
                f"its {size:,} bytes have SHA-256 {actual[:12]}…, not the {expected[:12]}… the export "
                f"wrote ({CHECKSUMS}): it was cut short or changed since",
            )
        return path

    @contextmanager
    def loading(self, name: str) -> Iterator[Path]:
        """Check file ``name`` (:meth:`check`) and yield its path to a reader; an error the
        reader raises becomes :class:`DamagedExportError` naming the file (with the reader's
        error as its cause)."""
        path = self.check(name)
        try:
            yield path
        except DamagedExportError:
            raise
        except Exception as e:  # any reader's error: the file cannot be used
            if self.sums is None:
                raise self.damaged(name, f"it cannot be read: {reason(e)}") from e
            raise DamagedExportError(  # whole, yet unreadable: written by other library versions
                f"{path} cannot be read ({reason(e)}), though its bytes are the ones the export "
                f"wrote ({CHECKSUMS}): export the model again with these libraries, "
                f"{export_command(self.model_name())}"
            ) from e
