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

:func:`tokenize_sentencepiece` is the tokenize stage of the sentencepiece corpora
(``conf/data/{multi30k,fra_eng}.yaml`` name it in ``tokenize``). The models it writes load
as :class:`SentencePieceTokenizer` (:func:`load_sentencepiece`), which answers the same
tokenizer interface as D2L's word vocabularies (:class:`attnlab.data.d2l.D2LTokenizer`).
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np
import sentencepiece as spm

from attnlab.data.corpora import TokenizeError, TokenizeReport, load_splits
from attnlab.data.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnlab.files import (
    staged_dir,
    write_bytes_atomic,
    write_json_atomic,
    write_lines_atomic,
    write_npz_atomic,
    write_text_atomic,
)

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
            "or train on a larger corpus"
        )
    if m := _TOO_LOW.search(str(e)):
        least = int(m.group(2))
        return VocabSizeError(
            f"data.vocab_size={vocab_size} is too small for this training corpus: its characters "
            f"and the 4 special pieces alone need {least}; set data.vocab_size={least} (or more)"
        )
    return None


def train_sentencepiece(
    sentences: list[str],
    model_prefix: Path,
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    seed_sentencepiece_size: int = 1_000_000,
    hard_vocab_limit: bool = False,
) -> SentencePieceTokenizer:
    """Train a sentencepiece model on ``sentences``; writes ``<prefix>.model`` and ``.vocab``.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): a corpus
    too small for it gives fewer pieces (``get_piece_size()``), so a tiny
    corpus still trains. With ``hard_vocab_limit=True`` it is exact.
    Empty sentences are skipped. Returns the loaded model (:func:`load_sentencepiece`).
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
    sentences = [s for s in sentences if s]
    if not sentences:
        raise ValueError("cannot train sentencepiece on an empty training split")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
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
    longest; the data are ``{split}.npz`` id lists, see the module docstring);
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
        raise ValueError(
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
    raise FileNotFoundError(
        f"no tokenizer (spm.model or vocab.json) in {d}; run "
        "`python src/tokenize_data.py` (or `dvc repro tokenize`) with the same data= option"
    )


def _pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    ids = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


def encode_pairs(
    sp: spm.SentencePieceProcessor, pairs: list[tuple[str, str]]
) -> tuple[list[list[int]], list[list[int]]]:
    """(source id lists, target id lists) of (source, target) text pairs, no bos/eos."""
    src, tgt = zip(*pairs) if pairs else ((), ())
    return sp.encode(list(src)), sp.encode(list(tgt))


def filter_pairs(
    src: list[list[int]], tgt: list[list[int]], max_len: int
) -> tuple[list[int], dict[str, int]]:
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
        raise FileNotFoundError(
            f"{path} not found; run `python src/tokenize_data.py` "
            "(or `dvc repro tokenize`) with the same data= option first"
        )
    z = np.load(path)

    def unpack(ids, off):
        return [ids[off[i] : off[i + 1]] for i in range(len(off) - 1)]

    return unpack(z["src_ids"], z["src_offsets"]), unpack(z["tgt_ids"], z["tgt_offsets"])


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
    return (
        f"Check {cfg.paths.raw}/fra-eng.zip (delete it and re-run `dvc repro download`) and "
        f"data.heldout (num_val={c.heldout.num_val} + num_test={c.heldout.num_test} pairs "
        "are held out before training gets any)"
    )


def tokenize_sentencepiece(cfg, out: Path) -> TokenizeReport:
    """The tokenize stage of a sentencepiece corpus (``data=multi30k``, ``data=fra_eng``).

    Joint sentencepiece BPE on the training split (its pairs with text on both sides);
    into ``out``: ``spm.model``/``spm.vocab``, training pairs filtered by
    :func:`filter_pairs`, the other splits of ``data.splits`` unfiltered (val, test and any
    further test split such as Multi30k's ``test_2017``: ``{split}.npz``, plus
    ``{split}.{src,tgt}.txt``), and ``stats.json`` (the rule and the counts).
    ``out`` is replaced only once all is written (:func:`attnlab.files.staged_dir`).

    Args:
        cfg: the composed config: ``cfg.data`` (``conf/data/<corpus>.yaml``) and ``cfg.paths.raw``.
        out: the output folder.
    Returns:
        the :class:`attnlab.data.corpora.TokenizeReport` of ``out``, a line per split.
    Raises:
        attnlab.data.corpora.CorpusError: a corpus file is missing or corrupt, or the
            direction is not one the corpus has.
        TokenizeError: ``data.max_len`` < 2, no training pair with text on both sides, a
            ``data.vocab_size`` the corpus cannot give, or every training pair too long.
    """
    c = cfg.data
    if c.max_len < 2:
        raise TokenizeError(
            f"data.max_len={c.max_len} would drop every pair; set data.max_len=2 or more (a token plus <eos>)"
        )
    splits = load_splits(c, Path(cfg.paths.raw))
    usable = [(s, t) for s, t in splits["train"] if s and t]
    if not usable:  # checked before anything is written
        raise TokenizeError(
            f"the training split is empty: {len(splits['train'])} pairs "
            "read, none with text on both sides; nothing was written. " + _empty_train_fix(cfg)
        )
    stats = {"rule": FILTER_RULE, "max_len": c.max_len, "splits": {}}
    lines = []
    with staged_dir(out) as tmp:
        try:  # joint vocabulary, trained on the train pairs that have text on both sides
            sp = train_sentencepiece([s for pair in usable for s in pair], tmp / "spm", c.vocab_size)
        except VocabSizeError as e:
            raise TokenizeError(f"{e}; nothing was written") from None
        stats["vocab_size"] = {"requested": c.vocab_size, "actual": sp.get_piece_size()}
        for name, pairs in splits.items():
            src, tgt = encode_pairs(sp, pairs)
            keep, counts = filter_pairs(src, tgt, c.max_len)
            if name == "train":
                if not keep:
                    raise TokenizeError(
                        f"every training pair has data.max_len={c.max_len} or more "
                        f"tokens on a side ({counts}); nothing was written. Raise data.max_len"
                    )
                src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
                lines.append(
                    f"{name}: {counts['kept']} pairs kept of {counts['pairs']} (dropped "
                    f"{counts['empty']} with an empty side, {counts['too_long']} with "
                    f"≥ {c.max_len} tokens on a side)"
                )
            else:  # aligned with the references: keep all, report what training would drop
                counts["kept"] = counts["pairs"]
                write_lines_atomic(tmp / f"{name}.src.txt", [s for s, _ in pairs])
                write_lines_atomic(tmp / f"{name}.tgt.txt", [t for _, t in pairs])
                lines.append(
                    f"{name}: {counts['pairs']} pairs, all kept ({counts['empty']} with an "
                    f"empty side, {counts['too_long']} with ≥ {c.max_len} tokens on a side)"
                )
            write_split(tmp / f"{name}.npz", src, tgt)
            stats["splits"][name] = counts
        write_json_atomic(tmp / "stats.json", stats)
    note = ""
    if sp.get_piece_size() < c.vocab_size:
        note = (
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
