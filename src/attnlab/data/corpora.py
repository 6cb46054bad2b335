"""Corpus readers: raw files under ``data/raw`` (or a folder of the user's) → aligned
(source, target) sentences, streamed a line at a time.

Normalization (every corpus): U+202F (narrow no-break space) and U+00A0
(no-break space) become a plain space, runs of whitespace collapse to one
space, and each line is stripped. Tatoeba's ``fra.txt`` has them before French
punctuation (see ``../shared/data/README.md``). A normalized sentence holds no tab and no
newline.

Every reader streams: a file is read a line at a time (a ``.gz`` decompressed and a zip
member inflated as the lines are read), so reading holds one line of the corpus, never the
whole of it. The list readers (:func:`read_lines`, :func:`read_parallel`,
:func:`read_fra_eng`, :func:`read_parallel_corpus`)
gather those streams, for small files and tests.

Bad input is a :class:`CorpusError` that names the file and the fix: a missing
file, a truncated or corrupt ``.gz``/``.zip`` (delete it and re-run the
download stage), a non-UTF-8 byte (file and line), a line without its tab (file and line),
misaligned sides (the two counts, found when one side ends first: the other is counted to its
end), an empty split. A stream raises the error that reading each file whole would raise:
a truncated or corrupt file before a bad byte in it, a bad byte before a missing tab, the
source file before the target file, and both before unequal line counts; a stream that meets
an error reads on to the end of the file(s) to find out.

The readers keep every line, empty ones too (only ``fra.txt``'s blank lines,
which hold no pair, are skipped), so val/test stay aligned with their
references; which training pairs the tokenize stage keeps is
:func:`attnlab.data.tokenizer.filter_pairs`.

:func:`scan_corpus` is the tokenize stage's first pass over a corpus: it reads every split
once, with every check above, counts its pairs, and chooses the held-out splits with
:func:`split_heldout`'s fixed-seed shuffle (:func:`heldout_order`). The
:class:`StreamedCorpus` it returns streams each split again, in chunks, in the split's order.
"""

from __future__ import annotations

import array
import codecs
import functools
import gzip
import itertools
import os
import random
import shutil
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnlab.errors import UserError, brief


class CorpusError(UserError, ValueError):
    """A corpus file is missing, unreadable or misaligned."""


class TokenizeError(UserError, ValueError):
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
# a user's own corpus file: nothing downloads it again
_RECREATE = "re-create or re-compress it from your copy of the corpus (no stage downloads it)"
Pair = tuple[str, str]


def normalize(line: str) -> str:
    """Map U+202F/U+00A0 to spaces, collapse whitespace runs, strip. str → str.

    ``" ".join(line.split())``: ``str.split`` splits on the characters ``str.isspace`` calls
    whitespace, which are those of the regex ``[\\s\\u202f\\u00a0]`` (U+202F and U+00A0
    among them; ``tests/test_streamed_data.py`` checks every code point), four times faster."""
    return " ".join(line.split())


def _missing(path: Path) -> CorpusError:
    return CorpusError(f"{path} does not exist; run `dvc repro download` (or `python src/download.py`) first")


def _corrupt(path: Path, e: BaseException, fix: str = _REDOWNLOAD) -> CorpusError:
    return CorpusError(f"{path} is truncated or corrupt ({brief(e)}); {fix}")


def _not_utf8(where: str, line: int, e: UnicodeDecodeError) -> CorpusError:
    return CorpusError(
        f"{where}: line {line} is not valid UTF-8 ({e.reason}); convert the file to UTF-8 or fix that line"
    )


def _decode_utf8(raw: bytes, where: str, first_line: int = 1) -> str:
    """``raw`` decoded as UTF-8; a bad byte is a CorpusError naming ``where`` and the line
    (``raw`` starting at line ``first_line``)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(where, first_line + raw.count(b"\n", 0, e.start), e) from None


_LINES = 4096  # lines read, decoded and normalized at a time


def _chunks_of(f) -> Iterator[list[bytes]]:
    while chunk := list(itertools.islice(f, _LINES)):
        yield chunk


def _file_chunks(path: Path, fix: str = _REDOWNLOAD) -> Iterator[list[bytes]]:
    """The raw lines of a file (each with its ``\\n``), :data:`_LINES` at a time (the last chunk
    fewer), gunzipped as read if it ends in ``.gz``. ``fix`` ends the message of a damaged file.

    Raises:
        CorpusError: missing file; an empty, truncated or corrupt ``.gz`` (when the bad part
            is reached).
    """
    path = Path(path)
    if not path.exists():
        raise _missing(path)
    if path.suffix != ".gz":
        with path.open("rb") as f:
            yield from _chunks_of(f)
        return
    if path.stat().st_size == 0:  # gzip reads an empty file as empty text
        raise CorpusError(f"{path} is empty (0 bytes), not a gzip file: it was cut short; {fix}")
    try:
        with gzip.open(path, "rb") as f:
            yield from _chunks_of(f)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # truncated, not gzip, bad CRC/deflate
        raise _corrupt(path, e, fix) from None


def _zip_chunks(zip_path: Path, member: str) -> Iterator[list[bytes]]:
    """The raw lines of ``member`` of the archive ``zip_path``, inflated as read, as
    :func:`_file_chunks` gives a file's.

    Raises:
        CorpusError: missing archive; no ``member``; a truncated or corrupt archive, or a
            member that fails its CRC check (at its end).
    """
    zip_path = Path(zip_path)
    if not zip_path.exists():
        raise _missing(zip_path)
    try:
        with zipfile.ZipFile(zip_path) as zf, zf.open(member) as f:
            yield from _chunks_of(f)
    except KeyError:
        raise CorpusError(
            f"{zip_path} has no {member}; it is not the expected archive: {_REDOWNLOAD}"
        ) from None
    except PermissionError:
        raise
    except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, OSError) as e:
        # OSError: a corrupt offset makes zipfile seek before the start of the file;
        # NotImplementedError: corrupt flags read as encryption or an unknown compression.
        raise _corrupt(zip_path, e) from None


def _drain(chunks: Iterator[list]) -> int:
    """Read a stream of chunks to its end (raising its errors); the number of lines it still had."""
    return sum(len(chunk) for chunk in chunks)


def _decoded(raw_chunks: Iterator[list[bytes]], where: str) -> Iterator[list[str]]:
    """Chunks of raw lines decoded as UTF-8, without their ``\\n`` (not normalized).

    A bad byte is a CorpusError naming ``where`` and the line, raised once the rest of the
    file is read: a truncated or corrupt file is the error to report, as when read whole.
    (A chunk holds whole lines, so decoding it is decoding them: the same reason for a bad byte.)
    A byte-order mark (U+FEFF) that starts the file, as editors on Windows write, is dropped.
    """
    line = 1
    for chunk in raw_chunks:
        raw = b"".join(chunk)
        if line == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            lines = raw.decode("utf-8").split("\n")
        except UnicodeDecodeError as e:
            error = _not_utf8(where, line + raw.count(b"\n", 0, e.start), e)
            break
        if raw.endswith(b"\n"):
            lines.pop()
        yield lines
        line += len(chunk)
    else:
        return
    _drain(raw_chunks)
    raise error


def _normalized(path: Path, fix: str = _REDOWNLOAD) -> Iterator[list[str]]:
    """The normalized lines of a file, :data:`_LINES` at a time (:func:`iter_lines`)."""
    for lines in _decoded(_file_chunks(path, fix), str(path)):
        yield [" ".join(line.split()) for line in lines]


def read_text(path: Path) -> str:
    """The UTF-8 text of a file, gzip-compressed if it ends in ``.gz`` (not normalized).

    Raises:
        CorpusError: missing file (run the download stage); a truncated or
            corrupt ``.gz`` (names the file: delete it and re-download); or
            non-UTF-8 bytes (names the file and line number).
    """
    return _decode_utf8(b"".join(itertools.chain.from_iterable(_file_chunks(path))), str(path))


def iter_lines(path: Path) -> Iterator[str]:
    """Normalized lines of a UTF-8 text file, gzip-compressed if it ends in ``.gz``, streamed
    (lines split on ``\\n`` alone; no empty line after a final newline).

    Raises:
        CorpusError: as :func:`read_text`, when the stream reaches the error.
    """
    for lines in _normalized(path):
        yield from lines


def read_lines(path: Path) -> list[str]:
    """Normalized lines of a UTF-8 text file, gzip-compressed if it ends in ``.gz``.

    Raises:
        CorpusError: as :func:`read_text`.
    """
    return list(iter_lines(path))


def read_zip_text(zip_path: Path, member: str) -> str:
    """The UTF-8 text of ``member`` inside the archive ``zip_path`` (not normalized).

    Raises:
        CorpusError: missing archive (run the download stage); a truncated or
            corrupt archive, or a member that fails its CRC check (names the
            file: delete it and re-download); a missing member; non-UTF-8
            bytes (names the member and line).
    """
    raw = b"".join(itertools.chain.from_iterable(_zip_chunks(zip_path, member)))
    return _decode_utf8(raw, f"{zip_path}:{member}")


def _unequal(src_path: Path, n_src: int, tgt_path: Path, n_tgt: int) -> CorpusError:
    return CorpusError(
        f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}; "
        "the two sides of a split must be line-aligned"
    )


def iter_parallel(src_path: Path, tgt_path: Path, fix: str = _REDOWNLOAD) -> Iterator[Pair]:
    """Aligned pairs from two line-aligned files, streamed (both files read side by side).
    ``fix`` ends the message of a damaged ``.gz`` (re-download, or re-create a user's file).

    Raises:
        CorpusError: any error of :func:`iter_lines` (the source file's first); the two files
            have different line counts (found when one ends first; names both files and counts).
    """
    src, tgt = _normalized(src_path, fix), _normalized(tgt_path, fix)
    n = 0  # pairs so far; chunks hold _LINES lines but the last of a file
    for s in src:
        try:
            t = next(tgt)
        except StopIteration:  # the target ended first: count the source to its end
            raise _unequal(src_path, n + len(s) + _drain(src), tgt_path, n) from None
        except CorpusError:
            _drain(src)  # an error of the source file comes first, as when read whole
            raise
        if len(s) > len(t):  # the target ended in this chunk
            raise _unequal(src_path, n + len(s) + _drain(src), tgt_path, n + len(t))
        if len(s) < len(t):  # the source ended in this chunk
            raise _unequal(src_path, n + len(s), tgt_path, n + len(t) + _drain(tgt))
        n += len(s)
        yield from zip(s, t)
    if rest := _drain(tgt):
        raise _unequal(src_path, n, tgt_path, n + rest)


def read_parallel(src_path: Path, tgt_path: Path) -> list[Pair]:
    """Aligned pairs from two line-aligned files.

    Raises:
        CorpusError: as :func:`iter_parallel`.
    """
    return list(iter_parallel(src_path, tgt_path))


def read_multi30k(raw_dir: Path, split: str, src_lang: str, tgt_lang: str) -> list[Pair]:
    """Multi30k task 1 split (train, val, test_2016_flickr, test_2017_flickr) from ``raw_dir``."""
    raw_dir = Path(raw_dir)
    return read_parallel(raw_dir / f"{split}.{src_lang}.gz", raw_dir / f"{split}.{tgt_lang}.gz")


def iter_fra_eng(zip_path: Path, src_lang: str = "en", tgt_lang: str = "fr") -> Iterator[Pair]:
    """The pairs of D2L's ``fra-eng/fra.txt`` (``English<TAB>French`` per line), normalized,
    streamed from the archive; blank lines are skipped.

    Raises:
        CorpusError: other languages than en/fr; any error of :func:`read_zip_text`
            (missing, truncated or corrupt archive, no ``fra-eng/fra.txt``,
            non-UTF-8 bytes); a line without a tab (after the errors of the whole file).
    """
    if {src_lang, tgt_lang} != {"en", "fr"}:
        raise CorpusError(f"fra_eng has only en and fr; got src_lang={src_lang}, tgt_lang={tgt_lang}")
    chunks = _decoded(_zip_chunks(zip_path, "fra-eng/fra.txt"), f"{zip_path}:fra-eng/fra.txt")
    first = 1
    for lines in chunks:
        for i, line in enumerate(lines, first):
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) < 2:
                _drain(chunks)  # a corrupt archive or a bad byte comes first, as when read whole
                raise CorpusError(
                    f"{zip_path}:fra-eng/fra.txt line {i} has no tab separator; it is not "
                    f"D2L's English<TAB>French file: {_REDOWNLOAD}"
                )
            en, fr = normalize(cols[0]), normalize(cols[1])
            yield (en, fr) if src_lang == "en" else (fr, en)
        first += len(lines)


def read_fra_eng(zip_path: Path, src_lang: str = "en", tgt_lang: str = "fr") -> list[Pair]:
    """All pairs of D2L's ``fra-eng/fra.txt``: :func:`iter_fra_eng` as a list."""
    return list(iter_fra_eng(zip_path, src_lang, tgt_lang))


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


def index_array(n: int) -> array.array:
    """``0, 1, …, n - 1`` as an ``array.array`` of 4-byte unsigned ints (8-byte from 2³² on),
    the list of ``range(n)`` at a few bytes an item, for ``random.Random.shuffle``.
    View it with :func:`as_numpy`."""
    a = array.array("I" if n <= 2**32 else "Q", [0]) * n
    view = as_numpy(a)
    for start in range(0, n, 1 << 22):
        view[start : start + (1 << 22)] = np.arange(start, min(n, start + (1 << 22)), dtype=view.dtype)
    return a


def as_numpy(a: array.array) -> np.ndarray:
    """A writable numpy view of an :func:`index_array` (no copy)."""
    return np.frombuffer(a, dtype=np.uint32 if a.itemsize == 4 else np.uint64)


def heldout_order(n: int, num_val: int, num_test: int, seed: int) -> dict[str, np.ndarray]:
    """:func:`split_heldout` of ``n`` pairs as pair indices: ``test``, ``val`` and ``train``,
    each an unsigned int array of indices into the pairs, in the split's order.

    The same shuffle (``random.Random(seed).shuffle`` of ``range(n)``, Python's Fisher–Yates),
    done on an :func:`index_array` (4 bytes a pair) instead of a list of ints (about 36 bytes a
    pair): the same splits in the same order, for any ``n``. About 0.7 µs a pair on one core.
    """
    order = index_array(n)
    random.Random(seed).shuffle(order)
    idx = as_numpy(order)
    return {
        "test": idx[:num_test],
        "val": idx[num_test : num_test + num_val],
        "train": idx[num_test + num_val :],
    }


# --- a corpus streamed: the tokenize stage's passes --------------------------------------------


def _chunked(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


@dataclass
class SplitPlan:
    """One split of a corpus as :func:`scan_corpus` found it: how to read its pairs again.

    Attributes:
        read: a fresh stream of the normalized pairs of the split's file(s), in file order
            (a held-out split: of the file it is held out of).
        files: the file(s), for messages (also the key of their random-access copy).
        size: the number of pairs ``read`` gives.
        usable: the split's pairs with text on both sides.
        order: a held-out split's pairs as indices into ``read``'s, in the split's order (an
            unsigned int array); None: every pair of ``read``, in file order.
        usable_bits: bit i (little-endian within bytes) is set when pair i of ``read`` has text
            on both sides; what ``usable`` of a held-out split is counted from.
    """

    read: Callable[[], Iterator[Pair]]
    files: str
    size: int
    usable: int
    order: np.ndarray | None = None
    usable_bits: bytes = field(default=b"", repr=False)

    def __len__(self) -> int:
        return self.size if self.order is None else len(self.order)

    def held_out(self, num_val: int, num_test: int, seed: int) -> dict[str, SplitPlan]:
        """This split's pairs split as :func:`split_heldout` splits them (test, val, train)."""
        bits = np.frombuffer(self.usable_bits, dtype=np.uint8)
        parts = {}
        for name, idx in heldout_order(self.size, num_val, num_test, seed).items():
            # val and test are few: count their bits; train has the rest
            usable = int(((bits[idx >> 3] >> (idx & 7)) & 1).sum()) if name != "train" else 0
            parts[name] = SplitPlan(self.read, self.files, self.size, usable, idx, self.usable_bits)
        parts["train"].usable = self.usable - parts["val"].usable - parts["test"].usable
        return parts


def scan(read: Callable[[], Iterator[Pair]], files: str) -> SplitPlan:
    """Read the pairs ``read()`` streams once (raising their errors) and count them."""
    size = usable = 0
    bits = []
    for chunk in _chunked(read(), 1 << 16):  # a multiple of 8 pairs: whole bytes of bits
        flags = np.fromiter((bool(s and t) for s, t in chunk), bool, len(chunk))
        bits.append(np.packbits(flags, bitorder="little").tobytes())
        size, usable = size + len(chunk), usable + int(flags.sum())
    return SplitPlan(read, files, size, usable, None, b"".join(bits))


class PairStore:
    """Normalized pairs on disk, to read back in any order: ``<path>`` holds
    ``source<TAB>target\\n`` a pair (normalized text has neither tab nor newline), and
    ``<path>.idx`` their byte offsets (int64, N+1). Read with ``os.pread``: the pages read are
    the kernel's page cache, not this process's memory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._text = os.open(self.path, os.O_RDONLY)
        self._index = os.open(f"{self.path}.idx", os.O_RDONLY)

    @classmethod
    def write(cls, path: Path, pairs: Iterable[Pair]) -> PairStore:
        """Write ``pairs`` (file order) to ``path`` and ``path.idx``; the store to read them."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        end = 0
        with path.open("wb") as text, open(f"{path}.idx", "wb") as index:
            index.write(struct.pack("<q", 0))
            for chunk in _chunked(pairs, 1 << 16):
                lines = [f"{s}\t{t}\n".encode() for s, t in chunk]
                text.write(b"".join(lines))
                ends = end + np.cumsum(np.fromiter(map(len, lines), np.int64, len(lines)))
                index.write(ends.astype("<i8").tobytes())
                end = int(ends[-1])
        return cls(path)

    def get(self, indices: Iterable[int]) -> list[Pair]:
        """The pairs at ``indices`` (positions in the order written), in that order."""
        out = []
        for i in indices:
            start, end = struct.unpack("<qq", os.pread(self._index, 16, 8 * int(i)))
            s, t = os.pread(self._text, end - start - 1, start).decode("utf-8").split("\t")
            out.append((s, t))
        return out

    def close(self) -> None:
        os.close(self._text)
        os.close(self._index)


class StreamedCorpus:
    """The splits of a corpus after :func:`scan_corpus`'s checks, to read again as often as
    needed, each in its own order (a held-out split in :func:`split_heldout`'s).

    Attributes:
        splits: split name → :class:`SplitPlan`, in ``data.splits`` order.
        heldout: split name → pair count, for the splits held out of train.
    A held-out split is read through a random-access copy of its file (:class:`PairStore`)
    inside :meth:`random_access`; outside it, through a list of the file's pairs (small corpora,
    tests).
    """

    def __init__(self, splits: dict[str, SplitPlan], heldout: dict[str, int]):
        self.splits, self.heldout = splits, heldout
        self._stores: dict[str, PairStore] = {}

    @contextmanager
    def random_access(self, folder: Path):
        """Copy the file(s) of the held-out splits into ``folder`` for reading in their order;
        the copies are deleted at the end of the block. Each file is copied once."""
        folder = Path(folder)
        try:
            for plan in self.splits.values():
                if plan.order is not None and plan.files not in self._stores:
                    path = folder / f"{len(self._stores)}.pairs"
                    self._stores[plan.files] = PairStore.write(path, plan.read())
            yield self
        finally:
            for store in self._stores.values():
                store.close()
            self._stores.clear()
            shutil.rmtree(folder, ignore_errors=True)

    def chunks(self, name: str, size: int = 1 << 15) -> Iterator[list[Pair]]:
        """The pairs of split ``name`` in its order, ``size`` at a time (the last chunk fewer)."""
        plan = self.splits[name]
        if plan.order is None:
            yield from _chunked(plan.read(), size)
            return
        store = self._stores.get(plan.files)
        if store is None:
            every = list(plan.read())
            get = lambda idx: [every[i] for i in idx.tolist()]
        else:
            get = store.get
        for start in range(0, len(plan.order), size):
            yield get(plan.order[start : start + size])

    def pairs(self, name: str) -> Iterator[Pair]:
        """The pairs of split ``name`` in its order, one at a time."""
        for chunk in self.chunks(name):
            yield from chunk

    def lists(self) -> dict[str, list[Pair]]:
        """Every split as a list of pairs (small corpora, tests)."""
        return {name: list(self.pairs(name)) for name in self.splits}


# --- a user's own parallel corpus (data=parallel) -------------------------------------------

_PARALLEL_LAYOUTS = (
    "{split}.<src_lang> and {split}.<tgt_lang> (one sentence a line), or {split}.tsv (one "
    "source<TAB>target pair a line), each optionally gzip-compressed (.gz)"
)


def _one_of(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists; both is a CorpusError."""
    found = [p for p in (folder / name, folder / f"{name}.gz") if p.is_file()]
    if len(found) > 1:
        raise CorpusError(f"{folder} has both {name} and {name}.gz: keep one")
    return found[0] if found else None


def iter_tsv(path: Path) -> Iterator[Pair]:
    """Normalized (source, target) pairs of a ``source<TAB>target`` file (``.gz`` too), streamed.

    Raises:
        CorpusError: any error of :func:`read_text`; a line without exactly one tab (names the
            file and line; after the errors of the whole file).
    """
    chunks = _decoded(_file_chunks(path, _RECREATE), str(path))
    first = 1
    for lines in chunks:
        split = [line.split("\t") for line in lines]
        for i, cols in enumerate(split, first):
            if len(cols) != 2:
                _drain(chunks)  # a corrupt file or a bad byte comes first, as when read whole
                what = "has no tab" if len(cols) == 1 else f"has {len(cols) - 1} tabs"
                raise CorpusError(
                    f"{path}: line {i} {what}; each line must be source<TAB>target, with exactly "
                    "one tab (remove tabs inside a sentence, or split the file into "
                    "<split>.<src_lang> and <split>.<tgt_lang>)"
                )
        yield from ((" ".join(s.split()), " ".join(t.split())) for s, t in split)
        first += len(lines)


def _languages_in(folder: Path, stem: str) -> list[str]:
    """The language codes that files ``<stem>.<code>[.gz]`` in ``folder`` give."""
    codes = {p.name[len(stem) + 1 :].removesuffix(".gz") for p in folder.glob(f"{stem}.*")}
    return sorted(c for c in codes if c and c != "tsv" and "." not in c)


def _parallel_source(
    folder: Path, stem: str, src_lang: str, tgt_lang: str
) -> tuple[Callable[[], Iterator[Pair]], str] | None:
    """(a stream of the pairs, the files) of split ``stem`` of a parallel-corpus folder, or None
    when the folder has no file of that split; the layout is checked, not the content."""
    tsv = _one_of(folder, f"{stem}.tsv")
    src, tgt = _one_of(folder, f"{stem}.{src_lang}"), _one_of(folder, f"{stem}.{tgt_lang}")
    if tsv and (src or tgt):
        raise CorpusError(
            f"{folder} has split {stem!r} twice, as {tsv.name} and as {(src or tgt).name}: keep one layout"
        )
    if tsv:
        return functools.partial(iter_tsv, tsv), str(tsv)
    if src and tgt:
        return functools.partial(iter_parallel, src, tgt, fix=_RECREATE), f"{src} and {tgt}"
    langs = _languages_in(folder, stem)
    if not langs:
        return None
    missing = [lang for lang, p in ((src_lang, src), (tgt_lang, tgt)) if p is None]
    raise CorpusError(
        f"{folder} has split {stem!r} in the languages {', '.join(langs)}, not in "
        f"{' and '.join(missing)} (no {stem}.{missing[0]}): set src_lang/tgt_lang to two of "
        f"{', '.join(langs)} (`dvc exp run -S src_lang=... -S tgt_lang=...`, or "
        "data.src_lang=/data.tgt_lang= on the command line), or rename the files"
    )


def _empty_split(stem: str, files: str) -> CorpusError:
    return CorpusError(f"split {stem!r} is empty ({files} has no line): add pairs or delete it")


def scan_parallel_corpus(data_cfg, folder: Path) -> StreamedCorpus:
    """:func:`scan_corpus` of a user's parallel corpus (``conf/data/parallel.yaml``) in ``folder``.

    ``data_cfg.splits`` maps train/val/test (and any further test split) to file stems.
    A missing val or test is held out from train (:func:`split_heldout`'s split, with
    ``data_cfg.heldout``).

    Raises:
        CorpusError: the folder or its train split is missing (names the layouts), held-out
            splits that would take every training pair, or any error of
            :func:`iter_tsv` or :func:`iter_parallel` (both layouts for one split; one side
            without the other; a language code the file names lack, naming the ones they have;
            an empty split; unequal line counts; non-UTF-8 bytes); the splits are read in
            order, none past the first error.
    """
    folder = Path(folder)
    src_lang, tgt_lang = data_cfg.src_lang, data_cfg.tgt_lang
    if src_lang == tgt_lang:
        raise CorpusError(f"src_lang and tgt_lang are both {src_lang}: choose two different languages")
    if not folder.is_dir():
        raise CorpusError(
            f"data.path={folder} is not a folder; point data.path (params.yaml: data_path) at "
            f"the folder of your corpus, which holds {_PARALLEL_LAYOUTS.format(split='<split>')}"
        )
    read: dict[str, SplitPlan | None] = {}
    for k, stem in data_cfg.splits.items():
        source = _parallel_source(folder, stem, src_lang, tgt_lang)
        read[k] = None if source is None else scan(*source)
        if read[k] is not None and read[k].size == 0:
            raise _empty_split(stem, source[1])
    if read.get("train") is None:
        layouts = _PARALLEL_LAYOUTS.format(split=data_cfg.splits.train)
        raise CorpusError(f"{folder} has no training split: it needs {layouts}")
    absent = [k for k in ("val", "test") if read.get(k) is None]
    extra = [k for k, v in read.items() if v is None and k not in absent]
    if extra:
        stems = ", ".join(data_cfg.splits[k] for k in extra)
        raise CorpusError(f"{folder} has no file of the split(s) {stems} that data.splits names")
    heldout = {}
    if absent:
        h, train = data_cfg.heldout, read["train"]
        sizes = {"val": h.num_val if "val" in absent else 0, "test": h.num_test if "test" in absent else 0}
        if sum(sizes.values()) >= train.size:
            asked = " + ".join(f"data.heldout.num_{k}={n}" for k, n in sizes.items() if n)
            raise CorpusError(
                f"{folder} has no {' and no '.join(absent)} split, and holding out {asked} pairs "
                f"from its {train.size} training pairs leaves none to train on: lower "
                f"them, or add {' and '.join(data_cfg.splits[k] for k in absent)} files"
            )
        parts = train.held_out(sizes["val"], sizes["test"], h.seed)
        read["train"] = parts["train"]
        for k in absent:
            read[k], heldout[k] = parts[k], len(parts[k])
    return StreamedCorpus(dict(read), heldout)


def read_parallel_corpus(data_cfg, folder: Path) -> tuple[dict[str, list], dict[str, int]]:
    """The splits of a user's parallel corpus (``conf/data/parallel.yaml``) in ``folder``, as
    lists: (split → pairs, split → held-out pair count for the held-out ones). See
    :func:`scan_parallel_corpus`, which this reads through.

    Raises:
        CorpusError: as :func:`scan_parallel_corpus`.
    """
    corpus = scan_parallel_corpus(data_cfg, folder)
    return corpus.lists(), corpus.heldout


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


def corpus_folder(cfg) -> Path:
    """The folder a corpus is read from: ``cfg.data.path`` (relative to ``cfg.paths.root``),
    or ``cfg.paths.raw`` (the download stage's) for a config without ``path``.

    Raises:
        CorpusError: ``data=parallel`` without ``data.path``, or with the download folder
            (``params.yaml``'s default ``data_path``, left unset).
    """
    root, path = Path(cfg.paths.root), cfg.data.get("path")
    raw = (root / cfg.paths.raw).resolve()
    if cfg.data.name == "parallel" and (path is None or (root / path).resolve() == raw):
        raise CorpusError(
            "data=parallel needs the folder of your corpus"
            + ("" if path is None else f", not the download folder {path}")
            + ": set data.path=/my/corpus (under DVC: "
            "`dvc exp run -S data=parallel -S data_path=/my/corpus`)"
        )
    return root / (path or cfg.paths.raw)


def scan_corpus(data_cfg, folder: Path) -> StreamedCorpus:
    """The train/val/test splits that a ``conf/data/*.yaml`` config names, in ``folder``
    (:func:`corpus_folder`), read once through every check and counted: the first pass of the
    tokenize stage, which writes nothing. The :class:`StreamedCorpus` reads them again.

    ``data_cfg.name`` is ``multi30k`` (splits from ``data_cfg.splits``), ``fra_eng``
    (held-out splits by ``data_cfg.heldout``) or ``parallel`` (:func:`scan_parallel_corpus`).
    Memory: a bit a pair, plus (held-out splits) 4 bytes a pair for their order.

    Raises:
        CorpusError: the pair is not one the corpus has (see :func:`check_languages`),
            an unknown corpus, or any error reading its files.
    """
    folder = Path(folder)
    if data_cfg.name == "parallel":
        return scan_parallel_corpus(data_cfg, folder)
    check_languages(data_cfg)
    src_lang, tgt_lang = data_cfg.src_lang, data_cfg.tgt_lang
    if data_cfg.name == "multi30k":
        splits = {}
        for k, split in data_cfg.splits.items():
            src, tgt = (folder / "multi30k" / f"{split}.{lang}.gz" for lang in (src_lang, tgt_lang))
            splits[k] = scan(functools.partial(iter_parallel, src, tgt), f"{src} and {tgt}")
        return StreamedCorpus(splits, {})
    if data_cfg.name == "fra_eng":
        zip_path = folder / "fra-eng.zip"
        whole = scan(functools.partial(iter_fra_eng, zip_path, src_lang, tgt_lang), str(zip_path))
        h = data_cfg.heldout
        parts = whole.held_out(h.num_val, h.num_test, h.seed)
        splits = {k: parts[k] for k in ("train", "val", "test")}
        return StreamedCorpus(splits, {k: len(splits[k]) for k in ("val", "test")})
    raise CorpusError(f"unknown corpus {data_cfg.name!r}; use data=multi30k, data=fra_eng or data=parallel")
