"""Reading raw corpora (``attnlab.data.corpora``, ``attnlab.data.d2l``): truncated or corrupt
archives and non-UTF-8 bytes.

Each case gets a ``CorpusError`` naming the file (and line) and the fix, raised before
anything downstream is written, so nothing is half-written.
"""

import gzip
import io
import re
import zipfile
from pathlib import Path

import pytest

from attnlab.data import d2l
from attnlab.data.corpora import CorpusError, read_fra_eng, read_lines
from helpers.corpus_fixture import REDOWNLOAD, flip, sentences


def _zip_with(path: Path, raw: bytes) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("fra-eng/fra.txt", raw)
    path.write_bytes(buf.getvalue())
    return path


# --- truncated or corrupt archives -------------------------------------------------


def _good_gz() -> bytes:
    return gzip.compress("".join(f"{e}\n" for e, _, _ in sentences()).encode(), mtime=0)


@pytest.mark.parametrize(
    "damage, cause",
    [
        (lambda b: b[: len(b) // 2], "EOFError: Compressed file ended before the end-of-stream marker"),
        (lambda b: b[:-4], "EOFError"),  # gzip trailer cut off
        (lambda b: b"", "is empty \\(0 bytes\\)"),
        (lambda b: b"plain text, not gzip\n", "BadGzipFile: Not a gzipped file"),
        (lambda b: flip(b, len(b) - 6), "BadGzipFile: CRC check failed"),  # a byte of the CRC
        (lambda b: flip(b, 30), "(error: Error -3 while decompressing|BadGzipFile: CRC check failed)"),
    ],
)
def test_truncated_or_corrupt_gzip_is_a_corpus_error_naming_file_and_fix(tmp_path, damage, cause):
    path = tmp_path / "train.en.gz"
    path.write_bytes(damage(_good_gz()))
    with pytest.raises(
        CorpusError,
        match=rf"^{re.escape(str(path))} (is truncated or corrupt \()?"
        rf"{cause}.*{REDOWNLOAD}",
    ):
        read_lines(path)


@pytest.mark.parametrize("reader", [read_fra_eng, d2l.read_fra_txt], ids=["read_fra_eng", "d2l"])
@pytest.mark.parametrize(
    "damage, cause",
    [
        (lambda b: b[: len(b) // 2], "BadZipFile: File is not a zip file"),
        (lambda b: flip(b, 100), "BadZipFile: Bad CRC-32 for file 'fra-eng/fra.txt'"),
    ],
)
def test_truncated_or_corrupt_zip_is_a_corpus_error_naming_file_and_fix(
    mirror, tmp_path, reader, damage, cause
):
    path = tmp_path / "fra-eng.zip"
    path.write_bytes(damage((mirror[0] / "fra-eng.zip").read_bytes()))
    with pytest.raises(
        CorpusError,
        match=rf"^{re.escape(str(path))} is truncated or corrupt "
        rf"\({re.escape(cause)}.*{REDOWNLOAD}",
    ):
        reader(path)


def test_zip_without_fra_txt_names_the_member(tmp_path):
    path = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("other.txt", "x")
    with pytest.raises(CorpusError, match=rf"fra-eng\.zip has no fra-eng/fra\.txt.*{REDOWNLOAD}"):
        d2l.read_fra_txt(path)


# --- non-UTF-8 bytes -----------------------------------------------------------------


def test_non_utf8_in_plain_file_names_file_and_line(tmp_path):
    p = tmp_path / "val.src.txt"
    p.write_bytes("un\ndeux\ntroisième\n".encode("latin-1"))
    with pytest.raises(
        CorpusError,
        match=r"val\.src\.txt: line 3 is not valid UTF-8 \(invalid "
        r"continuation byte\); convert the file to UTF-8",
    ):
        read_lines(p)


def test_non_utf8_inside_gzip_names_file_and_line(tmp_path):
    p = tmp_path / "train.fr.gz"
    p.write_bytes(gzip.compress("Un homme.\nUne femme.\nL'été\n".encode("cp1252")))
    with pytest.raises(CorpusError, match=r"train\.fr\.gz: line 3 is not valid UTF-8"):
        read_lines(p)


@pytest.mark.parametrize("reader", [read_fra_eng, d2l.read_fra_txt], ids=["read_fra_eng", "d2l"])
def test_non_utf8_inside_zip_names_archive_member_and_line(tmp_path, reader):
    path = _zip_with(tmp_path / "fra-eng.zip", b"Go.\tVa !\nHi.\tSalut \xe0 toi.\n")
    with pytest.raises(CorpusError, match=r"fra-eng\.zip:fra-eng/fra\.txt: line 2 is not valid UTF-8"):
        reader(path)
