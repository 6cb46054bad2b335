"""The seeds a case runs with, and the marks of the cases that fail today."""

from __future__ import annotations

import os
import tempfile
from functools import cache

import pytest

from test_faults.disk import project_filesystem


def seeds() -> list[int]:
    """``ATTNLAB_FAULT_ROUNDS`` seeds (default 1) from ``ATTNLAB_FAULT_SEED`` (default 0): CI's
    fixed list by default, more faults and other moments by hand."""
    first = int(os.environ.get("ATTNLAB_FAULT_SEED", "0"))
    return list(range(first, first + int(os.environ.get("ATTNLAB_FAULT_ROUNDS", "1"))))


@cache
def on_tmpfs() -> bool:
    """Whether the project will be on its own tmpfs (:mod:`test_faults.disk`): tried once here."""
    with tempfile.TemporaryDirectory() as d, project_filesystem(d, 1 << 20) as target:
        return target != "rlimit"


def known(
    failures: dict[str, str], case: str, moments: bool = True, without_tmpfs: dict | None = None
) -> list:
    """``xfail`` for a case listed in ``failures`` (its reason: what it showed), strict: it
    must fail, so that a fix shows as XPASS and the mark is removed. A case whose moments are
    file operations (``moments``) was observed with the project on a tmpfs, where moving a file
    into it is a copy; without one the operations differ, the mark is not strict, and the cases
    of ``without_tmpfs`` (what they showed there) are marked too."""
    if not on_tmpfs() and moments:
        failures = {**failures, **(without_tmpfs or {})}
    if case not in failures:
        return []
    return [pytest.mark.xfail(strict=on_tmpfs() or not moments, reason=failures[case])]
