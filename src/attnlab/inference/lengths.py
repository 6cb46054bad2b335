"""Every split fits the model: checked before training starts and before evaluate decodes.

A Transformer has a positional table of ``max_len`` positions (512 unless
``model.net.max_len`` says otherwise: :func:`attnlab.models.max_positions`). A side of n
tokens takes n + 1 of them (the source's <eos>, the teacher-forced target's <bos>), and a
decoded translation one per token fed back: at most
:func:`attnlab.inference.decoding.max_output_len` of the source. The GRU models have no
table and read any length: nothing to check.

What happens to a pair the model cannot take depends on its split:

* **train**: dropped, like the pairs of ``data.max_len`` or more tokens the tokenize stage
  drops, and counted in the log (:func:`training_bound` is the bound the training set is
  read with). A training pair left out changes no score.
* **val and the test splits**: refused before anything runs (:class:`PairTooLongError`,
  naming the split, the line, its length, the model's limit and the fix). They are scored:
  a dropped pair would leave its reference unmatched or shrink the test set, and a cut one
  would score half a translation against the whole reference; either changes BLEU without a
  word and makes it incomparable with other runs on the same set. A sentence of hundreds of
  tokens in a caption corpus is also most often a fault of the corpus (lines run together),
  which the user should see rather than have hidden. Val is checked on both sides
  (``val_loss`` teacher-forces the target; ``val_bleu`` decodes the source); a test split on
  its source side (the reference is compared with, never fed to the model).

The lengths come from the tokenize stage's offsets arrays (``np.diff``, a slice of pairs at a
time, read from the file: :meth:`attnlab.data.tokenizer.PackedIds.lengths`), never from the
text: a split of 36 million pairs is checked in under a second (0.9 s on both sides, on the
2-core machine of this project, offsets in the page cache), with memory for one slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnlab.data.tokenizer import load_split, split_files
from attnlab.errors import UserError
from attnlab.inference.decoding import max_output_len

_CHUNK = 1 << 18  # pairs per slice
_SIDE = {"src": ("source", "<eos>"), "tgt": ("target", "<bos>")}
VAL_SIDES: tuple[str, ...] = ("src", "tgt")  # val_loss teacher-forces the target; val_bleu decodes the source
TEST_SIDES: tuple[str, ...] = ("src",)  # a test split's reference is never fed to the model


class PairTooLongError(UserError, ValueError):
    """A validation or test pair needs more positions than the model has (names the split,
    the line, the lengths, the limit and the fix)."""


@dataclass(frozen=True)
class Line:
    """One side of one pair: its 1-based line in ``<split>.<side>.txt``, its token count and
    the positions it needs."""

    split: str
    side: str
    line: int
    tokens: int
    positions: int

    def describe(self, folder: Path) -> str:
        name, special = _SIDE[self.side]
        path = Path(folder) / f"{self.split}.{self.side}.txt"
        if self.positions == self.tokens + 1:
            why = f"{self.positions} positions with its {special}"
        else:
            why = (
                f"its translation may take {self.positions} positions "
                "(decoding's limit: min(1.5 × (tokens + 1) + 10, 256))"
            )
        return f"line {self.line} of {path} has {self.tokens} {name} tokens ({why})"


@dataclass(frozen=True)
class Overlong:
    """The pairs of one split that need more positions than the model has: how many of how
    many, the first of them and the one that needs the most."""

    split: str
    pairs: int
    count: int
    first: Line
    longest: Line

    def describe(self, folder: Path) -> str:
        if self.count == 1:
            return f"{self.split}: 1 of {self.pairs} pairs: {self.first.describe(folder)}"
        text = f"{self.split}: {self.count} of {self.pairs} pairs; the first, {self.first.describe(folder)}"
        if self.longest != self.first:
            text += f"; the longest, {self.longest.describe(folder)}"
        return text


def positions_needed(tokens: np.ndarray, side: str) -> np.ndarray:
    """Positions (int64) each of ``tokens`` (token counts of one side, no special token) takes:
    n + 1 for a target (teacher forcing, <bos> first); for a source the larger of n + 1 (with
    its <eos>) and the length its translation may reach
    (:func:`attnlab.inference.decoding.max_output_len` of n + 1)."""
    plus_one = np.asarray(tokens, dtype=np.int64) + 1
    if side == "tgt":
        return plus_one
    return np.maximum(plus_one, torch.as_tensor(max_output_len(torch.from_numpy(plus_one))).numpy())


def find_overlong(prefix: Path, positions: int, sides: Sequence[str] = VAL_SIDES) -> Overlong | None:
    """The pairs of the encoded split ``prefix`` (:func:`attnlab.data.tokenizer.load_split`) with
    a side of ``sides`` that needs more than ``positions`` (:func:`positions_needed`), or
    ``None`` if every pair fits. Reads the offsets a slice at a time (vectorised, no loop over
    pairs). The longest is the earliest of equals (on one line, the source).

    Raises:
        FileNotFoundError, ValueError: as :func:`attnlab.data.tokenizer.load_split`.
    """
    prefix = Path(prefix)
    packed = dict(zip(("src", "tgt"), load_split(prefix)))
    n, count, first, longest = len(packed["src"]), 0, None, None
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        tokens = {side: packed[side].lengths(start, stop) for side in sides}
        need = {side: positions_needed(tokens[side], side) for side in sides}
        over = np.zeros(stop - start, dtype=bool)
        for side in sides:
            over |= need[side] > positions
        count += int(over.sum())
        if not over.any():
            continue
        if first is None:
            i = int(np.flatnonzero(over)[0])
            side = next(s for s in sides if need[s][i] > positions)
            first = Line(prefix.name, side, start + i + 1, int(tokens[side][i]), int(need[side][i]))
        for side in sides:
            i = int(np.argmax(need[side]))  # the first of the longest
            line = Line(prefix.name, side, start + i + 1, int(tokens[side][i]), int(need[side][i]))
            if longest is None or (-line.positions, line.line) < (-longest.positions, longest.line):
                longest = line
    if first is None or longest is None:
        return None
    return Overlong(prefix.name, n, count, first, longest)


def scored_splits(data) -> dict[str, tuple[str, ...]]:
    """The splits a run of ``data`` (the ``data`` config) scores, each with the sides the model
    reads: ``val`` (:data:`VAL_SIDES`), ``test`` when ``data.test_set`` is set, and each key of
    ``data.more_test_splits`` (:data:`TEST_SIDES`)."""
    out = {"val": VAL_SIDES}
    if data.get("test_set") is not None:
        out["test"] = TEST_SIDES
    more = data.get("more_test_splits") or []
    if isinstance(more, Sequence) and not isinstance(more, str):  # else evaluate refuses it
        out.update({str(key): TEST_SIDES for key in more})
    return out


def check_splits_fit(
    tokenized_dir: Path,
    splits: Mapping[str, Sequence[str]],
    positions: int | None,
    model: str,
    stage: str,
) -> None:
    """Refuse the run if a pair of a scored split needs more positions than the model has.

    Args:
        tokenized_dir: the tokenize stage's folder.
        splits: split name → the sides the model reads (:data:`VAL_SIDES`, :data:`TEST_SIDES`).
            A split other than ``val`` whose arrays are absent is skipped (evaluate says
            what to do about a missing test split).
        positions: :func:`attnlab.models.max_positions` of the model; ``None``: no limit.
        model: the model's name for the message (``transformer``).
        stage: ``"train"`` or ``"evaluate"``: which fix the message names.
    Raises:
        PairTooLongError: one line per split that does not fit (count, first line, longest),
            the policy and the fix. Nothing has run or been written.
    """
    if positions is None:
        return
    folder = Path(tokenized_dir)
    found = []
    for split, sides in splits.items():
        if split != "val" and not all(p.exists() for p in split_files(folder / split).values()):
            continue
        if (overlong := find_overlong(folder / split, positions, sides)) is not None:
            found.append(overlong)
    if not found:
        return
    need = max(o.longest.positions for o in found)
    table = f"++model.net.max_len={need}"
    fix = (
        f"give the model a longer positional table with {table} (a new model)"
        if stage == "train"
        else f"score a model trained with a longer positional table ({table} when training)"
    )
    lines = "\n".join(f"  {o.describe(folder)}" for o in found)
    raise PairTooLongError(
        f"these pairs do not fit the {model} model, which has {positions} positions "
        f"(model.net.max_len) and so takes at most {positions - 1} tokens a side:\n{lines}\n"
        "Validation and test pairs are scored, so none is dropped or cut (either would change "
        "BLEU without a word). Split such a line into its sentences, or remove the pair, in the "
        "corpus and re-run `python src/tokenize_data.py` (or `dvc repro tokenize`); or " + fix
    )


def training_bound(max_len: int, positions: int | None) -> int:
    """The bound training pairs are read with (a pair with that many tokens or more on a
    side is dropped, :class:`attnlab.data.batching.PairDataset`): ``data.max_len``, or the
    model's positions when fewer (a side of n tokens takes n + 1 of them)."""
    return max_len if positions is None else min(max_len, positions)


def check_fixed_steps(num_steps: int, positions: int | None, model: str) -> None:
    """D2L's fixed-length data (``data=fra_eng_d2l``): every sequence is ``num_steps`` wide.

    Raises:
        PairTooLongError: ``num_steps`` > ``positions``: no pair would fit.
    """
    if positions is not None and num_steps > positions:
        raise PairTooLongError(
            f"data.num_steps={num_steps}: every sequence of D2L's data is {num_steps} tokens wide, "
            f"and the {model} model has {positions} positions (model.net.max_len); set "
            f"data.num_steps={positions} or less (and re-run the tokenize stage), or "
            f"++model.net.max_len={num_steps}"
        )
