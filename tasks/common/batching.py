"""Batching for sequence-to-sequence tasks (headline, mt): padding, and the datamodule base of
tasks that hold encoded examples per split, batched by length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnlab.sampling import LengthGroupedSampler
from tasks.common.datamodule import SplitsDataModule, seeded_subset

SPLITS = ("train", "val", "test")
# the splits each Lightning stage needs
STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """(B, max length) long tensor of the rows, right-padded with pad_id."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


class EncodedSplitsDataModule(SplitsDataModule):
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
        super().__init__(collate_fn, batch_size, eval_batch_size, num_workers)
        self.limits = dict.fromkeys(SPLITS) | (limits or {})
        self.subset_seed = int(subset_seed)
        self.data: dict[str, list[dict]] = {}

    def subset(self, examples: list, split: str) -> list:
        """A seeded random `limits[split]` of the examples (all when no limit), in file order."""
        return seeded_subset(examples, self.limits[split], self.subset_seed)

    @staticmethod
    def sort_length(example: dict) -> int:
        return len(example["src_ids"])

    def split_data(self, split: str) -> list[dict]:
        if split not in self.data:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        return self.data[split]

    def train_sampler(self, data: list[dict]) -> LengthGroupedSampler:
        return LengthGroupedSampler([self.sort_length(d) for d in data], self.batch_size)
