"""Each DDP rank's share of a validation split, every item read once across the ranks.

Lightning's own ``DistributedSampler`` pads the ranks to equal shares by repeating items, and
a metric reduced across the ranks then counts those items twice. The translation data have
their own batch sampler, which marks its repeats (:class:`attnlab.data.datamodule.CountOnceLoader`);
the small in-memory splits of the image models and of Nadaraya–Watson are shared out here.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.distributed as dist
from torch.utils.data import Sampler

from attnlab.errors import ConfigError


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the running process group; (0, 1) outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RankShard(Sampler[int]):
    """The indices ``rank, rank + world, …`` of a split of ``n`` items: under DDP each rank reads
    its share, some ranks one item fewer, and no item twice; outside DDP all ``n`` in order.

    The rank is read when the loader is iterated (the process group exists by then; the loader
    is built before it). Validation only: the ranks run unequal numbers of steps, which needs
    a step free of collectives (a metric that syncs at the epoch's end, not a DDP backward).

    Raises:
        ConfigError: from iterating it, when the split has fewer items than there are ranks (a
            rank with nothing to score could not take part in the metrics' sync).
    """

    def __init__(self, n: int):
        self.n = n

    def _indices(self) -> range:
        rank, world = rank_and_world()
        if self.n < world:
            raise ConfigError(
                f"a validation split of {self.n} item(s) cannot be shared by {world} DDP ranks: "
                f"run on at most {self.n} devices (device.devices), or validate on more data"
            )
        return range(rank, self.n, world)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())
