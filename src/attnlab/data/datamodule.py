"""LightningDataModule over the tokenize stage's output folder."""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from attnlab.data.batching import BucketBatchSampler, PairDataset, collate
from attnlab.data.tokenizer import load_sentencepiece, load_split


class TranslationDataModule(pl.LightningDataModule):
    """Train/val/test loaders of length-bucketed batches (see :mod:`attnlab.data.batching`).

    Args:
        tokenized_dir: folder with ``spm.model`` and ``{train,val,test}.npz``.
        batch_size: sentence pairs per batch.
        max_len: training pairs with ≥ max_len tokens on a side are dropped (val/test keep all).
        seed: bucket shuffling seed.
    """

    def __init__(self, tokenized_dir: str | Path, batch_size: int = 128, max_len: int = 100,
                 seed: int = 0, num_workers: int = 0):
        super().__init__()
        self.dir = Path(tokenized_dir)
        self.batch_size = batch_size
        self.max_len = max_len
        self.seed = seed
        self.num_workers = num_workers
        self.tokenizer = load_sentencepiece(self.dir / "spm.model")
        self.vocab_size = self.tokenizer.get_piece_size()
        self.splits: dict[str, PairDataset] = {}

    def dataset(self, split: str) -> PairDataset:
        if split not in self.splits:
            src, tgt = load_split(self.dir / f"{split}.npz")
            self.splits[split] = PairDataset(src, tgt, self.max_len if split == "train" else None)
        return self.splits[split]

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        ds = self.dataset(split)
        sampler = BucketBatchSampler(ds.lengths(), self.batch_size, shuffle=shuffle, seed=self.seed)
        return DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers)

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("val", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)
