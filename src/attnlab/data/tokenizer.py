"""Sentencepiece tokenizer: train on the training split, encode splits to compact arrays.

Special ids are fixed and distinct (sentencepiece's default pad_id is -1,
which ``nn.Embedding(padding_idx=-1)`` would read as the last row):
``PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3`` (defined in :mod:`attnlab.data.special_tokens`,
importable from here too).

An encoded split is four ``.npy`` files, two a side (``src``, ``tgt``):
``{split}.{side}.ids.npy``, int32, every sentence's ids concatenated (no bos/eos), and
``{split}.{side}.offsets.npy``, int64, the N+1 boundaries (sentence i is
``ids[offsets[i]:offsets[i + 1]]``). The tokenize stage writes them once, a chunk of
sentences at a time; training memory-maps them (:func:`load_split`, ``np.load(...,
mmap_mode="r")``) and reads them with no re-parsing and no per-sentence object
(nanoGPT's ``prepare`` scheme).

Training pairs are filtered by one rule, :func:`filter_pairs`: a pair is dropped
when either side is empty after normalization, or has ``max_len`` or more
tokens (``data.max_len``, the same bound as
:class:`attnlab.data.batching.PairDataset`). Val and test pairs are all kept.

:func:`tokenize_sentencepiece` is the tokenize stage of the sentencepiece corpora
(``conf/data/{multi30k,fra_eng,parallel}.yaml`` name it in ``tokenize``). It streams the
corpus (:func:`attnlab.data.corpora.scan_corpus`): one pass checks every file, a second
trains sentencepiece (on a sample of ``data.input_sentence_size`` sentences, or all), a
third encodes chunks of pairs on every core and appends their ids to the arrays. Its memory
does not grow with the corpus beyond a few bytes a pair (held-out splits' order) and
sentencepiece's sample. The models it writes load
as :class:`SentencePieceTokenizer` (:func:`load_sentencepiece`), which answers the same
tokenizer interface as D2L's word vocabularies (:class:`attnlab.data.d2l.D2LTokenizer`).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from attnlab.data.corpora import (
    Pair,
    StreamedCorpus,
    TokenizeError,
    TokenizeReport,
    corpus_folder,
    scan_corpus,
)
from attnlab.data.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnlab.errors import DamagedFileError, MissingFileError, UserError, brief
from attnlab.files import staged_dir, write_bytes_atomic, write_json_atomic, write_text_atomic

# sentencepiece's RuntimeError texts for a vocabulary size the corpus cannot give.
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")
# Han, kana and Hangul: the scripts with thousands of characters, for which sentencepiece
# recommends character_coverage 0.9995 (its README, "Train SentencePiece Model").
_CJK = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
    "\uf900-\ufaff\U00020000-\U0003134f]"
)
CJK_COVERAGE, FULL_COVERAGE = 0.9995, 1.0


class VocabSizeError(UserError, ValueError):
    """``data.vocab_size`` does not fit the training corpus (too large or too small)."""


def _vocab_size_error(e: RuntimeError, vocab_size: int) -> VocabSizeError | None:
    """The user-facing error for sentencepiece's vocabulary-size RuntimeError, else None."""
    if m := _TOO_HIGH.search(str(e)):
        most = int(m.group(2))
        return VocabSizeError(
            f"data.vocab_size={vocab_size} is too large for this training corpus: sentencepiece "
            f"can make at most {most} pieces from it; set data.vocab_size={most} (or less), "
            "or train on a larger corpus"
        )
    if m := _TOO_LOW.search(str(e)):
        least = int(m.group(2))
        return VocabSizeError(
            f"data.vocab_size={vocab_size} is too small for this training corpus: its characters "
            f"and the 4 special pieces alone need {least}; set data.vocab_size={least} (or more)"
        )
    return None


def choose_character_coverage(sentences: Iterable[str], sample: int = 100_000) -> float:
    """sentencepiece's ``character_coverage`` for the scripts ``sentences`` use:
    :data:`CJK_COVERAGE` (0.9995) when Han, kana or Hangul make up at least 1% of the
    non-space characters of the first ``sample`` sentences, else :data:`FULL_COVERAGE` (1.0),
    as sentencepiece's README recommends (Kudo & Richardson 2018). ``sentences``: any
    iterable; only the first ``sample`` are read."""
    text = "".join(itertools.islice(sentences, sample))
    letters = len(text) - text.count(" ")
    return CJK_COVERAGE if letters and len(_CJK.findall(text)) >= 0.01 * letters else FULL_COVERAGE


def train_sentencepiece(
    sentences: Iterable[str],
    model_prefix: Path,
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    seed_sentencepiece_size: int = 1_000_000,
    hard_vocab_limit: bool = False,
    input_sentence_size: int = 0,
    num_sentences: int | None = None,
) -> SentencePieceTokenizer:
    """Train a sentencepiece model on ``sentences`` (any iterable, read once, in order: a
    stream from disk holds no sentence list); writes ``<prefix>.model`` and ``.vocab``.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): a corpus
    too small for it gives fewer pieces (``get_piece_size()``), so a tiny
    corpus still trains. With ``hard_vocab_limit=True`` it is exact.
    Empty sentences are skipped. ``input_sentence_size`` > 0 trains on a sample of that many
    sentences (0: all; sentencepiece holds what it trains on, so the sample bounds its memory):
    the sentences at positions ``random.Random(0).sample(range(num_sentences), k)``, taken from
    the stream in their order, the same in every process. (sentencepiece's own sampling,
    ``shuffle_input_sentence``, draws another sample in every process whatever
    ``set_random_generator_seed`` says; it is still asked for when the sample is everything,
    where it changes nothing, so such models keep their bytes.) ``num_sentences``: how many
    non-empty sentences ``sentences`` gives, when known (the tokenize stage counts them in its
    first pass); else they are gathered in a list to count them. Returns the loaded model
    (:func:`load_sentencepiece`).
    The model is trained in memory and written at the end (``.vocab`` first, as sentencepiece
    writes it: a line ``piece<TAB>score`` per id), each file whole or not at all. It records
    neither a path (``trainer_spec.model_prefix`` is empty) nor this machine's thread count
    (``num_threads``, which changes no piece), so the same sentences and settings give the same
    bytes in any folder on any machine: DVC then sees an unchanged tokenizer.
    Raises:
        ValueError: on an empty training corpus.
        VocabSizeError: ``vocab_size`` below the corpus's characters plus the
            4 special pieces, or (``hard_vocab_limit=True``) above what the
            corpus gives; names ``data.vocab_size`` and the size that works.
    """
    sentences = (s for s in sentences if s)
    sample = {}
    if input_sentence_size > 0:
        if num_sentences is None:
            sentences = list(sentences)
            num_sentences = len(sentences)
        if num_sentences > input_sentence_size:
            sentences = _sample(sentences, num_sentences, input_sentence_size)
        else:  # all of them: sentencepiece's options as ever (its sample is everything)
            spm.set_random_generator_seed(0)
            sample = {"input_sentence_size": input_sentence_size, "shuffle_input_sentence": True}
    sentences = iter(sentences)
    first = next(sentences, None)
    if first is None:
        raise ValueError("cannot train sentencepiece on an empty training split")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            hard_vocab_limit=hard_vocab_limit,
            seed_sentencepiece_size=seed_sentencepiece_size,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
            **sample,
        )
    except RuntimeError as e:
        if (err := _vocab_size_error(e, vocab_size)) is not None:
            raise err from None
        raise
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(model.getvalue())
    proto.trainer_spec.ClearField("num_threads")  # this machine's cores: the pieces do not depend on it
    model_prefix = Path(model_prefix)
    write_text_atomic(
        model_prefix.with_name(model_prefix.name + ".vocab"),
        "".join(f"{p.piece}\t{p.score:g}\n" for p in proto.pieces),
    )
    path = write_bytes_atomic(model_prefix.with_name(model_prefix.name + ".model"), proto.SerializeToString())
    return load_sentencepiece(path)


def _sample(sentences: Iterable[str], n: int, k: int) -> Iterator[str]:
    """The ``k`` of the ``n`` items of ``sentences`` at positions ``random.Random(0).sample``
    chooses, in stream order; holds the k positions (8 bytes each), not the sentences."""
    chosen = np.sort(np.fromiter(random.Random(0).sample(range(n), k), np.int64, k))
    ends = np.searchsorted(chosen, np.arange(0, n + (1 << 16), 1 << 16))
    stream = iter(sentences)
    for block, start in enumerate(range(0, n, 1 << 16)):
        picked = set((chosen[ends[block] : ends[block + 1]] - start).tolist())
        for i, s in enumerate(itertools.islice(stream, 1 << 16)):
            if i in picked:
                yield s


def pad_sources(seqs: list[list[int]]):
    """Source id lists (no <eos>) → (src (B, S), src_valid_lens (B,)), int64 tensors.

    Each row is its ids, then <eos>, then <pad> up to S = the longest + 1; its valid length
    counts the <eos>. A row depends on its own ids alone (only its padding on the batch).
    """
    import torch  # here: loading a sentencepiece model needs no torch

    seqs = [list(ids) + [EOS_ID] for ids in seqs]
    src = torch.full((len(seqs), max((len(s) for s in seqs), default=1)), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.tensor(s)
    return src, torch.tensor([len(s) for s in seqs], dtype=torch.long)


class SentencePieceTokenizer(spm.SentencePieceProcessor):
    """A sentencepiece model (joint source/target vocabulary) with the project's tokenizer
    interface, which :class:`attnlab.data.d2l.D2LTokenizer` answers too:

    ``fixed_length`` (False: sources are as long as their sentence, batches padded to the
    longest; the data are id arrays, ``{split}.{src,tgt}.{ids,offsets}.npy``, see the module
    docstring);
    ``encode_sources(sentences)`` → (src (B, S), src_valid_lens (B,)) int64, the model's
    input; ``source_vocab_size()`` (None: the source shares the target's vocabulary);
    ``source_id_to_piece(i)``; and, for the target side, ``decode``, ``id_to_piece`` and
    ``get_piece_size`` (sentencepiece's own, as are ``encode`` and the rest).
    Load one with :func:`load_sentencepiece`. It pickles as sentencepiece's processor does
    (the serialized model).
    """

    fixed_length = False

    def encode_sources(self, sentences):
        """Sentences → :func:`pad_sources` of their ids: each sentence's ids and <eos>, <pad>
        to the longest + 1; (src (B, S), src_valid_lens (B,)), int64."""
        return pad_sources(self.encode(list(sentences)))

    def source_vocab_size(self) -> None:
        """None: one joint vocabulary (``get_piece_size()``) for source and target."""
        return None

    def source_id_to_piece(self, i: int) -> str:
        """The piece of source id ``i`` (the joint vocabulary's)."""
        return self.id_to_piece(int(i))


def load_sentencepiece(path) -> SentencePieceTokenizer:
    """Load a model and check its special ids are this project's (pad ≥ 0, all distinct).

    Raises:
        ValueError: if the model was trained with other special ids.
    """
    sp = SentencePieceTokenizer(model_file=str(path))
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise DamagedFileError(
            f"{path}: special ids (pad, unk, bos, eos) = {ids}, expected "
            f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; retrain with src/tokenize_data.py"
        )
    return sp


def load_tokenizer(tokenized_dir: Path):
    """The tokenizer the tokenize stage wrote into ``tokenized_dir``.

    ``spm.model`` (sentencepiece, every corpus but one) or ``vocab.json``
    (D2L's word vocabularies, ``data=fra_eng_d2l``, see :mod:`attnlab.data.d2l`).
    Raises:
        FileNotFoundError: if neither exists (names the stage to run).
    """
    d = Path(tokenized_dir)
    if (d / "vocab.json").exists():
        # Imported here: d2l brings torch, which sentencepiece users need not load. d2l takes
        # its ids from attnlab.data.special_tokens, never from this module (no import cycle).
        from attnlab.data.d2l import D2LTokenizer

        return D2LTokenizer.load(d / "vocab.json")
    if (d / "spm.model").exists():
        return load_sentencepiece(d / "spm.model")
    raise MissingFileError(
        f"no tokenizer (spm.model or vocab.json) in {d}; run "
        "`python src/tokenize_data.py` (or `dvc repro tokenize`) with the same data= option"
    )


class PackedIds:
    """N id sequences packed in two arrays: sequence i is ``ids[offsets[i]:offsets[i + 1]]``.

    The layout of one side of an encoded split (module docstring): ``ids`` int32, every
    sequence concatenated; ``offsets`` int64, N+1 boundaries from 0. :func:`load_split` gives
    them memory-mapped; item i is then a view of the map (no copy, no per-sequence object).
    ``index`` (optional, an int array) selects and orders sequences: item i is sequence
    ``index[i]`` (:meth:`select`). :meth:`read` fetches many items at once, from the files.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, index: np.ndarray | None = None):
        self.ids, self.offsets, self.index = ids, offsets, index
        self._files = None  # (ids file, offsets file), opened by read() for memory-mapped arrays

    @classmethod
    def pack(cls, seqs: Iterable[Sequence[int]]) -> PackedIds:
        """Id sequences (lists or arrays) packed into in-memory arrays."""
        seqs = list(seqs)
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, seqs), np.int64, len(seqs)), out=offsets[1:])
        ids = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(offsets[-1]))
        return cls(ids, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1 if self.index is None else len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sequence {i} of {n}")
        j = i % n if self.index is None else int(self.index[i])
        return self.ids[self.offsets[j] : self.offsets[j + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def read(self, items: Sequence[int]) -> list[np.ndarray]:
        """Items ``items`` (non-negative) as int32 arrays, in that order: what a DataLoader
        fetches a batch at a time (:meth:`attnlab.data.batching.PairDataset.__getitems__`).

        From memory-mapped arrays they are read from their files with ``os.pread``, two reads
        an item (its two offsets, its ids): the kernel's page cache serves them, and nothing is
        mapped into this process. (Pages of a memory map count in the process's RSS once
        touched, and Linux maps a whole large folio of the page cache per touch, about 0.6 MB on
        the machine measured: random batches would map the whole file within a few hundred
        steps. The reads cost about the same: 5 µs an item from the page cache.) Else slices.
        """
        rows = np.asarray(items, dtype=np.int64)
        rows = rows if self.index is None else self.index[rows].astype(np.int64)
        if not (isinstance(self.ids, np.memmap) and isinstance(self.offsets, np.memmap)):
            return [self.ids[self.offsets[j] : self.offsets[j + 1]] for j in rows.tolist()]
        if self._files is None:
            paths = [a.filename for a in (self.ids, self.offsets)]
            # kept open for every later read; closed with the object (and not pickled)
            self._files = tuple(open(f, "rb", buffering=0) for f in paths)  # noqa: SIM115 - kept open
        (ids, offsets), out = (f.fileno() for f in self._files), []
        size, off_dtype = self.ids.itemsize, self.offsets.dtype
        ids_base, off_base = self.ids.offset, self.offsets.offset + self.offsets.itemsize * rows
        for base in off_base.tolist():
            start, end = np.frombuffer(os.pread(offsets, 16, base), off_dtype).tolist()
            out.append(
                np.frombuffer(os.pread(ids, size * (end - start), ids_base + size * start), self.ids.dtype)
            )
        return out

    def select(self, index: np.ndarray) -> PackedIds:
        """The sequences ``index`` (positions in this one), as a view of the same arrays."""
        index = np.asarray(index)
        return PackedIds(self.ids, self.offsets, index if self.index is None else self.index[index])

    def lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Lengths (int64) of the items ``start`` to ``stop`` (all by default): ``np.diff`` of
        the offsets. Memory-mapped offsets are read from their file with plain reads (the page
        cache holds them, not this process), a slice at a time; the result is the only array
        this keeps."""
        stop = len(self) if stop is None else stop
        if self.index is not None:
            index = self.index[start:stop].astype(np.int64)
            return self._offsets(index + 1) - self._offsets(index)
        return np.diff(self._offsets(slice(start, stop + 1)))

    def _offsets(self, where) -> np.ndarray:
        off = self.offsets
        if not isinstance(off, np.memmap) or off.filename is None or isinstance(where, np.ndarray):
            return np.asarray(off[where], dtype=np.int64)
        start, stop, _ = where.indices(len(off))
        with open(off.filename, "rb") as f:
            f.seek(off.offset + start * off.itemsize)
            return np.fromfile(f, dtype=off.dtype, count=max(0, stop - start)).astype(np.int64, copy=False)

    def __getstate__(self):
        # a memory map pickles as a copy of the file: pickle its path instead (DataLoader
        # workers started with spawn reopen it)
        state = dict(self.__dict__, _files=None)
        for k in ("ids", "offsets"):
            a = state[k]
            if isinstance(a, np.memmap) and a.filename is not None:
                state[k] = ("memmap", a.filename)
        return state

    def __setstate__(self, state):
        for k in ("ids", "offsets"):
            if isinstance(state[k], tuple) and state[k][0] == "memmap":
                state[k] = np.load(state[k][1], mmap_mode="r")
        self.__dict__.update(state)


class NpyWriter:
    """A 1-D ``.npy`` file written a slice at a time: numpy's header first (which leaves room
    for the length to grow: ``numpy.lib.format.GROWTH_AXIS_MAX_DIGITS``), the data appended,
    the header rewritten in place with the final length by :meth:`close`."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype, self.size = Path(path), np.dtype(dtype), 0
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close(), after the header
        self._header_len = self._write_header()

    def _write_header(self) -> int:
        self._file.seek(0)
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.size,),
        }
        np.lib.format.write_array_header_1_0(self._file, header)
        return self._file.tell()

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self._file.write(values.data)
        self.size += len(values)

    def close(self) -> None:
        if self._file.closed:
            return
        end = self._file.tell()
        if self._write_header() != self._header_len:  # numpy's header has room for 21 digits
            raise RuntimeError(f"{self.path}: the .npy header changed length")
        self._file.seek(end)
        self._file.close()


SIDES = ("src", "tgt")


def split_files(prefix: Path) -> dict[str, Path]:
    """The four files of the encoded split ``prefix`` (e.g. ``data/tokenized/x/train``):
    ``{"src.ids": <prefix>.src.ids.npy, "src.offsets": …, "tgt.ids": …, "tgt.offsets": …}``."""
    prefix = Path(prefix)
    return {
        f"{side}.{kind}": prefix.with_name(f"{prefix.name}.{side}.{kind}.npy")
        for side in SIDES
        for kind in ("ids", "offsets")
    }


class SplitWriter:
    """The four arrays of an encoded split (module docstring), written a chunk of pairs at a
    time; the files are complete once :meth:`close` (or the ``with`` block) ends."""

    def __init__(self, prefix: Path):
        files = split_files(prefix)
        self._ids = {side: NpyWriter(files[f"{side}.ids"], np.int32) for side in SIDES}
        self._offsets = {side: NpyWriter(files[f"{side}.offsets"], np.int64) for side in SIDES}
        self._end = dict.fromkeys(SIDES, 0)
        for w in self._offsets.values():
            w.append(np.zeros(1, dtype=np.int64))

    def append(self, side: str, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append sequences of one side: their ids concatenated and their lengths."""
        self._ids[side].append(ids)
        self._offsets[side].append(self._end[side] + np.cumsum(lengths, dtype=np.int64))
        self._end[side] += int(np.sum(lengths, dtype=np.int64))

    def close(self) -> None:
        for w in (*self._ids.values(), *self._offsets.values()):
            w.close()

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _flat(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists → (ids concatenated, int32; lengths, int64)."""
    lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(lengths.sum())), lengths


def encode_pairs(
    sp: spm.SentencePieceProcessor, pairs: list[Pair], num_threads: int | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """(source id lists, target id lists) of (source, target) text pairs, no bos/eos.
    ``num_threads``: sentencepiece's encoding threads (default: one a core)."""
    src, tgt = zip(*pairs) if pairs else ((), ())
    threads = num_threads or os.cpu_count() or 1
    return sp.encode(list(src), num_threads=threads), sp.encode(list(tgt), num_threads=threads)


def filter_mask(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, dict]:
    """:func:`filter_pairs`'s rule on token counts (int arrays, one per pair): (bool mask of the
    kept pairs, ``{"pairs", "empty", "too_long", "kept"}`` counts).

    Raises:
        ValueError: if ``max_len`` < 2 or the two sides differ in length.
    """
    if max_len < 2:
        raise ValueError(f"data.max_len must be ≥ 2 (a token plus <eos>), got {max_len}")
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source but {len(tgt_lengths)} target sentences")
    empty = (src_lengths == 0) | (tgt_lengths == 0)
    too_long = ~empty & ((src_lengths >= max_len) | (tgt_lengths >= max_len))
    keep = ~(empty | too_long)
    counts = {"pairs": len(keep), "empty": int(empty.sum()), "too_long": int(too_long.sum())}
    return keep, {**counts, "kept": int(keep.sum())}


def filter_pairs(
    src: list[list[int]], tgt: list[list[int]], max_len: int
) -> tuple[list[int], dict[str, int]]:
    """The tokenize stage's rule for training pairs: which to keep, and why the others went.

    A pair is dropped when either side has no tokens, i.e. its line was empty
    (or only spaces) after normalization: counted as ``empty``; otherwise when
    either side has ``max_len`` or more tokens (bos/eos not counted, as in
    :class:`attnlab.data.batching.PairDataset`): counted as ``too_long``.
    Returns (indices of the kept pairs in order, ``{"pairs": read, "empty": n,
    "too_long": n, "kept": n}``) with ``pairs == empty + too_long + kept``. The tokenize stage
    applies it to a chunk's token counts (:func:`filter_mask`).
    Raises:
        ValueError: if ``max_len`` < 2 or the two sides differ in length.
    """
    lengths = [np.fromiter(map(len, side), np.int64, len(side)) for side in (src, tgt)]
    keep, counts = filter_mask(*lengths, max_len)
    return np.flatnonzero(keep).tolist(), counts


def write_split(prefix: Path, src: Iterable[Sequence[int]], tgt: Iterable[Sequence[int]]) -> None:
    """Write encoded pairs as the split ``prefix`` (its four ``.npy`` files, :func:`split_files`),
    in one go: for small splits (the tokenize stage appends chunks with :class:`SplitWriter`)."""
    with SplitWriter(prefix) as w:
        for side, seqs in zip(SIDES, (src, tgt)):
            packed = PackedIds.pack(seqs)
            w.append(side, packed.ids, np.diff(packed.offsets))


def encode_split(sp: spm.SentencePieceProcessor, pairs: list[Pair], prefix: Path) -> None:
    """Encode (source, target) pairs and write them as the split ``prefix``, unfiltered."""
    write_split(prefix, *encode_pairs(sp, pairs))


def load_split(prefix: Path, vocab_sizes: tuple[int, int] | None = None) -> tuple[PackedIds, PackedIds]:
    """The encoded split ``prefix`` (e.g. ``data/tokenized/multi30k-en-fr/train``),
    memory-mapped: (source ids, target ids), each a :class:`PackedIds` whose item i is
    sentence i's id array (a view of the map). The offsets are read to check them; with
    ``vocab_sizes`` (source, target) the ids too, a chunk at a time.

    Raises:
        FileNotFoundError: naming the stage to run when the split is missing (or is in the
            ``{split}.npz`` format of earlier versions).
        DamagedFileError: a file that is no array of its kind, offsets that do not fit the
            ids, or an id outside the vocabulary (a ``ValueError``; names the file and the
            stage to re-run).
    """
    prefix = Path(prefix)
    files = split_files(prefix)
    rerun = "run `python src/tokenize_data.py` (or `dvc repro tokenize`) with the same data= option"
    if missing := [p for p in files.values() if not p.exists()]:
        if prefix.with_name(prefix.name + ".npz").exists():
            raise MissingFileError(
                f"{prefix.parent} holds split {prefix.name!r} in an earlier format "
                f"({prefix.name}.npz), not {missing[0].name}; {rerun} again"
            )
        raise MissingFileError(f"{missing[0]} not found; {rerun} first")
    arrays = {}
    for key, path in files.items():
        try:
            arrays[key] = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:  # cut short, a damaged header, zeros
            raise DamagedFileError(f"{path} is damaged ({brief(e)}); {rerun} again") from e
    sides = [PackedIds(arrays[f"{side}.ids"], arrays[f"{side}.offsets"]) for side in SIDES]
    for i, (side, packed) in enumerate(zip(SIDES, sides)):
        off = packed.offsets
        if (
            packed.ids.dtype != np.int32
            or off.dtype != np.int64
            or off.ndim != 1
            or len(off) < 1
            or off[0] != 0
            or off[-1] != len(packed.ids)
            or not _ascending(off)
        ):
            raise DamagedFileError(
                f"{files[side + '.offsets']} does not fit {files[side + '.ids']}; {rerun} again"
            )
        if vocab_sizes is not None and (bad := _outside(packed.ids, vocab_sizes[i])) is not None:
            raise DamagedFileError(
                f"{files[side + '.ids']} is damaged: it holds the id {bad}, outside the vocabulary "
                f"of {vocab_sizes[i]} pieces; {rerun} again"
            )
    if len(sides[0]) != len(sides[1]):
        raise DamagedFileError(
            f"{prefix}: {len(sides[0])} source but {len(sides[1])} target sentences; {rerun} again"
        )
    return sides[0], sides[1]


_CHUNK = 1 << 22  # elements per read of a memory-mapped array (16 MiB of int32)


def _ascending(offsets: np.ndarray) -> bool:
    """Whether ``offsets`` never decreases, read a chunk at a time."""
    return all(
        bool(np.all(np.diff(offsets[start : start + _CHUNK + 1]) >= 0))
        for start in range(0, max(len(offsets) - 1, 1), _CHUNK)
    )


def _outside(ids: np.ndarray, vocab_size: int) -> int | None:
    """The first id of ``ids`` outside ``[0, vocab_size)``, read a chunk at a time; None if none."""
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        if chunk.size and (int(chunk.min()) < 0 or int(chunk.max()) >= vocab_size):
            return int(chunk[(chunk < 0) | (chunk >= vocab_size)][0])
    return None


# What stats.json says of the filtering rule.
FILTER_RULE = (
    "training pairs with an empty side (after normalization) or with max_len or more "
    "sentencepiece tokens on a side are dropped; val and test keep every pair"
)


def _empty_train_fix(cfg) -> str:
    """What to change when the training split has no usable pair."""
    c = cfg.data
    if c.name == "multi30k":
        return (
            f"Check {cfg.paths.raw}/multi30k/{c.splits.train}.{{{c.src_lang},{c.tgt_lang}}}.gz "
            "(delete them and re-run `dvc repro download`) and data.splits.train"
        )
    if c.name == "parallel":
        return f"Check the training files of {corpus_folder(cfg)} (data.path) and data.splits.train"
    return (
        f"Check {cfg.paths.raw}/fra-eng.zip (delete it and re-run `dvc repro download`) and "
        f"data.heldout (num_val={c.heldout.num_val} + num_test={c.heldout.num_test} pairs "
        "are held out before training gets any)"
    )


def corpus_path_tag(cfg) -> dict[str, str]:
    """The MLflow tag ``corpus_path``: the folder of a user's corpus (``data=parallel``) that
    ``cfg.paths.tokenized`` was made from, as its ``stats.json`` records it (two folders of one
    language pair share that tokenized folder); ``{}`` for the other corpora."""
    stats = Path(cfg.paths.tokenized) / "stats.json"
    if cfg.data.name != "parallel" or not stats.is_file():
        return {}
    path = json.loads(stats.read_text()).get("corpus_path")
    return {} if path is None else {"corpus_path": path}


def _tokenizer_from(path: str, out: Path) -> SentencePieceTokenizer:
    """Copy the sentencepiece model ``path`` (and its ``.vocab``, rebuilt) to ``out``/spm.*.

    Raises:
        TokenizeError: ``path`` is missing or is not one of this project's sentencepiece models.
    """
    path = Path(path)
    if not path.is_file():
        raise TokenizeError(
            f"data.tokenizer_from={path} does not exist; name the spm.model of the parent "
            "model's tokenized folder (data/tokenized/<data>-<src>-<tgt>/spm.model)"
        )
    try:
        sp = load_sentencepiece(path)
    except (OSError, RuntimeError, ValueError) as e:
        raise TokenizeError(f"data.tokenizer_from={path} is not a usable sentencepiece model: {e}") from None
    write_text_atomic(
        out / "spm.vocab",
        "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())),
    )
    return load_sentencepiece(write_bytes_atomic(out / "spm.model", path.read_bytes()))


def _train_sentences(corpus: StreamedCorpus) -> Iterator[str]:
    """The training split's sentences for sentencepiece, streamed in the split's order: source
    then target of each pair with text on both sides."""
    for s, t in corpus.pairs("train"):
        if s and t:
            yield s
            yield t


def _write_split(
    sp: spm.SentencePieceProcessor,
    chunks: Iterable[list[Pair]],
    prefix: Path,
    max_len: int,
    keep_filtered: bool,
    text: bool,
) -> dict[str, int]:
    """Encode the pairs of ``chunks`` a chunk at a time (sentencepiece's threads, one a core)
    and append their ids to the split ``prefix`` (:class:`SplitWriter`); with ``keep_filtered``
    only the pairs :func:`filter_mask` keeps. ``text``: also write the pairs' normalized text
    (``<prefix>.src.txt``, ``<prefix>.tgt.txt``, a line each). Returns the filter's counts over
    all chunks."""
    counts = dict.fromkeys(("pairs", "empty", "too_long", "kept"), 0)
    texts = (
        [prefix.with_name(f"{prefix.name}.{side}.txt").open("w", encoding="utf-8") for side in SIDES]
        if text
        else []
    )
    try:
        with SplitWriter(prefix) as out:
            for chunk in chunks:
                (src, ls), (tgt, lt) = (_flat(ids) for ids in encode_pairs(sp, chunk))
                keep, n = filter_mask(ls, lt, max_len)
                for k in counts:
                    counts[k] += n[k]
                if keep_filtered and not keep.all():
                    src, tgt = src[np.repeat(keep, ls)], tgt[np.repeat(keep, lt)]
                    ls, lt = ls[keep], lt[keep]
                out.append("src", src, ls)
                out.append("tgt", tgt, lt)
                for f, i in zip(texts, (0, 1)):
                    f.write("".join(pair[i] + "\n" for pair in chunk))
    finally:
        for f in texts:
            f.close()
    return counts


def tokenize_sentencepiece(cfg, out: Path) -> TokenizeReport:
    """The tokenize stage of a sentencepiece corpus (``data=multi30k``, ``fra_eng``, ``parallel``).

    Joint sentencepiece BPE on the training split (its pairs with text on both sides), with
    ``data.character_coverage`` (null: :func:`choose_character_coverage`) and
    ``data.input_sentence_size`` (a sample; 0 or absent: all), or the model
    ``data.tokenizer_from`` names, copied (fine-tuning keeps its parent's vocabulary);
    into ``out``: ``spm.model``/``spm.vocab``, training pairs filtered by
    :func:`filter_pairs`, the other splits of ``data.splits`` unfiltered (val, test and any
    further test split such as Multi30k's ``test_2017``): each split's id arrays
    (``{split}.{src,tgt}.{ids,offsets}.npy``, the module docstring), the other splits'
    normalized text (``{split}.{src,tgt}.txt``), and ``stats.json`` (the rule and the counts).

    The corpus is streamed (:func:`attnlab.data.corpora.scan_corpus`): a first pass checks
    every file and writes nothing; sentencepiece then trains on a stream of the training
    sentences, and each split is encoded a chunk of pairs at a time and appended to its arrays.
    A held-out split is read in its order through a copy of its file in the staging folder.
    ``out`` is replaced only once all is written (:func:`attnlab.files.staged_dir`).

    Args:
        cfg: the composed config: ``cfg.data`` (``conf/data/<corpus>.yaml``), and
            ``cfg.paths`` (:func:`attnlab.data.corpora.corpus_folder`).
        out: the output folder.
    Returns:
        the :class:`attnlab.data.corpora.TokenizeReport` of ``out``, a line per split.
    Raises:
        attnlab.data.corpora.CorpusError: a corpus file is missing or corrupt, or the
            direction is not one the corpus has.
        TokenizeError: ``data.max_len`` < 2, no training pair with text on both sides, a
            ``data.vocab_size`` the corpus cannot give, every training pair too long, or a
            ``data.tokenizer_from`` that is not a sentencepiece model of this project.
    """
    c = cfg.data
    if c.max_len < 2:
        raise TokenizeError(
            f"data.max_len={c.max_len} would drop every pair; set data.max_len=2 or more (a token plus <eos>)"
        )
    if 0 < (c.get("input_sentence_size") or 0) <= 100:
        raise TokenizeError(
            f"data.input_sentence_size={c.input_sentence_size} is too small: sentencepiece samples "
            "more than 100 sentences; set it above 100, or to 0 to train on every sentence"
        )
    corpus = scan_corpus(c, corpus_folder(cfg))  # every check; nothing written
    heldout, train = corpus.heldout, corpus.splits["train"]
    if not train.usable:
        raise TokenizeError(
            f"the training split is empty: {len(train)} pairs "
            "read, none with text on both sides; nothing was written. " + _empty_train_fix(cfg)
        )
    stats = {"rule": FILTER_RULE, "max_len": c.max_len, "splits": {}}
    lines = []
    if c.name == "parallel":  # two folders of one pair share the tokenized folder: which one
        stats["corpus_path"] = str(c.path)
    if heldout and c.name == "parallel":
        stats["heldout"] = {"seed": c.heldout.seed, **heldout}
    with staged_dir(out) as tmp, corpus.random_access(tmp / ".pairs"):
        if c.get("tokenizer_from"):
            sp = _tokenizer_from(c.tokenizer_from, tmp)
        else:
            coverage = c.get("character_coverage") or choose_character_coverage(_train_sentences(corpus))
            try:  # joint vocabulary, trained on the train pairs that have text on both sides
                sp = train_sentencepiece(
                    _train_sentences(corpus),
                    tmp / "spm",
                    c.vocab_size,
                    character_coverage=coverage,
                    input_sentence_size=c.get("input_sentence_size") or 0,
                    num_sentences=2 * train.usable,
                )
            except VocabSizeError as e:
                raise TokenizeError(f"{e}; nothing was written") from None
            if coverage != FULL_COVERAGE:
                stats["character_coverage"] = coverage
        stats["vocab_size"] = {"requested": c.vocab_size, "actual": sp.get_piece_size()}
        for name in corpus.splits:
            is_train = name == "train"
            counts = _write_split(sp, corpus.chunks(name), tmp / name, c.max_len, is_train, not is_train)
            if is_train:
                if not counts["kept"]:
                    raise TokenizeError(
                        f"every training pair has data.max_len={c.max_len} or more "
                        f"tokens on a side ({counts}); nothing was written. Raise data.max_len"
                    )
                lines.append(
                    f"{name}: {counts['kept']} pairs kept of {counts['pairs']} (dropped "
                    f"{counts['empty']} with an empty side, {counts['too_long']} with "
                    f"≥ {c.max_len} tokens on a side)"
                )
            else:  # aligned with the references: keep all, report what training would drop
                counts["kept"] = counts["pairs"]
                held = f" held out of train (seed {c.heldout.seed})" if name in heldout else ""
                lines.append(
                    f"{name}: {counts['pairs']} pairs{held}, all kept ({counts['empty']} with an "
                    f"empty side, {counts['too_long']} with ≥ {c.max_len} tokens on a side)"
                )
            stats["splits"][name] = counts
        write_json_atomic(tmp / "stats.json", stats)
    note = f", from {c.tokenizer_from}" if c.get("tokenizer_from") else ""
    if "character_coverage" in stats:
        note += f", character_coverage {stats['character_coverage']} (CJK text)"
    if sp.get_piece_size() < c.vocab_size and not c.get("tokenizer_from"):
        note += (
            f" (data.vocab_size={c.vocab_size} is more than this corpus gives; "
            f"sentencepiece stopped at {sp.get_piece_size()})"
        )
    kept = {
        name: str(n["kept"]) + (f" of {n['pairs']}" if n["kept"] != n["pairs"] else "")
        for name, n in stats["splits"].items()
    }
    return TokenizeReport(
        f"{c.name} {c.src_lang}-{c.tgt_lang}, sentencepiece",
        kept,
        f"{sp.get_piece_size()} pieces{note}",
        lines,
    )
