"""Corpus readers: raw files under ``data/raw`` → lists of aligned (source, target) sentences.

Normalization (both corpora): U+202F (narrow no-break space) and U+00A0
(no-break space) become a plain space, runs of whitespace collapse to one
space, and each line is stripped. Tatoeba's ``fra.txt`` has them before French
punctuation (see ``../shared/data/README.md``).

Bad input is a :class:`CorpusError` that names the file and the fix: a missing
file, a truncated or corrupt ``.gz``/``.zip`` (delete it and re-run the
download stage), a non-UTF-8 byte (file and line), misaligned sides.

The readers keep every line, empty ones too (only ``fra.txt``'s blank lines,
which hold no pair, are skipped), so val/test stay aligned with their
references; which training pairs the tokenize stage keeps is
:func:`attnlab.data.tokenizer.filter_pairs`.
"""

from __future__ import annotations

import gzip
import random
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

_SPACES = re.compile(r"[\s\u202f\u00a0]+")


class CorpusError(ValueError):
    """A corpus file is missing, unreadable or misaligned."""


class TokenizeError(ValueError):
    """The tokenize stage cannot tokenize this corpus with these settings (a ``data.*`` value,
    an empty training split, a vocabulary size the corpus cannot give); the message names
    what to change. Raised before the output folder is replaced: nothing was written."""


@dataclass(frozen=True)
class TokenizeReport:
    """What a tokenize function reports of the folder it wrote (``src/tokenize_data.py``
    prints ``lines``, then the stage summary from the rest).

    A tokenize function is the one ``conf/data/<corpus>.yaml`` names in ``tokenize``
    (:func:`attnlab.data.tokenizer.tokenize_sentencepiece`,
    :func:`attnlab.data.d2l.tokenize_d2l`): ``tokenize(cfg, out) -> TokenizeReport``,
    raising :class:`CorpusError` or :class:`TokenizeError`.

    Attributes:
        corpus: e.g. ``multi30k en-fr, sentencepiece``.
        splits: split name → its pair count as text, e.g. ``{"train": "40 of 46"}``.
        vocabulary: e.g. ``5000 pieces``.
        lines: progress lines, one per split (none for D2L's arrays).
    """

    corpus: str
    splits: dict[str, str]
    vocabulary: str
    lines: list[str] = field(default_factory=list)


_REDOWNLOAD = "delete it and re-run `dvc repro download` (or `python src/download.py`)"


def normalize(line: str) -> str:
    """Map U+202F/U+00A0 to spaces, collapse whitespace runs, strip. str → str."""
    return _SPACES.sub(" ", line).strip()


def _decode_utf8(raw: bytes, where: str) -> str:
    """``raw`` decoded as UTF-8; a bad byte is a CorpusError naming ``where`` and the line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise CorpusError(
            f"{where}: line {line} is not valid UTF-8 ({e.reason}); "
            "convert the file to UTF-8 or fix that line"
        ) from None


def read_lines(path: Path) -> list[str]:
    """Normalized lines of a UTF-8 text file, gzip-compressed if it ends in ``.gz``.

    Raises:
        CorpusError: missing file (run the download stage); a truncated or
            corrupt ``.gz`` (names the file: delete it and re-download); or
            non-UTF-8 bytes (names the file and line number).
    """
    path = Path(path)
    if not path.exists():
        raise CorpusError(
            f"{path} does not exist; run `dvc repro download` (or `python src/download.py`) first"
        )
    if path.suffix == ".gz":
        if path.stat().st_size == 0:  # gzip.open reads an empty file as empty text
            raise CorpusError(f"{path} is empty (0 bytes), not a gzip file: it was cut short; {_REDOWNLOAD}")
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read()
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # truncated, not gzip, bad CRC/deflate
            raise CorpusError(
                f"{path} is truncated or corrupt ({type(e).__name__}: {e}); {_REDOWNLOAD}"
            ) from None
    else:
        raw = path.read_bytes()
    lines = _decode_utf8(raw, str(path)).split("\n")
    if lines[-1] == "":
        lines.pop()
    return [normalize(line) for line in lines]


def read_zip_text(zip_path: Path, member: str) -> str:
    """The UTF-8 text of ``member`` inside the archive ``zip_path`` (not normalized).

    Raises:
        CorpusError: missing archive (run the download stage); a truncated or
            corrupt archive, or a member that fails its CRC check (names the
            file: delete it and re-download); a missing member; non-UTF-8
            bytes (names the member and line).
    """
    zip_path = Path(zip_path)
    if not zip_path.exists():
        raise CorpusError(
            f"{zip_path} does not exist; run `dvc repro download` (or `python src/download.py`) first"
        )
    try:
        with zipfile.ZipFile(zip_path) as zf:
            raw = zf.read(member)
    except KeyError:
        raise CorpusError(
            f"{zip_path} has no {member}; it is not the expected archive: {_REDOWNLOAD}"
        ) from None
    except PermissionError:
        raise
    except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, OSError) as e:
        # OSError: a corrupt offset makes zipfile seek before the start of the file;
        # NotImplementedError: corrupt flags read as encryption or an unknown compression.
        raise CorpusError(
            f"{zip_path} is truncated or corrupt ({type(e).__name__}: {e}); {_REDOWNLOAD}"
        ) from None
    return _decode_utf8(raw, f"{zip_path}:{member}")


def read_parallel(src_path: Path, tgt_path: Path) -> list[tuple[str, str]]:
    """Aligned pairs from two line-aligned files.

    Raises:
        CorpusError: if the two files have different line counts (names both files and counts).
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise CorpusError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}; "
            "the two sides of a split must be line-aligned"
        )
    return list(zip(src, tgt))


def read_multi30k(raw_dir: Path, split: str, src_lang: str, tgt_lang: str) -> list[tuple[str, str]]:
    """Multi30k task 1 split (train, val, test_2016_flickr, test_2017_flickr) from ``raw_dir``."""
    raw_dir = Path(raw_dir)
    return read_parallel(raw_dir / f"{split}.{src_lang}.gz", raw_dir / f"{split}.{tgt_lang}.gz")


def read_fra_eng(zip_path: Path, src_lang: str = "en", tgt_lang: str = "fr") -> list[tuple[str, str]]:
    """All pairs of D2L's ``fra-eng/fra.txt`` (``English<TAB>French`` per line), normalized.

    Raises:
        CorpusError: other languages than en/fr; any error of :func:`read_zip_text`
            (missing, truncated or corrupt archive, no ``fra-eng/fra.txt``,
            non-UTF-8 bytes); a line without a tab.
    """
    if {src_lang, tgt_lang} != {"en", "fr"}:
        raise CorpusError(f"fra_eng has only en and fr; got src_lang={src_lang}, tgt_lang={tgt_lang}")
    text = read_zip_text(zip_path, "fra-eng/fra.txt")
    pairs = []
    for i, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise CorpusError(
                f"{zip_path}:fra-eng/fra.txt line {i} has no tab separator; it is not "
                f"D2L's English<TAB>French file: {_REDOWNLOAD}"
            )
        en, fr = normalize(cols[0]), normalize(cols[1])
        pairs.append((en, fr) if src_lang == "en" else (fr, en))
    return pairs


def split_heldout(pairs: list, num_val: int, num_test: int, seed: int) -> dict[str, list]:
    """Fixed-seed shuffle, then the first ``num_test`` pairs are test, the next ``num_val`` val."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    shuffled = [pairs[i] for i in order]
    return {
        "test": shuffled[:num_test],
        "val": shuffled[num_test : num_test + num_val],
        "train": shuffled[num_test + num_val :],
    }


def check_languages(data_cfg) -> None:
    """Check that ``data_cfg.src_lang → data_cfg.tgt_lang`` is a direction the corpus has.

    ``data_cfg.languages`` (``conf/data/<corpus>.yaml``) lists the corpus's languages;
    any two different ones make a direction.

    Raises:
        CorpusError: a language the corpus lacks, or the same language on both sides
            (names the corpus, its languages and where to set them).
    """
    langs, src, tgt = list(data_cfg.languages), data_cfg.src_lang, data_cfg.tgt_lang
    fix = (
        "set src_lang/tgt_lang in params.yaml (`dvc exp run -S tgt_lang=...`) or "
        "data.src_lang=/data.tgt_lang= on the command line"
    )
    for side, lang in (("src_lang", src), ("tgt_lang", tgt)):
        if lang not in langs:
            raise CorpusError(
                f"data={data_cfg.name} has the languages {', '.join(langs)}; "
                f"{side}={lang} is not one of them: {fix}"
            )
    if src == tgt:
        raise CorpusError(
            f"src_lang and tgt_lang are both {src}: choose two different "
            f"languages of data={data_cfg.name} ({', '.join(langs)}); {fix}"
        )


def load_splits(data_cfg, raw_root: Path) -> dict[str, list[tuple[str, str]]]:
    """The train/val/test pairs that a ``conf/data/*.yaml`` config names.

    ``data_cfg.name`` is ``multi30k`` (splits from ``data_cfg.splits``) or
    ``fra_eng`` (held-out split by ``data_cfg.heldout``).

    Raises:
        CorpusError: the pair is not one the corpus has (see :func:`check_languages`),
            an unknown corpus, or any error reading its files.
    """
    check_languages(data_cfg)
    raw_root = Path(raw_root)
    if data_cfg.name == "multi30k":
        return {
            k: read_multi30k(raw_root / "multi30k", split, data_cfg.src_lang, data_cfg.tgt_lang)
            for k, split in data_cfg.splits.items()
        }
    if data_cfg.name == "fra_eng":
        pairs = read_fra_eng(raw_root / "fra-eng.zip", data_cfg.src_lang, data_cfg.tgt_lang)
        h = data_cfg.heldout
        return split_heldout(pairs, h.num_val, h.num_test, h.seed)
    raise CorpusError(f"unknown corpus {data_cfg.name!r}; use data=multi30k or data=fra_eng")
