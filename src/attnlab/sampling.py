"""`EpochSeededSampler`: shuffling that depends only on (seed, epoch).

Lightning calls `set_epoch` on the sampler before each epoch, so the order of epoch e is the same
in an uninterrupted run and in one resumed from a checkpoint (a plain RandomSampler draws from the
global RNG and breaks that). Under DDP Lightning swaps in a DistributedSampler, seeded the same way.
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

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n
