"""Token ids → padded, length-bucketed batches.

A batch is a dict of int64 tensors:
``src`` (B, S) source ids + <eos>, padded with <pad>; ``src_valid_lens`` (B,);
``tgt_in`` (B, T) <bos> + target (teacher-forcing input);
``tgt_out`` (B, T) target + <eos> (labels, <pad> where ignored).

Memory does not grow with the corpus beyond a few bytes a pair: :class:`PairDataset` reads
the memory-mapped id arrays of the tokenize stage (:func:`attnlab.data.tokenizer.load_split`)
and keeps one small integer a pair (its bucketing length), plus the index of the kept pairs
when ``max_len`` drops some; the batch samplers build each epoch's batches as numpy index
arrays (4 bytes a pair, twice while sorting) and hand out one batch at a time as a list.
They draw from ``random.Random`` exactly as a list-based implementation would, so a seed,
an epoch and a rank give the same batches, in the same order, as before they were arrays.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from attnlab.data.corpora import as_numpy, index_array
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, PackedIds

_CHUNK = 1 << 18  # pairs per slice when a pass over every pair is done a slice at a time


def _packed(side) -> PackedIds:
    return side if isinstance(side, PackedIds) else PackedIds.pack(side)


def _compact(values: np.ndarray) -> np.ndarray:
    """Non-negative ints in the smallest of uint16, uint32 and int64 that holds them."""
    top = int(values.max()) if len(values) else 0
    dtype = np.uint16 if top < 2**16 else np.uint32 if top < 2**32 else np.int64
    return values.astype(dtype, copy=False)


class PairDataset(Dataset):
    """(source ids, target ids) pairs; pairs with ``max_len`` or more tokens on either side
    are left out (``max_len`` None: all kept).

    Args:
        src, tgt: the two sides, :class:`attnlab.data.tokenizer.PackedIds` (memory-mapped by
            :func:`attnlab.data.tokenizer.load_split`), or lists of id sequences (packed here).
        max_len: the bound on tokens a side (bos/eos not counted).
    Item i is (source ids, target ids) of the i-th kept pair: int32 arrays, views of the
    arrays given (of the memory map: no copy until collated); a batch of items
    (:meth:`__getitems__`) is read from the files instead. Held per pair: its bucketing
    length (:meth:`lengths`, 2 bytes when under 65,536 tokens) and, when ``max_len`` drops some,
    the kept pairs' index (4 bytes); the lengths are computed a slice at a time (``np.diff``
    of the offsets). Attributes: ``src``, ``tgt`` (the kept pairs' sides: ``src[i]`` is item
    i's source), ``num_dropped``.
    """

    def __init__(self, src, tgt, max_len: int | None = None):
        src, tgt = _packed(src), _packed(tgt)
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source but {len(tgt)} target sentences")
        kept, lengths = [], []
        for start in range(0, len(src), _CHUNK):
            ls, lt = src.lengths(start, start + _CHUNK), tgt.lengths(start, start + _CHUNK)
            length = np.maximum(ls, lt) + 1
            if max_len is not None:
                keep = (ls < max_len) & (lt < max_len)
                kept.append(np.flatnonzero(keep).astype(np.uint32 if len(src) < 2**32 else np.int64) + start)
                length = length[keep]
            lengths.append(_compact(length))
        self._lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.uint16)
        index = np.concatenate(kept) if kept else None
        if index is not None and len(index) == len(src):
            index = None  # every pair kept: no index to hold
        self.src = src if index is None else src.select(index)
        self.tgt = tgt if index is None else tgt.select(index)
        self.num_dropped = len(src) - len(self.src)

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return self.src[i], self.tgt[i]

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The items ``indices``, fetched together (a ``DataLoader`` calls this for a batch):
        read from the id files, not through the memory map (see
        :meth:`attnlab.data.tokenizer.PackedIds.read`), so training maps no page of them."""
        return list(zip(self.src.read(indices), self.tgt.read(indices)))

    def lengths(self) -> np.ndarray:
        """Per-pair length used for bucketing: max(source, target) + 1 (an unsigned int array)."""
        return self._lengths


def collate(pairs) -> dict[str, torch.Tensor]:
    """List of (src ids, tgt ids) → the padded batch dict described in the module docstring."""
    src = [np.asarray(s) for s, _ in pairs]
    tgt = [np.asarray(t) for _, t in pairs]
    ls = np.fromiter(map(len, src), np.int64, len(src))
    lt = np.fromiter(map(len, tgt), np.int64, len(tgt))
    B, S, T = len(pairs), int(ls.max()) + 1, int(lt.max()) + 1
    out_src = np.full((B, S), PAD_ID, dtype=np.int64)
    tgt_in = np.full((B, T), PAD_ID, dtype=np.int64)
    tgt_out = np.full((B, T), PAD_ID, dtype=np.int64)
    for i, (s, t) in enumerate(zip(src, tgt)):
        out_src[i, : len(s)] = s
        tgt_in[i, 1 : len(t) + 1] = t
        tgt_out[i, : len(t)] = t
    rows = np.arange(B)
    out_src[rows, ls] = EOS_ID
    tgt_in[:, 0] = BOS_ID
    tgt_out[rows, lt] = EOS_ID
    return {
        "src": torch.from_numpy(out_src),
        "src_valid_lens": torch.from_numpy(ls + 1),
        "tgt_in": torch.from_numpy(tgt_in),
        "tgt_out": torch.from_numpy(tgt_out),
    }


def _as_lengths(lengths) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (len(lengths) and not np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError(f"lengths must be a list or 1-D array of ints, got {lengths.dtype} {lengths.shape}")
    return lengths if len(lengths) else lengths.astype(np.int64)


def _stable_sort_by(order: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``order`` stably sorted by ``lengths[order]``: ``sorted(order, key=lengths.__getitem__)``
    as a new array of the same dtype, sorted a slice at a time (a counting sort by length
    across slices): besides the result, memory for one slice."""
    counts = np.bincount(lengths[order] if len(order) < len(lengths) else lengths)
    nxt = np.concatenate(([0], np.cumsum(counts)[:-1]))  # where each length's run goes next
    out = np.empty_like(order)
    for start in range(0, len(order), _CHUNK):
        part = order[start : start + _CHUNK]
        keys = lengths[part]
        perm = np.argsort(keys, kind="stable")
        part, keys = part[perm], keys[perm]
        values, first = np.unique(keys, return_index=True)
        for v, a, b in zip(values.tolist(), first.tolist(), [*first[1:].tolist(), len(keys)]):
            out[nxt[v] : nxt[v] + b - a] = part[a:b]
            nxt[v] += b - a
    return out


class _EpochBatchSampler(Sampler[list[int]]):
    """Base of the batch samplers below: a fixed batch list per (seed, epoch), sharded over
    DDP ranks, resumable mid-epoch.

    An epoch's batches (the same on every rank): the pair indices, shuffled by
    ``random.Random(seed + epoch)`` when ``shuffle`` is set, cut into batches by the
    subclass's :meth:`_cut`, then (``shuffle``) put in a random order by the same
    generator. Subclasses also implement :meth:`_num_epoch_batches`. With
    ``num_replicas`` > 1 the list is padded by wrapping around to a
    multiple of ``num_replicas`` (as ``DistributedSampler`` does) and rank r takes
    batches r, r + num_replicas, …, so every rank runs the same number of steps; the repeated
    batches come last, after the rank's :meth:`num_own_batches`.
    ``skip`` batches of the next epoch are left out once (set by
    :class:`attnlab.data.datamodule.ResumableDataLoader` when a run resumes mid-epoch).

    The indices live in numpy arrays (:func:`attnlab.data.corpora.index_array`, shuffled by
    ``random.Random.shuffle`` itself, so the draws are those of shuffling a list); an
    iterator yields one batch at a time, as a list of ints.
    """

    def __init__(self, lengths, shuffle: bool, seed: int, num_replicas: int = 1, rank: int = 0):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.lengths, self.shuffle, self.seed = _as_lengths(lengths), shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _epoch_batches(self, rng: random.Random) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pair indices, cuts, batch order): batch b is ``indices[cuts[b]:cuts[b + 1]]``, and
        the epoch takes the batches in ``batch order``."""
        order = index_array(len(self.lengths))
        if self.shuffle:
            rng.shuffle(order)
        indices, cuts = self._cut(as_numpy(order))
        batches = index_array(len(cuts) - 1)
        if self.shuffle:
            rng.shuffle(batches)
        return indices, cuts, as_numpy(batches)

    def _cut(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The batches of one epoch from the pair indices in ``order`` (shuffled or not), as
        (indices, cuts): batch b is ``indices[cuts[b]:cuts[b + 1]]``."""
        raise NotImplementedError

    def _num_epoch_batches(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        indices, cuts, batches = self._epoch_batches(random.Random(self.seed + self.epoch))
        if self.num_replicas > 1 and len(batches):
            total = -(-len(batches) // self.num_replicas) * self.num_replicas
            batches = np.resize(batches, total)[self.rank :: self.num_replicas]  # wraps around
        skip, self.skip = self.skip, 0
        self.epoch += 1
        return self._batches(indices, cuts, batches[skip:])

    @staticmethod
    def _batches(indices: np.ndarray, cuts: np.ndarray, batches: np.ndarray) -> Iterator[list[int]]:
        for b in batches.tolist():
            yield indices[cuts[b] : cuts[b + 1]].tolist()

    def __len__(self):
        return -(-self._num_epoch_batches() // self.num_replicas)

    def num_own_batches(self) -> int:
        """How many of this rank's batches of an epoch (the first ones it yields) are its own.

        The rest (none, or the last one) pad the rank's share to :meth:`__len__`: a repeat of a
        batch another rank also reads. Training may learn from it twice; a metric must not
        count it (:class:`attnlab.data.datamodule.CountOnceLoader`). The own batches of all
        ranks together are the epoch's batches, each once."""
        return len(range(self.rank, self._num_epoch_batches(), self.num_replicas))


class BucketBatchSampler(_EpochBatchSampler):
    """Batches of similar-length pairs: shuffle, sort within pools of ``pool_batches``
    batches, cut into batches of ``batch_size``, shuffle the batches. Reseeded
    per epoch from ``seed`` + epoch, so runs are reproducible. ``num_replicas``,
    ``rank``: DDP sharding (see :class:`_EpochBatchSampler`).
    """

    def __init__(
        self,
        lengths,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        pool_batches: int = 50,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        super().__init__(lengths, shuffle, seed, num_replicas, rank)
        self.batch_size = batch_size
        self.pool = batch_size * pool_batches

    def _cut(self, order):
        n = len(order)
        size = self.pool if self.shuffle else n or 1  # unshuffled: one pool, all sorted
        if size >= n:
            order = _stable_sort_by(order, self.lengths)
        else:
            for p in range(0, n, size):  # in place: each pool stably sorted by length
                pool = order[p : p + size]
                pool[:] = pool[np.argsort(self.lengths[pool], kind="stable")]
        # pools are whole numbers of batches, so batches start every batch_size pairs
        return order, np.append(np.arange(0, n, self.batch_size), n)

    def _num_epoch_batches(self):
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size


def _budget_cuts(sorted_lengths: np.ndarray, max_tokens: int, max_sentences: int | None = None) -> np.ndarray:
    """Where :func:`token_budget_batches` cuts pairs of non-decreasing ``sorted_lengths``:
    batch b is positions ``cuts[b]:cuts[b + 1]``.

    A batch starting at s grows while its k + 1 pairs cost (k + 1)·length[s + k] ≤
    ``max_tokens`` (the longest is the last) and it holds fewer than ``max_sentences``; that
    cost only grows with k, so each batch is found with one vectorised look at its candidates.
    """
    n, limit = len(sorted_lengths), max_sentences or len(sorted_lengths)
    cuts, s = [0], 0
    while s < n:
        most = min(limit, n - s)  # the batch holds at most this many
        first = int(sorted_lengths[s])
        k_max = most - 1 if first == 0 else min(most - 1, max_tokens // first + 1)
        k = np.arange(1, k_max + 1)
        over = np.flatnonzero((k + 1) * sorted_lengths[s + 1 : s + 1 + k_max].astype(np.int64) > max_tokens)
        s += int(over[0]) + 1 if len(over) else k_max + 1
        cuts.append(s)
    return np.asarray(cuts, dtype=np.int64)


def token_budget_batches(
    lengths: Sequence[int],
    max_tokens: int,
    order: Sequence[int] | None = None,
    max_sentences: int | None = None,
) -> list[list[int]]:
    """Cut length-sorted indices into batches of at most ``max_tokens`` padded tokens (fairseq).

    A batch of n pairs whose longest has length m costs n·m tokens (the
    padded batch); a pair longer than ``max_tokens`` gets a batch of its own.
    ``order`` (default: indices sorted by length) must already be length-sorted.
    """
    lengths = _as_lengths(lengths)
    order = np.argsort(lengths, kind="stable") if order is None else np.asarray(order, dtype=np.int64)
    cuts = _budget_cuts(lengths[order], max_tokens, max_sentences)
    return [order[a:b].tolist() for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())]


class TokenBudgetBatchSampler(_EpochBatchSampler):
    """Token-budget batching (fairseq's ``max_tokens``; Ott et al. 2019).

    Every epoch: order the pairs by length (ties in a fresh random order), cut
    them into batches of at most ``max_tokens`` padded tokens
    (:func:`token_budget_batches`), then shuffle the order of the batches.
    Similar lengths share a batch, so padding is a small fraction of it, and
    each batch costs about the same. Reseeded per epoch from ``seed`` + epoch.

    Args:
        lengths: per-pair length (:meth:`PairDataset.lengths`).
        max_tokens: padded-token budget per batch (≥ the longest pair is sensible).
        shuffle: shuffle ties and batch order (training); else one fixed order.
        num_replicas, rank: DDP sharding (see :class:`_EpochBatchSampler`).
    Raises:
        ValueError: if ``max_tokens`` < 1.
    """

    def __init__(
        self,
        lengths,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {max_tokens}")
        super().__init__(lengths, shuffle, seed, num_replicas, rank)
        self.max_tokens = max_tokens
        # Ties do not change the sorted lengths, so every epoch has these cuts.
        self._cuts = _budget_cuts(np.sort(self.lengths), max_tokens)

    def _cut(self, order):
        return _stable_sort_by(order, self.lengths), self._cuts  # stable: ties keep the shuffled order

    def _num_epoch_batches(self):
        return len(self._cuts) - 1


def padding_fraction(batches, src: Sequence, tgt: Sequence) -> float:
    """Share of <pad> in the padded ``src`` and ``tgt_in`` tensors of ``batches`` (lists of indices).

    Uses :func:`collate`'s layout: source + <eos>, <bos> + target.
    """
    real = padded = 0
    for b in batches:
        s, t = [len(src[i]) + 1 for i in b], [len(tgt[i]) + 1 for i in b]
        real += sum(s) + sum(t)
        padded += len(b) * (max(s) + max(t))
    return 1.0 - real / padded if padded else 0.0
