"""Token ids → padded, length-bucketed batches.

A batch is a dict of int64 tensors:
``src`` (B, S) source ids + <eos>, padded with <pad>; ``src_valid_lens`` (B,);
``tgt_in`` (B, T) <bos> + target (teacher-forcing input);
``tgt_out`` (B, T) target + <eos> (labels, <pad> where ignored).
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


class PairDataset(Dataset):
    """(source ids, target ids) pairs; pairs longer than ``max_len`` tokens on either side are dropped."""

    def __init__(self, src: list[np.ndarray], tgt: list[np.ndarray], max_len: int | None = None):
        keep = [
            i for i in range(len(src)) if max_len is None or (len(src[i]) < max_len and len(tgt[i]) < max_len)
        ]
        self.src = [src[i] for i in keep]
        self.tgt = [tgt[i] for i in keep]
        self.num_dropped = len(src) - len(keep)

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return self.src[i], self.tgt[i]

    def lengths(self) -> list[int]:
        """Per-pair length used for bucketing: max(source, target) + 1."""
        return [max(len(s), len(t)) + 1 for s, t in zip(self.src, self.tgt)]


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def collate(pairs) -> dict[str, torch.Tensor]:
    """List of (src ids, tgt ids) → the padded batch dict described in the module docstring."""
    src = [list(s) + [EOS_ID] for s, _ in pairs]
    tgt = [list(t) for _, t in pairs]
    return {
        "src": _pad(src),
        "src_valid_lens": torch.tensor([len(s) for s in src], dtype=torch.long),
        "tgt_in": _pad([[BOS_ID] + t for t in tgt]),
        "tgt_out": _pad([t + [EOS_ID] for t in tgt]),
    }


class _EpochBatchSampler(Sampler[list[int]]):
    """Base of the batch samplers below: a fixed batch list per (seed, epoch), sharded over
    DDP ranks, resumable mid-epoch.

    An epoch's batches (the same on every rank): the pair indices, shuffled by
    ``random.Random(seed + epoch)`` when ``shuffle`` is set, cut into batches by the
    subclass's :meth:`_cut`, then (``shuffle``) put in a random order by the same
    generator. Subclasses also implement :meth:`_num_epoch_batches`. With
    ``num_replicas`` > 1 the list is padded by wrapping around to a
    multiple of ``num_replicas`` (as ``DistributedSampler`` does) and rank r takes
    batches r, r + num_replicas, …, so every rank runs the same number of steps.
    ``skip`` batches of the next epoch are left out once (set by
    :class:`attnlab.data.datamodule.ResumableDataLoader` when a run resumes mid-epoch).
    """

    def __init__(self, lengths: list[int], shuffle: bool, seed: int, num_replicas: int = 1, rank: int = 0):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.lengths, self.shuffle, self.seed = lengths, shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _epoch_batches(self, rng: random.Random) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        batches = self._cut(order)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def _cut(self, order: list[int]) -> list[list[int]]:
        """The batches of one epoch from the pair indices in ``order`` (shuffled or not)."""
        raise NotImplementedError

    def _num_epoch_batches(self) -> int:
        raise NotImplementedError

    def __iter__(self):
        batches = self._epoch_batches(random.Random(self.seed + self.epoch))
        if self.num_replicas > 1 and batches:
            total = -(-len(batches) // self.num_replicas) * self.num_replicas
            batches = (batches * (total // len(batches) + 1))[:total][self.rank :: self.num_replicas]
        skip, self.skip = self.skip, 0
        self.epoch += 1
        return iter(batches[skip:])

    def __len__(self):
        return -(-self._num_epoch_batches() // self.num_replicas)


class BucketBatchSampler(_EpochBatchSampler):
    """Batches of similar-length pairs: shuffle, sort within pools of ``pool_batches``
    batches, cut into batches of ``batch_size``, shuffle the batches. Reseeded
    per epoch from ``seed`` + epoch, so runs are reproducible. ``num_replicas``,
    ``rank``: DDP sharding (see :class:`_EpochBatchSampler`).
    """

    def __init__(
        self,
        lengths: list[int],
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
        size = self.pool if self.shuffle else len(order) or 1  # unshuffled: one pool, all sorted
        batches = []
        for p in range(0, len(order), size):
            pool = sorted(order[p : p + size], key=lambda i: self.lengths[i])
            batches += [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        return batches

    def _num_epoch_batches(self):
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size


def token_budget_batches(
    lengths: list[int], max_tokens: int, order: list[int] | None = None, max_sentences: int | None = None
) -> list[list[int]]:
    """Cut length-sorted indices into batches of at most ``max_tokens`` padded tokens (fairseq).

    A batch of n pairs whose longest has length m costs n·m tokens (the
    padded batch); a pair longer than ``max_tokens`` gets a batch of its own.
    ``order`` (default: indices sorted by length) must already be length-sorted.
    """
    if order is None:
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches, cur, longest = [], [], 0
    for i in order:
        m = max(longest, lengths[i])
        if cur and (m * (len(cur) + 1) > max_tokens or len(cur) == (max_sentences or len(order))):
            batches.append(cur)
            cur, m = [], lengths[i]
        cur.append(i)
        longest = m
    if cur:
        batches.append(cur)
    return batches


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
        lengths: list[int],
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
        # Ties do not change the sorted lengths, so every epoch has this many batches.
        self._num_batches = len(token_budget_batches(lengths, max_tokens))

    def _cut(self, order):
        order.sort(key=self.lengths.__getitem__)  # stable: ties keep the shuffled order
        return token_budget_batches(self.lengths, self.max_tokens, order)

    def _num_epoch_batches(self):
        return self._num_batches


def padding_fraction(batches, src: list, tgt: list) -> float:
    """Share of <pad> in the padded ``src`` and ``tgt_in`` tensors of ``batches`` (lists of indices).

    Uses :func:`collate`'s layout: source + <eos>, <bos> + target.
    """
    real = padded = 0
    for b in batches:
        s, t = [len(src[i]) + 1 for i in b], [len(tgt[i]) + 1 for i in b]
        real += sum(s) + sum(t)
        padded += len(b) * (max(s) + max(t))
    return 1.0 - real / padded if padded else 0.0
