"""`EpochSeededSampler`: shuffling that depends only on (seed, epoch), and resumes mid-epoch.

Lightning calls `set_epoch` on the sampler before each epoch, so the order of epoch e is the same
in an uninterrupted run and in one resumed from a checkpoint (a plain RandomSampler draws from the
global RNG and breaks that). Under DDP Lightning swaps in a DistributedSampler, seeded the same way.

A checkpoint taken in the middle of an epoch records how many samples of it were consumed
(attnlab.callbacks.RngState); on resume `resume(epoch, consumed)` makes the next pass over that
epoch start right after them. (Lightning 2.6 restores its batch counters mid-epoch but restarts a
plain DataLoader from its first batch, with a warning: the same batches would be trained twice.)
"""

from __future__ import annotations

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
