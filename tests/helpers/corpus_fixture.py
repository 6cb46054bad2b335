"""A tiny English→French corpus the tests write themselves (no network, no mirror).

Sentences are built word by word from small aligned lexicons, so a model can
learn them in a few steps, and laid out like ``../shared/data``:
``multi30k/<split>.<lang>.gz`` and ``fra-eng.zip``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import random
import re
import zipfile
from pathlib import Path

SUBJECTS = [
    ("a man", "un homme", "ein Mann"),
    ("a woman", "une femme", "eine Frau"),
    ("a dog", "un chien", "ein Hund"),
    ("two children", "deux enfants", "zwei Kinder"),
]
VERBS = [("sees", "voit", "sieht"), ("likes", "aime", "mag"), ("watches", "regarde", "beobachtet")]
OBJECTS = [
    ("a ball", "un ballon", "einen Ball"),
    ("the sea", "la mer", "das Meer"),
    ("a red car", "une voiture rouge", "ein rotes Auto"),
    ("the city", "la ville", "die Stadt"),
]
SPLITS = {"train": 40, "val": 4, "test_2016_flickr": 4, "test_2017_flickr": 0}
# The fix a corrupt raw corpus file's error names (a regex).
REDOWNLOAD = re.escape("delete it and re-run `dvc repro download`")


def sentences(seed: int = 0) -> list[tuple[str, str, str]]:
    """All 48 (en, fr, de) sentences, shuffled with ``seed``."""
    out = []
    for (se, sf, sd), (ve, vf, vd), (oe, of, od) in itertools.product(SUBJECTS, VERBS, OBJECTS):
        out.append(
            (
                f"{se.capitalize()} {ve} {oe}.",
                f"{sf.capitalize()} {vf} {of}.",
                f"{sd.capitalize()} {vd} {od}.",
            )
        )
    random.Random(seed).shuffle(out)
    return out


def write_mirror(root: Path) -> dict[str, str]:
    """Write the tiny corpus as a mirror folder; return ``{relative path: sha256}``."""
    root = Path(root)
    (root / "multi30k").mkdir(parents=True, exist_ok=True)
    triples, start, digests = sentences(), 0, {}
    for split, n in SPLITS.items():
        chunk = triples[start : start + n] if n else triples[:4]
        start += n
        for i, lang in enumerate(("en", "fr", "de")):
            rel = f"multi30k/{split}.{lang}.gz"
            text = "".join(t[i] + "\n" for t in chunk).encode()
            (root / rel).write_bytes(gzip.compress(text, mtime=0))
            digests[rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        # Tatoeba style: U+202F before French punctuation.
        zf.writestr("fra-eng/fra.txt", "".join(f"{e}\t{f[:-1]}\u202f!\n" for e, f, _ in triples))
    (root / "fra-eng.zip").write_bytes(buf.getvalue())
    digests["fra-eng.zip"] = hashlib.sha256(buf.getvalue()).hexdigest()
    return digests


def flip(data: bytes, i: int) -> bytes:
    """``data`` with byte ``i`` corrupted (XOR 0x55)."""
    return data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1 :]
