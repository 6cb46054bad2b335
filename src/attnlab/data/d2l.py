"""D2L's own English–French data pipeline, reproduced (D2L 10.5 (zh 9.5), "Machine Translation and
the Dataset").

``data=fra_eng_d2l`` trains on exactly the arrays of D2L's ``MTFraEng``:

1. preprocessing: U+202F and U+00A0 become a space, the text is lowercased,
   and a space is inserted before ``, . ! ?`` when none precedes it;
2. word tokenization: the first ``num_train + num_val + 1`` lines of
   ``fra-eng/fra.txt`` (D2L stops at line index > max_examples, so 641 lines
   for 512 + 128), each line with exactly two tab-separated fields, split on
   spaces, ``<eos>`` appended;
3. fixed length: every sequence is trimmed or padded with ``<pad>`` to
   ``num_steps`` (9) tokens; targets get ``<bos>`` in front, the decoder input
   is the first ``num_steps`` tokens of that and the label the last ``num_steps``;
4. vocabularies: one for the source, one for the target, each of the tokens
   occurring at least ``min_freq`` (2) times in the padded sequences, plus
   ``<unk>``; the first ``num_train`` (512) examples train, the rest validate.

One deliberate difference: D2L sorts *all* tokens alphabetically, so its
special tokens land at data-dependent ids. attnlab fixes ``<pad> <unk> <bos>
<eos>`` at ids 0-3 (as for sentencepiece, see :mod:`attnlab.data.special_tokens`) and
keeps D2L's alphabetical order for the other tokens. The token sets are D2L's;
ids are a fixed permutation of D2L's (and the source vocabulary also holds
``<bos>``, which never occurs in a source).

:func:`tokenize_d2l` is the tokenize stage of ``data=fra_eng_d2l`` (``conf/data/fra_eng_d2l.yaml``
names it in ``tokenize``); :class:`D2LTokenizer` answers the tokenizer interface of
:class:`attnlab.data.tokenizer.SentencePieceTokenizer`, with fixed-length sources.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from attnlab.data.corpora import CorpusError, TokenizeError, TokenizeReport, corpus_folder, read_zip_text
from attnlab.data.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnlab.errors import ConfigError, DamagedFileError, MissingFileError
from attnlab.files import staged_dir, write_json_atomic, write_lines_atomic, write_npz_atomic

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")  # ids PAD_ID, UNK_ID, BOS_ID, EOS_ID
assert [PAD_ID, UNK_ID, BOS_ID, EOS_ID] == [0, 1, 2, 3]
VOCAB_FILE = "vocab.json"


def preprocess(text: str) -> str:
    """D2L's ``MTFraEng._preprocess``: U+202F/U+00A0 → space, lowercase, space before ``,.!?``.

    str → str. A space is inserted before a punctuation mark unless the
    preceding character (before lowercasing) is already a space.
    """
    text = text.replace("\u202f", " ").replace("\xa0", " ")
    lowered = text.lower()
    return "".join(
        " " + c if i > 0 and c in ",.!?" and text[i - 1] != " " else c for i, c in enumerate(lowered)
    )


def tokenize(text: str, max_examples: int | None = None) -> tuple[list[list[str]], list[list[str]]]:
    """D2L's ``MTFraEng._tokenize``: word tokens of each ``source<TAB>target`` line, ``<eos>`` appended.

    Reads lines 0..max_examples (inclusive, as D2L does) and keeps those with
    exactly two tab-separated fields; empty tokens are dropped.
    Returns (source token lists, target token lists), aligned.
    """
    src, tgt = [], []
    for i, line in enumerate(text.split("\n")):
        if max_examples and i > max_examples:
            break
        parts = line.split("\t")
        if len(parts) == 2:
            src.append([t for t in f"{parts[0]} <eos>".split(" ") if t])
            tgt.append([t for t in f"{parts[1]} <eos>".split(" ") if t])
    return src, tgt


def pad_or_trim(tokens: Sequence[str], num_steps: int) -> list[str]:
    """First ``num_steps`` tokens, or the tokens padded with ``<pad>`` to ``num_steps``."""
    tokens = list(tokens)
    return tokens[:num_steps] if len(tokens) > num_steps else tokens + ["<pad>"] * (num_steps - len(tokens))


class Vocab:
    """Word vocabulary: tokens seen ≥ ``min_freq`` times, sorted, after the four specials.

    Args:
        sentences: token lists to count (D2L counts the padded sequences).
        min_freq: minimum count to get an id (D2L: 2).
        tokens: an explicit id → token list instead (used when loading).
    ``vocab[token]`` gives the id (``<unk>``'s for unknown tokens),
    ``vocab.to_tokens(ids)`` the tokens, ``len(vocab)`` the size.
    """

    def __init__(
        self, sentences: Sequence[Sequence[str]] = (), min_freq: int = 2, tokens: Sequence[str] | None = None
    ):
        if tokens is None:
            counts = collections.Counter(t for s in sentences for t in s)
            words = sorted(t for t, n in counts.items() if n >= min_freq and t not in SPECIALS)
            tokens = [*SPECIALS, *words]
        if tuple(tokens[:4]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}; got {list(tokens[:4])}")
        self.idx_to_token = list(tokens)
        self.token_to_idx = {t: i for i, t in enumerate(self.idx_to_token)}

    def __len__(self) -> int:
        return len(self.idx_to_token)

    def __getitem__(self, token: str) -> int:
        return self.token_to_idx.get(token, UNK_ID)

    def ids(self, tokens: Sequence[str]) -> list[int]:
        return [self[t] for t in tokens]

    def to_tokens(self, ids) -> list[str]:
        return [self.idx_to_token[int(i)] for i in ids]


def build_arrays(
    src: list[list[str]], tgt: list[list[str]], num_steps: int, src_vocab: Vocab, tgt_vocab: Vocab
) -> dict[str, torch.Tensor]:
    """D2L's ``_build_arrays`` with given vocabularies: int64 tensors, N = len(src).

    Returns ``src`` (N, num_steps), ``src_valid_lens`` (N,) (non-<pad> source
    tokens, <eos> included), ``tgt_in`` (N, num_steps) starting with <bos>,
    ``tgt_out`` (N, num_steps) (the label, <pad> where ignored).
    """
    src_rows = [src_vocab.ids(pad_or_trim(s, num_steps)) for s in src]
    tgt_rows = [tgt_vocab.ids(["<bos>", *pad_or_trim(t, num_steps)]) for t in tgt]
    src_t = torch.tensor(src_rows, dtype=torch.long).reshape(len(src), num_steps)
    tgt_t = torch.tensor(tgt_rows, dtype=torch.long).reshape(len(tgt), num_steps + 1)
    return {
        "src": src_t,
        "src_valid_lens": (src_t != PAD_ID).sum(1),
        "tgt_in": tgt_t[:, :-1],
        "tgt_out": tgt_t[:, 1:],
    }


def build_vocabs(
    src: list[list[str]], tgt: list[list[str]], num_steps: int, min_freq: int
) -> tuple[Vocab, Vocab]:
    """Source and target vocabularies counted on the padded (and, for targets, <bos>-prefixed) sequences."""
    src_vocab = Vocab([pad_or_trim(s, num_steps) for s in src], min_freq)
    tgt_vocab = Vocab([["<bos>", *pad_or_trim(t, num_steps)] for t in tgt], min_freq)
    return src_vocab, tgt_vocab


def read_fra_txt(zip_path: Path) -> str:
    """The raw text of ``fra-eng/fra.txt`` inside D2L's ``fra-eng.zip`` (UTF-8, not normalized).

    Raises:
        CorpusError: missing, truncated or corrupt archive (names it: delete it
            and re-run `dvc repro download`), no ``fra-eng/fra.txt`` in it, or
            non-UTF-8 bytes (names the line); see :func:`attnlab.data.corpora.read_zip_text`.
    """
    return read_zip_text(zip_path, "fra-eng/fra.txt")


def mt_fra_eng(
    raw_text: str, num_steps: int = 9, num_train: int = 512, num_val: int = 128, min_freq: int = 2
):
    """D2L's ``MTFraEng`` from the text of ``fra.txt``.

    Returns (train arrays, val arrays, tokenizer, (src tokens, tgt tokens)):
    the first ``num_train`` examples and the remaining ones (129 with D2L's
    defaults, since D2L reads one line more than num_train + num_val), each a
    dict as in :func:`build_arrays`; a :class:`D2LTokenizer` over both
    vocabularies; and the token lists of every example (``<eos>`` included).
    Raises:
        ValueError: if the text yields no more than ``num_train`` examples.
    """
    src, tgt = tokenize(preprocess(raw_text), num_train + num_val)
    if len(src) <= num_train:
        raise ConfigError(
            f"fra.txt gave {len(src)} examples, need more than num_train={num_train}: "
            "lower data.num_train, or use D2L's full fra-eng.zip"
        )
    src_vocab, tgt_vocab = build_vocabs(src, tgt, num_steps, min_freq)
    arrays = build_arrays(src, tgt, num_steps, src_vocab, tgt_vocab)
    train = {k: v[:num_train] for k, v in arrays.items()}
    val = {k: v[num_train:] for k, v in arrays.items()}
    return train, val, D2LTokenizer(src_vocab, tgt_vocab, num_steps), (src, tgt)


class D2LTokenizer:
    """Word-level source/target vocabularies with the tokenizer interface the pipeline uses
    (that of :class:`attnlab.data.tokenizer.SentencePieceTokenizer`).

    ``fixed_length`` is True: every source and target has ``num_steps`` tokens, and the data
    are D2L's arrays (:func:`save_arrays`); ``encode_sources`` gives D2L's fixed-length
    source batch; ``source_id_to_piece`` and ``source_vocab_size`` describe the source
    vocabulary; ``decode``, ``id_to_piece`` and ``get_piece_size`` (target side) mirror
    ``sentencepiece.SentencePieceProcessor``.
    """

    kind = "d2l_words"  # the format tag of vocab.json
    fixed_length = True

    def __init__(self, src_vocab: Vocab, tgt_vocab: Vocab, num_steps: int):
        self.src_vocab, self.tgt_vocab, self.num_steps = src_vocab, tgt_vocab, num_steps

    # --- source side
    def encode_sources(self, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """D2L's ``build`` for sources: (src (B, num_steps) int64, src_valid_lens (B,) int64)."""
        rows = [
            self.src_vocab.ids(pad_or_trim(preprocess(s).split() + ["<eos>"], self.num_steps))
            for s in sentences
        ]
        src = torch.tensor(rows, dtype=torch.long).reshape(len(rows), self.num_steps)
        return src, (src != PAD_ID).sum(1)

    def source_id_to_piece(self, i: int) -> str:
        return self.src_vocab.idx_to_token[int(i)]

    def source_vocab_size(self) -> int:
        return len(self.src_vocab)

    # --- target side
    def decode(self, ids: Sequence[int]) -> str:
        """Target ids (already cut at <eos>) → tokens joined by spaces.

        ``<pad> <bos> <eos>`` are dropped; ``<unk>`` stays, as in D2L's table.
        """
        return " ".join(t for t in self.tgt_vocab.to_tokens(ids) if t not in ("<pad>", "<bos>", "<eos>"))

    def id_to_piece(self, i: int) -> str:
        return self.tgt_vocab.idx_to_token[int(i)]

    def get_piece_size(self) -> int:
        return len(self.tgt_vocab)

    # --- files
    def save(self, path: Path) -> Path:
        """Write both vocabularies and ``num_steps`` as JSON, atomically."""
        return write_json_atomic(
            Path(path),
            {
                "format": self.kind,
                "num_steps": self.num_steps,
                "src": self.src_vocab.idx_to_token,
                "tgt": self.tgt_vocab.idx_to_token,
            },
        )

    @classmethod
    def load(cls, path: Path) -> D2LTokenizer:
        """Read a file written by :meth:`save`.

        Raises:
            ValueError: if the file is not a D2L vocabulary file.
        """
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
        if obj.get("format") != cls.kind:
            raise DamagedFileError(f"{path} is not a {cls.kind} vocabulary; re-run src/tokenize_data.py")
        return cls(Vocab(tokens=obj["src"]), Vocab(tokens=obj["tgt"]), int(obj["num_steps"]))


def save_arrays(arrays: dict[str, torch.Tensor], path: Path) -> None:
    """Write a split's arrays to ``.npz`` (int32), atomically (temp file, then rename)."""
    write_npz_atomic(path, **{k: v.numpy().astype(np.int32) for k, v in arrays.items()})


def load_arrays(path: Path) -> dict[str, torch.Tensor]:
    """Read a split written by :func:`save_arrays`: int64 tensors.

    Raises:
        FileNotFoundError: naming the stage to run when the split is missing.
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{path} not found; run `python src/tokenize_data.py data=fra_eng_d2l` first")
    with np.load(path) as z:
        return {k: torch.from_numpy(z[k].astype(np.int64)) for k in z.files}


def tokenize_d2l(cfg, out: Path) -> TokenizeReport:
    """The tokenize stage of ``data=fra_eng_d2l``: D2L's MTFraEng arrays and vocabularies, no filtering.

    Into ``out``: ``vocab.json``, ``{train,val}.npz`` (:func:`save_arrays`),
    ``val.{src,tgt}.txt`` (the val text in D2L's token space, ``<eos>`` dropped, for
    val_bleu and heatmaps) and ``stats.json``. D2L trims or pads every sequence to
    ``num_steps``, so no pair is dropped. ``out`` is replaced only once all is written.

    Args:
        cfg: the composed config: ``cfg.data`` (``conf/data/fra_eng_d2l.yaml``) and ``cfg.paths``
            (``fra-eng.zip`` in :func:`attnlab.data.corpora.corpus_folder`).
        out: the output folder.
    Returns:
        the :class:`attnlab.data.corpora.TokenizeReport` of ``out``.
    Raises:
        CorpusError: ``fra-eng.zip`` is missing or corrupt.
        TokenizeError: a direction other than en→fr, or too few examples for ``data.num_train``.
    """
    zip_path = corpus_folder(cfg) / "fra-eng.zip"
    c = cfg.data
    if (c.src_lang, c.tgt_lang) != ("en", "fr"):
        raise TokenizeError(
            f"data=fra_eng_d2l is D2L's English→French setup; got "
            f"{c.src_lang}→{c.tgt_lang} (drop the data.src_lang/data.tgt_lang overrides)"
        )
    try:
        train, val, tokenizer, (src, tgt) = mt_fra_eng(
            read_fra_txt(zip_path), c.num_steps, c.num_train, c.num_val, c.min_freq
        )
    except CorpusError:
        raise
    except ValueError as e:
        raise TokenizeError(f"{zip_path}: {e}") from None
    with staged_dir(out) as tmp:
        tokenizer.save(tmp / VOCAB_FILE)
        save_arrays(train, tmp / "train.npz")
        save_arrays(val, tmp / "val.npz")
        write_lines_atomic(tmp / "val.src.txt", [" ".join(s[:-1]) for s in src[c.num_train :]])
        write_lines_atomic(tmp / "val.tgt.txt", [" ".join(t[:-1]) for t in tgt[c.num_train :]])
        write_json_atomic(
            tmp / "stats.json",
            {
                "rule": "none: D2L's MTFraEng trims or pads every sequence to num_steps",
                "splits": {"train": len(train["src"]), "val": len(val["src"])},
            },
        )
    return TokenizeReport(
        f"{c.name} {c.src_lang}-{c.tgt_lang}, D2L words",
        {"train": str(len(train["src"])), "val": str(len(val["src"]))},
        f"{tokenizer.source_vocab_size()} source words, {tokenizer.get_piece_size()} target words",
    )
