"""LightningDataModule over the tokenize stage's output folder.

A sentencepiece corpus's splits are memory-mapped (:func:`attnlab.data.tokenizer.load_split`)
and batched from numpy arrays (:mod:`attnlab.data.batching`): what training holds grows with
the corpus by a few bytes a pair, whatever its size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

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


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over a batch sampler of :mod:`attnlab.data.batching` whose place in
    the epoch is saved in Lightning checkpoints, so a run killed mid-epoch resumes at the
    next batch, not at the start of the epoch.

    Lightning saves :meth:`state_dict` (``epoch``: the sampler epoch of the current
    iterator; ``batches_done``: batches it yielded) in every checkpoint and calls
    :meth:`load_state_dict` before it iterates on resume (``_Stateful`` loaders,
    ``pytorch_lightning.loops.fit_loop``). Works with ``num_workers=0``, where the
    sampler is not read ahead. A state saved after the epoch's last batch (the checkpoint
    Lightning writes at the epoch's end) resumes at the start of the next epoch.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._epoch, self._batches_done = 0, 0

    def __iter__(self):
        sampler = self.batch_sampler
        self._epoch, self._batches_done = sampler.epoch, sampler.skip
        for batch in super().__iter__():
            self._batches_done += 1
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "batches_done": self._batches_done}

    def load_state_dict(self, state: dict) -> None:
        epoch, done = state["epoch"], state["batches_done"]
        if done >= len(self.batch_sampler):  # the epoch had ended: the next one, from its start
            epoch, done = epoch + 1, 0
        self.batch_sampler.set_epoch(epoch)
        self.batch_sampler.skip = done


class CountOnceLoader(DataLoader):
    """A validation or test ``DataLoader`` over a batch sampler of :mod:`attnlab.data.batching`
    whose batches say which of their pairs a metric counts.

    Under DDP every rank must run the same number of steps, so the sampler pads a short rank's
    share with a repeat of a batch another rank reads (``_EpochBatchSampler``). Each batch
    dict gets ``counted``: a (B,) bool tensor, False for the pairs of such a repeat
    (the batches after the sampler's ``num_own_batches()``), True for the others. Metrics
    that leave out the pairs with ``counted`` False count every pair of the split once, on
    any number of ranks (:meth:`attnlab.lit.translation.TranslationModule.validation_step`).
    """

    def __iter__(self):
        sampler = self.batch_sampler
        own = sampler.num_own_batches() - sampler.skip  # read before the sampler resets skip
        for k, batch in enumerate(super().__iter__()):
            batch["counted"] = torch.full((len(batch["src"]),), k < own)
            yield batch


class TranslationDataModule(pl.LightningDataModule):
    """Train/val/test loaders of the tokenized corpus.

    Sentencepiece corpora give length-bucketed batches (see
    :mod:`attnlab.data.batching`); ``data=fra_eng_d2l`` gives D2L's
    fixed-length rows, shuffled for training (a permutation per epoch from seed + epoch).

    Args:
        tokenized_dir: folder with the tokenizer (``spm.model`` or ``vocab.json``)
            and the splits' ids (``{split}.{src,tgt}.{ids,offsets}.npy``, memory-mapped;
            D2L's arrays: ``{train,val}.npz``).
        batch_size: sentence pairs per batch (validation/test; training too unless ``max_tokens``).
        max_len: training pairs with ≥ max_len tokens on a side are dropped (val/test keep all).
        seed: shuffling seed.
        max_tokens: padded-token budget of a training batch
            (:class:`attnlab.data.batching.TokenBudgetBatchSampler`); ``None`` for ``batch_size``.
    Under DDP (a Trainer with world size > 1 attached) each rank gets its shard of the
    batches; the Trainer must run with ``use_distributed_sampler=False``
    (``conf/device/ddp.yaml``). Every rank runs the same number of steps, so a short rank's
    share is padded with a repeated batch; validation and test batches mark its pairs
    ``counted`` False (:class:`CountOnceLoader`), so that metrics count each pair once (D2L's
    fixed-length val/test rows too). The training loader of a sentencepiece corpus resumes
    mid-epoch (:class:`ResumableDataLoader`); D2L's fixed-length one restarts its epoch.
    Attributes: ``tokenizer`` (:func:`attnlab.data.tokenizer.load_tokenizer`); ``fixed_length``
    (the tokenizer's: D2L's arrays, else sentencepiece pairs); ``vocab_size`` (joint or target
    vocabulary); ``src_vocab_size`` (separate source vocabulary, else ``None``).
    """

    def __init__(
        self,
        tokenized_dir: str | Path,
        batch_size: int = 128,
        max_len: int = 100,
        seed: int = 0,
        num_workers: int = 0,
        max_tokens: int | None = None,
    ):
        super().__init__()
        self.max_tokens = max_tokens
        self.dir = Path(tokenized_dir)
        self.batch_size = batch_size
        self.max_len = max_len
        self.seed = seed
        self.num_workers = num_workers
        self.tokenizer = load_tokenizer(self.dir)
        self.fixed_length = self.tokenizer.fixed_length
        self.vocab_size = self.tokenizer.get_piece_size()
        self.src_vocab_size = self.tokenizer.source_vocab_size()
        self.splits: dict[str, Dataset] = {}

    def dataset(self, split: str) -> Dataset:
        if split not in self.splits:
            if self.fixed_length:
                from attnlab.data.d2l import load_arrays

                self.splits[split] = ArrayDataset(load_arrays(self.dir / f"{split}.npz"))
            else:
                vocab = (self.src_vocab_size or self.vocab_size, self.vocab_size)
                src, tgt = load_split(self.dir / split, vocab)
                self.splits[split] = PairDataset(src, tgt, self.max_len if split == "train" else None)
        return self.splits[split]

    def fixed_batch(self, split: str, n: int) -> dict[str, torch.Tensor]:
        """The first ``n`` pairs of ``split`` (all, if fewer) as one batch, in the training
        batches' format (:mod:`attnlab.data.batching`: ``src``, ``src_valid_lens``, ``tgt_in``,
        ``tgt_out``), on the CPU: a fixed sample, the same every epoch and on every rank.

        Raises:
            ValueError: ``n`` < 1 or an empty split.
        """
        ds = self.dataset(split)
        if n < 1 or len(ds) == 0:
            raise ValueError(
                f"a fixed batch of {n} pairs from the {len(ds)} of split {split!r}: "
                "give n ≥ 1 and a split with pairs"
            )
        items = [ds[i] for i in range(min(n, len(ds)))]
        return default_collate(items) if self.fixed_length else collate(items)

    def _replicas(self) -> tuple[int, int]:
        """(world size, global rank) of the attached Trainer; (1, 0) without one."""
        trainer = getattr(self, "trainer", None)
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        ds = self.dataset(split)
        world, rank = self._replicas()
        train = split == "train"
        if self.fixed_length and train:
            # One replica: a permutation drawn from seed + epoch (set_epoch), not from a generator
            # that a resumed run would restart, so a resumed epoch sees the uninterrupted order.
            sampler = DistributedSampler(ds, max(world, 1), rank, shuffle=shuffle, seed=self.seed)
            return DataLoader(ds, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers)
        shard = {"num_replicas": world, "rank": rank}
        if self.fixed_length:
            # Rows of equal length: the unshuffled bucket sampler keeps them in order, in batches
            # of batch_size, sharded and marked as the pairs' are (CountOnceLoader).
            lengths = np.ones(len(ds), dtype=np.uint8)
            sampler = BucketBatchSampler(lengths, self.batch_size, shuffle=False, seed=self.seed, **shard)
        elif train and self.max_tokens:
            sampler = TokenBudgetBatchSampler(
                ds.lengths(), self.max_tokens, shuffle=shuffle, seed=self.seed, **shard
            )
        else:
            sampler = BucketBatchSampler(
                ds.lengths(), self.batch_size, shuffle=shuffle, seed=self.seed, **shard
            )
        # Training resumes mid-epoch; validation and test mark the repeats that pad a rank.
        loader = ResumableDataLoader if train else CountOnceLoader
        # Its own generator: a DataLoader without one draws its base seed from torch's global
        # RNG each time it is iterated, which would shift the dropout masks of a resumed run.
        return loader(
            ds,
            batch_sampler=sampler,
            collate_fn=default_collate if self.fixed_length else collate,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self):
        """The training loader, its sampler set to the epoch the attached Trainer runs next.

        Lightning creates the training iterator, and fetches its first batch, before it
        calls ``set_epoch`` (``FitLoop.setup_data`` before ``on_advance_start``; Lightning
        issue #21938), and loads no loader state from a checkpoint written at an epoch's
        end: without this, a run resumed at an epoch boundary would train its first epoch
        in epoch 0's order. ``epoch_progress.current.processed`` is restored by then and is
        the value ``on_advance_start`` passes to ``set_epoch``.
        """
        loader = self._loader("train", shuffle=True)
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            sampler = getattr(loader, "batch_sampler", None)
            if not hasattr(sampler, "set_epoch"):
                sampler = loader.sampler
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(trainer.fit_loop.epoch_progress.current.processed)
        return loader

    def val_dataloader(self):
        return self._loader("val", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)
