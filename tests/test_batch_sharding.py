"""DDP sharding and mid-epoch resumption of the batch samplers (attnlab.data.batching)."""

import pytest
import torch

from attnlab.data.batching import BucketBatchSampler, PairDataset, TokenBudgetBatchSampler, collate
from attnlab.data.datamodule import CountOnceLoader, ResumableDataLoader

LENGTHS = [3, 9, 4, 7, 7, 2, 12, 5, 6, 8, 3, 10, 4]


def _samplers(**kw):
    return [
        TokenBudgetBatchSampler(LENGTHS, max_tokens=20, seed=3, **kw),
        BucketBatchSampler(LENGTHS, batch_size=2, seed=3, **kw),
    ]


@pytest.mark.parametrize("index", [0, 1], ids=["token_budget", "bucket"])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_one_epoch_between_them(index, world):
    full = _samplers()[index]
    full.set_epoch(4)
    batches = list(full)
    shards = []
    for rank in range(world):
        s = _samplers(num_replicas=world, rank=rank)[index]
        s.set_epoch(4)
        shards.append(list(s))
        assert len(shards[-1]) == len(s) == -(-len(batches) // world)  # same step count everywhere
    # Rank r gets batches r, r + world, …; the list is padded by wrapping around.
    padded = (batches * 2)[: len(shards[0]) * world]
    assert [b for i in range(len(shards[0])) for b in (sh[i] for sh in shards)] == padded
    covered = sorted(i for sh in shards for b in sh for i in b)
    assert set(covered) == set(range(len(LENGTHS)))


@pytest.mark.parametrize("index", [0, 1], ids=["token_budget", "bucket"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_the_counted_pairs_of_all_ranks_are_the_epoch_each_once(index, world):
    """Every rank yields the same number of batches (validation and test order: unshuffled);
    the repeats that pad a short rank come last and are marked not counted, so the counted
    pairs of all ranks hold each pair exactly once, whatever the world size (8: more ranks
    than batches, some ranks hold nothing but a repeat)."""
    # pair i's source is LENGTHS[i] tokens of id 100 + i: its first token names it
    ds = PairDataset([[100 + i] * n for i, n in enumerate(LENGTHS)], [[5] * n for n in LENGTHS])
    num_batches = len(_samplers(shuffle=False)[index])
    counted, steps, repeats = [], set(), 0
    for rank in range(world):
        sampler = _samplers(num_replicas=world, rank=rank, shuffle=False)[index]
        batches = list(CountOnceLoader(ds, batch_sampler=sampler, collate_fn=collate))
        steps.add(len(batches))
        flags = []
        for batch in batches:
            assert batch["counted"].dtype == torch.bool and batch["counted"].shape == batch["src"].shape[:1]
            assert batch["counted"].all() or not batch["counted"].any()  # a whole batch is a repeat
            flags.append(bool(batch["counted"].any()))
            counted += (batch["src"][batch["counted"], 0] - 100).tolist()
        assert flags == sorted(flags, reverse=True) and flags.count(False) <= 1  # the last, if any
        repeats += flags.count(False)
    assert steps == {-(-num_batches // world)}
    assert repeats == -(-num_batches // world) * world - num_batches
    assert sorted(counted) == list(range(len(LENGTHS)))


def test_rank_out_of_range_is_an_error():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        TokenBudgetBatchSampler(LENGTHS, max_tokens=20, num_replicas=2, rank=2)


def test_resumable_loader_continues_where_it_stopped():
    ds = PairDataset([list(range(n)) for n in LENGTHS], [list(range(n)) for n in LENGTHS])
    make = lambda: ResumableDataLoader(
        ds,
        batch_sampler=TokenBudgetBatchSampler(ds.lengths(), max_tokens=20, seed=1),
        collate_fn=collate,
        generator=torch.Generator().manual_seed(0),
    )
    loader = make()
    loader.batch_sampler.set_epoch(2)
    full = [b["src"].tolist() for b in loader]
    loader.batch_sampler.set_epoch(2)
    it = iter(loader)
    seen = [next(it)["src"].tolist() for _ in range(3)]
    state = loader.state_dict()
    assert state == {"epoch": 2, "batches_done": 3}
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b["src"].tolist() for b in resumed]
    assert seen + rest == full
    assert resumed.state_dict() == {"epoch": 2, "batches_done": len(full)}
    # The skip applies once: the next epoch is whole again.
    assert len(list(resumed)) == len(full)
