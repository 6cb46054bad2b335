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
        keep = [i for i in range(len(src))
                if max_len is None or (len(src[i]) < max_len and len(tgt[i]) < max_len)]
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


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar-length pairs: shuffle, sort within pools of ``pool_batches``
    batches, cut into batches of ``batch_size``, shuffle the batches. Reseeded
    per epoch from ``seed`` + epoch, so runs are reproducible.
    """

    def __init__(self, lengths: list[int], batch_size: int, shuffle: bool = True,
                 seed: int = 0, pool_batches: int = 50):
        self.lengths = lengths
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.pool = batch_size * pool_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        else:
            self.pool = len(order) or 1
        batches = []
        for p in range(0, len(order), self.pool):
            pool = sorted(order[p : p + self.pool], key=lambda i: self.lengths[i])
            batches += [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        if self.shuffle:
            rng.shuffle(batches)
        self.epoch += 1
        return iter(batches)

    def __len__(self):
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size
