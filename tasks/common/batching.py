"""Batching for sequence-to-sequence tasks (headline, mt): length-grouped shuffling, padding, and
the loaders of a datamodule that holds encoded examples per split.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from attnlab.sampling import LengthGroupedSampler

SPLITS = ("train", "val", "test")
# the splits each Lightning stage needs
STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """(B, max length) long tensor of the rows, right-padded with pad_id."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


class EncodedSplitsDataModule(pl.LightningDataModule):
    """The part of a sequence-to-sequence datamodule that does not depend on the task.

    A subclass fills `self.data[split]` in `setup(stage)` with encoded examples (dicts with at least
    `src_ids` and `tgt_ids`; `subset` draws the `max_*_examples` of a split), and gives the collate
    function. Training batches are length-grouped (`LengthGroupedSampler`, by `sort_length`) in
    an order that depends only on (seed, epoch); validation and test keep the file order.
    """

    def __init__(
        self,
        collate_fn: Callable[[list[dict]], dict],
        batch_size: int,
        eval_batch_size: int,
        num_workers: int = 0,
        limits: dict[str, int | None] | None = None,
        subset_seed: int = 0,
    ) -> None:
        super().__init__()
        self.collate_fn = collate_fn
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.num_workers = int(num_workers)
        self.limits = dict.fromkeys(SPLITS) | (limits or {})
        self.subset_seed = int(subset_seed)
        self.data: dict[str, list[dict]] = {}

    def subset(self, examples: list, split: str) -> list:
        """A seeded random `limits[split]` of the examples (all when no limit), in file order.

        Random, not the first N: the Debian pair files are ordered by package family."""
        limit = self.limits[split]
        if limit is None or limit >= len(examples):
            return examples
        picked = sorted(random.Random(self.subset_seed).sample(range(len(examples)), int(limit)))
        return [examples[i] for i in picked]

    @staticmethod
    def sort_length(example: dict) -> int:
        return len(example["src_ids"])

    def _loader(self, split: str, batch_size: int, shuffle: bool) -> DataLoader:
        if split not in self.data:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        data = self.data[split]
        return DataLoader(
            data,
            batch_size=batch_size,
            # order depends only on (seed, epoch): a resumed run sees the same batches
            sampler=LengthGroupedSampler([self.sort_length(d) for d in data], batch_size)
            if shuffle else None,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size, shuffle=False)
