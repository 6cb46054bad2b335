"""Damaged copies of a file's bytes, at places a seeded generator chooses.

- ``truncate``: the first k bytes, 0 ≤ k < size (a copy or write cut short);
- ``flip``: 16 bytes inverted (XOR 0xFF) at a random offset (bad sectors, bit rot, a
  stray write);
- ``zero``: every byte zero, size kept (what a crash after the size reached the disk but
  not the data leaves on many filesystems).
"""

from __future__ import annotations

import random

KINDS = ("truncate", "flip", "zero")
FLIPPED = 16


def damage(data: bytes, kind: str, rng: random.Random) -> tuple[bytes, str]:
    """``data`` damaged as ``kind``, and a description of where (for the report)."""
    if kind == "truncate":
        k = rng.randrange(len(data))
        return data[:k], f"cut to {k} of {len(data)} bytes"
    if kind == "flip":
        n = min(FLIPPED, len(data))
        i = rng.randrange(len(data) - n + 1)
        return data[:i] + bytes(b ^ 0xFF for b in data[i : i + n]) + data[
            i + n :
        ], f"bytes {i}–{i + n - 1} inverted"
    if kind == "zero":
        return bytes(len(data)), f"all {len(data)} bytes zero"
    raise ValueError(f"unknown damage {kind!r}; one of {KINDS}")
