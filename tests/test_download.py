"""The download stage (``attnlab.data.download``) on truncated or cut-short transfers.

Each case gets a clear error naming the problem and the fix, and nothing is half-written:
no ``.part`` is left and a previous copy is kept or replaced only by a verified one.
"""

import http.client
import re

import pytest

from attnlab.data import download as download_mod
from attnlab.data.corpora import read_lines
from attnlab.data.download import DownloadError, fetch


def test_truncated_download_is_discarded_and_names_file_and_fix(mirror, tmp_path):
    good, digests = mirror
    bad = tmp_path / "bad_mirror"
    bad.mkdir()
    whole = (good / "fra-eng.zip").read_bytes()
    (bad / "fra-eng.zip").write_bytes(whole[: len(whole) // 2])
    raw = tmp_path / "raw"
    with pytest.raises(
        DownloadError,
        match=r"checksum mismatch for fra-eng\.zip .*"
        rf"\({len(whole) // 2} bytes\).*truncated or corrupt copy.*re-run `dvc repro "
        r"download`; if it persists, replace the mirror's copy",
    ):
        fetch(
            "fra-eng.zip",
            "http://unused.invalid/fra-eng.zip",
            {"sha256": [digests["fra-eng.zip"]]},
            raw,
            mirror=str(bad),
        )
    assert list(raw.iterdir()) == []  # no file, no .part


def test_truncated_file_in_raw_is_replaced_by_a_verified_copy(mirror, tmp_path):
    good, digests = mirror
    rel = "multi30k/train.en.gz"
    dest = tmp_path / "raw" / rel
    dest.parent.mkdir(parents=True)
    dest.write_bytes((good / rel).read_bytes()[:50])  # an interrupted copy
    fetched = fetch(
        rel, "http://unused.invalid/", {"sha256": [digests[rel]]}, tmp_path / "raw", mirror=str(good)
    )
    assert fetched == (dest, True)  # the download stage reports it as fetched, not kept
    assert dest.read_bytes() == (good / rel).read_bytes()
    assert len(read_lines(dest)) == 40


class _CutStream:
    """A response that sends ``data`` then drops the connection."""

    def __init__(self, data: bytes):
        self.parts = [data]

    def read(self, n):
        if self.parts:
            return self.parts.pop()
        raise http.client.IncompleteRead(b"", 1000)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_transfer_cut_short_keeps_the_existing_file(monkeypatch, tmp_path):
    rel = "multi30k/val.en.gz"
    url = "https://example.invalid/val.en.gz"
    monkeypatch.setattr(download_mod, "_open_source", lambda r, u, m: (_CutStream(b"\x1f\x8b"), url))
    dest = tmp_path / rel
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"previous copy")  # unverified, so fetch tries again
    with pytest.raises(
        DownloadError,
        match=rf"the transfer of {re.escape(rel)} from {re.escape(url)} "
        r"was cut short \(IncompleteRead: .*re-run `dvc repro download`",
    ):
        fetch(rel, url, {"sha256": ["0" * 64]}, tmp_path, mirror="")
    assert dest.read_bytes() == b"previous copy"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["val.en.gz"]  # no .part left
