"""`EpochSeededSampler`: shuffling that depends only on (seed, epoch), and resumes mid-epoch;
`LengthGroupedSampler` too.

Lightning calls `set_epoch` on the sampler before each epoch, so the order of epoch e is the same
in an uninterrupted run and in one resumed from a checkpoint (a plain RandomSampler draws from the
global RNG and breaks that). Under DDP Lightning swaps in a DistributedSampler, seeded the same way.

A checkpoint taken in the middle of an epoch records how many samples of it were consumed
(attnlab.callbacks.RngState); on resume `resume(epoch, consumed)` makes the next pass over that
epoch start right after them. (Lightning 2.6 restores its batch counters mid-epoch but restarts a
plain DataLoader from its first batch, with a warning: the same batches would be trained twice.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Sampler


class EpochSeededSampler(Sampler[int]):
    def __init__(self, n: int, seed: int | None = None) -> None:
        self.n = int(n)
        # default: the run's seed (seed_everything set torch's initial seed)
        self.seed = int(torch.initial_seed() if seed is None else seed) % (2**31)
        self.epoch = 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def resume(self, epoch: int, consumed: int) -> None:
        """The next pass over `epoch` skips its first `consumed` indices (once)."""
        self._resume = (int(epoch), int(consumed))

    def epoch_order(self) -> list[int]:
        """All indices of the current epoch, in order (subclasses change the order here)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self):
        order = self.epoch_order()
        if self._resume is not None and self._resume[0] == self.epoch:
            order = order[self._resume[1]:]
        self._resume = None
        return iter(order)

    def __len__(self) -> int:
        return self.n


class LengthGroupedSampler(EpochSeededSampler):
    """A random order in which neighbours have similar lengths (less padding).

    As HF's LengthGroupedSampler: shuffle, cut into pools of `pool` batches, sort each pool by
    length (longest first), and shuffle the batches of the pool. A DataLoader taking
    `batch_size` indices at a time then pads each batch to a similar length; the order depends
    only on (seed, epoch), like `EpochSeededSampler`, so resumed runs see the same batches.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int | None = None,
                 pool: int = 50) -> None:
        super().__init__(len(lengths), seed)
        self.lengths = torch.as_tensor(list(lengths))
        self.batch_size, self.pool = int(batch_size), int(pool)

    def epoch_order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.n, generator=g)
        result = []
        for start in range(0, self.n, self.batch_size * self.pool):
            chunk = order[start : start + self.batch_size * self.pool]
            chunk = chunk[torch.argsort(self.lengths[chunk], descending=True, stable=True)]
            batches = list(chunk.split(self.batch_size))
            for i in torch.randperm(len(batches), generator=g).tolist():
                result.extend(batches[i].tolist())
        return result
