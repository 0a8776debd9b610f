"""`SplitsDataModule`: the train/val/test loaders of every task's datamodule, written once.

A task's datamodule prepares and encodes its data; this base turns a split into a DataLoader:
training batches of `batch_size` in an order that depends only on (seed, epoch) (the sampler is
an `EpochSeededSampler`, so a resumed run sees the same batches and `RngState` can resume it in
the middle of an epoch), evaluation batches of `eval_batch_size` in the split's own order.

A subclass gives:
    split_data(split)      the split's dataset (set up on demand where the task allows it)
    train_sampler(data)    an `EpochSeededSampler` or subclass (default: plain seeded shuffling)
    eval_sampler(data)     None (the split's order; default) or a sampler (DDP shards)
and passes `collate_fn` and the loader sizes to `__init__`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytorch_lightning as pl
from torch.utils.data import DataLoader, Sampler

from attnlab.sampling import EpochSeededSampler

T = TypeVar("T")


def seeded_subset(examples: Sequence[T], limit: int | None, seed: int) -> list[T]:
    """A random `limit` of the examples drawn with `seed` (all when no limit), in their order.

    Random, not the first N: data files are often ordered (by package family, by label)."""
    if limit is None or int(limit) >= len(examples):
        return list(examples)
    picked = sorted(random.Random(int(seed)).sample(range(len(examples)), int(limit)))
    return [examples[i] for i in picked]


class SplitsDataModule(pl.LightningDataModule):
    def __init__(
        self,
        collate_fn: Callable[[Any], dict],
        batch_size: int,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int | None = None,
        persistent_workers: bool | None = None,
    ) -> None:
        """`eval_batch_size` None: `batch_size`. `seed` None: the run's seed (torch's initial
        seed, set by seed_everything). `persistent_workers` None: whenever there are workers."""
        super().__init__()
        self.collate_fn = collate_fn
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.num_workers = int(num_workers)
        self.sampler_seed = None if seed is None else int(seed)
        if persistent_workers is None:
            persistent_workers = self.num_workers > 0
        self.persistent_workers = bool(persistent_workers)

    # -- what a task gives ---------------------------------------------------------------------

    def split_data(self, split: str):
        raise NotImplementedError(f"{type(self).__name__} must define split_data(split)")

    def train_sampler(self, data) -> EpochSeededSampler:
        return EpochSeededSampler(len(data), self.sampler_seed)

    def eval_sampler(self, data) -> Sampler | None:
        return None

    # -- loaders -------------------------------------------------------------------------------

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        data = self.split_data(split)
        return DataLoader(
            data,
            batch_size=self.batch_size if shuffle else self.eval_batch_size,
            # order depends only on (seed, epoch): a resumed run sees the same batches
            sampler=self.train_sampler(data) if shuffle else self.eval_sampler(data),
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)
