"""LightningDataModule over the tokenize stage's output folder."""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from attnlab.data.batching import BucketBatchSampler, PairDataset, TokenBudgetBatchSampler, collate
from attnlab.data.tokenizer import load_split, load_tokenizer


class ArrayDataset(Dataset):
    """Rows of equal-length batch arrays (D2L's fixed ``num_steps`` data, :mod:`attnlab.data.d2l`).

    ``arrays``: ``src``, ``tgt_in``, ``tgt_out`` (N, num_steps) and
    ``src_valid_lens`` (N,), int64. Item i is the dict of row i; the default
    collate stacks rows into the batch dict of :mod:`attnlab.data.batching`.
    """

    def __init__(self, arrays: dict[str, torch.Tensor]):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays["src"])

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.arrays.items()}


class TranslationDataModule(pl.LightningDataModule):
    """Train/val/test loaders of the tokenized corpus.

    Sentencepiece corpora give length-bucketed batches (see
    :mod:`attnlab.data.batching`); ``data=fra_eng_d2l`` gives D2L's
    fixed-length rows, shuffled for training as D2L's ``DataLoader`` does.

    Args:
        tokenized_dir: folder with the tokenizer (``spm.model`` or ``vocab.json``)
            and ``{train,val,test}.npz``.
        batch_size: sentence pairs per batch (validation/test; training too unless ``max_tokens``).
        max_len: training pairs with ≥ max_len tokens on a side are dropped (val/test keep all).
        seed: shuffling seed.
        max_tokens: padded-token budget of a training batch
            (:class:`attnlab.data.batching.TokenBudgetBatchSampler`); ``None`` for ``batch_size``.
    Attributes: ``tokenizer``; ``vocab_size`` (joint or target vocabulary);
    ``src_vocab_size`` (separate source vocabulary, else ``None``).
    """

    def __init__(self, tokenized_dir: str | Path, batch_size: int = 128, max_len: int = 100,
                 seed: int = 0, num_workers: int = 0, max_tokens: int | None = None):
        super().__init__()
        self.max_tokens = max_tokens
        self.dir = Path(tokenized_dir)
        self.batch_size = batch_size
        self.max_len = max_len
        self.seed = seed
        self.num_workers = num_workers
        self.tokenizer = load_tokenizer(self.dir)
        self.fixed_length = hasattr(self.tokenizer, "source_vocab_size")
        self.vocab_size = self.tokenizer.get_piece_size()
        self.src_vocab_size = self.tokenizer.source_vocab_size() if self.fixed_length else None
        self.splits: dict[str, Dataset] = {}

    def dataset(self, split: str) -> Dataset:
        if split not in self.splits:
            if self.fixed_length:
                from attnlab.data.d2l import load_arrays

                self.splits[split] = ArrayDataset(load_arrays(self.dir / f"{split}.npz"))
            else:
                src, tgt = load_split(self.dir / f"{split}.npz")
                self.splits[split] = PairDataset(src, tgt, self.max_len if split == "train" else None)
        return self.splits[split]

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        ds = self.dataset(split)
        if self.fixed_length:
            gen = torch.Generator().manual_seed(self.seed)
            return DataLoader(ds, batch_size=self.batch_size, shuffle=shuffle, generator=gen,
                              num_workers=self.num_workers)
        if split == "train" and self.max_tokens:
            sampler = TokenBudgetBatchSampler(ds.lengths(), self.max_tokens, shuffle=shuffle, seed=self.seed)
        else:
            sampler = BucketBatchSampler(ds.lengths(), self.batch_size, shuffle=shuffle, seed=self.seed)
        return DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers)

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("val", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)
