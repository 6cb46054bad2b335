"""Sentencepiece tokenizer: train on the training split, encode splits to compact arrays.

Special ids are fixed and distinct (sentencepiece's default pad_id is -1,
which ``nn.Embedding(padding_idx=-1)`` would read as the last row):
``PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3`` (defined in :mod:`attnlab.data.special_tokens`,
importable from here too).

An encoded split is one ``.npz`` with int32 arrays ``src_ids``/``tgt_ids``
(all sentences concatenated, no bos/eos) and int64 ``src_offsets``/``tgt_offsets``
(N+1 boundaries), written once by the tokenize stage and read back by training
with no re-parsing (nanoGPT's ``prepare`` scheme).

Training pairs are filtered by one rule, :func:`filter_pairs`: a pair is dropped
when either side is empty after normalization, or has ``max_len`` or more
tokens (``data.max_len``, the same bound as
:class:`attnlab.data.batching.PairDataset`). Val and test pairs are all kept.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import sentencepiece as spm

from attnlab.data.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnlab.files import write_npz_atomic

# sentencepiece's RuntimeError texts for a vocabulary size the corpus cannot give.
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class VocabSizeError(ValueError):
    """``data.vocab_size`` does not fit the training corpus (too large or too small)."""


def _vocab_size_error(e: RuntimeError, vocab_size: int) -> VocabSizeError | None:
    """The user-facing error for sentencepiece's vocabulary-size RuntimeError, else None."""
    if m := _TOO_HIGH.search(str(e)):
        most = int(m.group(2))
        return VocabSizeError(
            f"data.vocab_size={vocab_size} is too large for this training corpus: sentencepiece "
            f"can make at most {most} pieces from it; set data.vocab_size={most} (or less), "
            "or train on a larger corpus")
    if m := _TOO_LOW.search(str(e)):
        least = int(m.group(2))
        return VocabSizeError(
            f"data.vocab_size={vocab_size} is too small for this training corpus: its characters "
            f"and the 4 special pieces alone need {least}; set data.vocab_size={least} (or more)")
    return None


def train_sentencepiece(sentences: list[str], model_prefix: Path, vocab_size: int,
                        model_type: str = "bpe", character_coverage: float = 1.0,
                        seed_sentencepiece_size: int = 1_000_000,
                        hard_vocab_limit: bool = False) -> spm.SentencePieceProcessor:
    """Train a sentencepiece model on ``sentences``; writes ``<prefix>.model`` and ``.vocab``.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): a corpus
    too small for it gives fewer pieces (``get_piece_size()``), so a tiny
    corpus still trains. With ``hard_vocab_limit=True`` it is exact.
    Empty sentences are skipped. Returns the loaded processor. On any error
    no file is left at ``<prefix>.*``.
    Raises:
        ValueError: on an empty training corpus.
        VocabSizeError: ``vocab_size`` below the corpus's characters plus the
            4 special pieces, or (``hard_vocab_limit=True``) above what the
            corpus gives; names ``data.vocab_size`` and the size that works.
    """
    sentences = [s for s in sentences if s]
    if not sentences:
        raise ValueError("cannot train sentencepiece on an empty training split")
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    # Train into a temporary prefix, then rename: a killed run leaves no half model.
    tmp_prefix = model_prefix.with_name(f".tmp-{os.getpid()}-{model_prefix.name}")
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_prefix=str(tmp_prefix),
            vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            hard_vocab_limit=hard_vocab_limit, seed_sentencepiece_size=seed_sentencepiece_size,
            num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
        for ext in (".model", ".vocab"):
            Path(f"{tmp_prefix}{ext}").unlink(missing_ok=True)
        if (err := _vocab_size_error(e, vocab_size)) is not None:
            raise err from None
        raise
    for ext in (".model", ".vocab"):
        os.replace(f"{tmp_prefix}{ext}", f"{model_prefix}{ext}")
    return load_sentencepiece(f"{model_prefix}.model")


def load_sentencepiece(path) -> spm.SentencePieceProcessor:
    """Load a model and check its special ids are this project's (pad ≥ 0, all distinct).

    Raises:
        ValueError: if the model was trained with other special ids.
    """
    sp = spm.SentencePieceProcessor(model_file=str(path))
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise ValueError(f"{path}: special ids (pad, unk, bos, eos) = {ids}, expected "
                         f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; retrain with src/tokenize_data.py")
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
    raise FileNotFoundError(f"no tokenizer (spm.model or vocab.json) in {d}; run "
                            "`python src/tokenize_data.py` (or `dvc repro tokenize`) with the same data= option")


def _pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    ids = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


def encode_pairs(sp: spm.SentencePieceProcessor,
                 pairs: list[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]]]:
    """(source id lists, target id lists) of (source, target) text pairs, no bos/eos."""
    src, tgt = zip(*pairs) if pairs else ((), ())
    return sp.encode(list(src)), sp.encode(list(tgt))


def filter_pairs(src: list[list[int]], tgt: list[list[int]],
                 max_len: int) -> tuple[list[int], dict[str, int]]:
    """The tokenize stage's rule for training pairs: which to keep, and why the others went.

    A pair is dropped when either side has no tokens, i.e. its line was empty
    (or only spaces) after normalization: counted as ``empty``; otherwise when
    either side has ``max_len`` or more tokens (bos/eos not counted, as in
    :class:`attnlab.data.batching.PairDataset`): counted as ``too_long``.
    Returns (indices of the kept pairs in order, ``{"pairs": read, "empty": n,
    "too_long": n, "kept": n}``) with ``pairs == empty + too_long + kept``.
    Raises:
        ValueError: if ``max_len`` < 2 or the two sides differ in length.
    """
    if max_len < 2:
        raise ValueError(f"data.max_len must be ≥ 2 (a token plus <eos>), got {max_len}")
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source but {len(tgt)} target sentences")
    keep, empty, too_long = [], 0, 0
    for i, (s, t) in enumerate(zip(src, tgt)):
        if len(s) == 0 or len(t) == 0:
            empty += 1
        elif len(s) >= max_len or len(t) >= max_len:
            too_long += 1
        else:
            keep.append(i)
    return keep, {"pairs": len(src), "empty": empty, "too_long": too_long, "kept": len(keep)}


def write_split(path: Path, src: list[list[int]], tgt: list[list[int]]) -> None:
    """Write encoded pairs atomically to ``path`` (.npz, layout in the module docstring)."""
    src_ids, src_off = _pack(src)
    tgt_ids, tgt_off = _pack(tgt)
    write_npz_atomic(path, src_ids=src_ids, src_offsets=src_off, tgt_ids=tgt_ids, tgt_offsets=tgt_off)


def encode_split(sp: spm.SentencePieceProcessor, pairs: list[tuple[str, str]], path: Path) -> None:
    """Encode (source, target) pairs and write them atomically to ``path`` (.npz), unfiltered."""
    write_split(path, *encode_pairs(sp, pairs))


def load_split(path: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Read an encoded split back: (source id arrays, target id arrays), one per sentence.

    Raises:
        FileNotFoundError: naming the stage to run when the split is missing.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; run `python src/tokenize_data.py` "
                                "(or `dvc repro tokenize`) with the same data= option first")
    z = np.load(path)
    def unpack(ids, off):
        return [ids[off[i]:off[i + 1]] for i in range(len(off) - 1)]
    return unpack(z["src_ids"], z["src_offsets"]), unpack(z["tgt_ids"], z["tgt_offsets"])
