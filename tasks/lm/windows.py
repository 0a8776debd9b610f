"""Windows over a token stream: training blocks and sliding-context evaluation.

A split is one stream `s` of N tokens. As in fairseq, the model input is the stream shifted right
by one with an end-of-segment token in front, `x = [eos] + s`, so every one of the N tokens is a
target (the first one predicted after "the end of a previous segment"). A window (start, end,
score_from) feeds `x[start:end]` and predicts `s[start:end]`; only the targets from `score_from`
on are scored, the others are context.

`windows(n, block_size, stride)`:
- the first window holds the first block_size targets, all scored (their context is all there is);
- each next window scores the next `stride` targets and ends at the last of them, reaching back
  block_size positions: each scored target sees at least block_size - stride + 1 inputs.
Every target is scored exactly once. `stride = block_size` gives contiguous blocks (training,
and fairseq's default evaluation); a smaller stride is fairseq's `--context-window
block_size - stride` (CODA evaluates Wikitext-103 with tokens-per-sample 512, context window
480: block_size 512, stride 32). All windows are block_size long when N >= block_size, so
batches need padding only for a stream shorter than one block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from attnlab.errors import ConfigError


class Window(NamedTuple):
    start: int  # first target (and input) position of the window
    end: int  # one past the last target
    score_from: int  # targets before this are context only


def windows(n_tokens: int, block_size: int, stride: int | None = None) -> list[Window]:
    """The windows over a stream of n_tokens targets (see the module docstring)."""
    stride = block_size if stride is None else stride
    if block_size < 1 or not 1 <= stride <= block_size:
        raise ConfigError(
            f"block_size={block_size}, eval_stride={stride}: need 1 <= task.eval_stride <= "
            f"task.data.block_size (the stride is the number of new tokens scored per window)"
        )
    if n_tokens <= 0:
        return []
    result = [Window(0, min(block_size, n_tokens), 0)]
    while result[-1].end < n_tokens:
        first = result[-1].end
        end = min(first + stride, n_tokens)
        result.append(Window(max(0, end - block_size), end, first))
    return result


class TokenWindows(Dataset):
    """Windows of a token stream as dicts of `input_ids`, `target_ids`, `score_mask` (1-D)."""

    def __init__(self, stream: np.ndarray, eos_id: int, block_size: int, stride: int | None = None) -> None:
        self.stream = torch.from_numpy(np.asarray(stream))  # no copy: Wikitext-103 is 103M tokens
        self.eos = torch.tensor([eos_id], dtype=self.stream.dtype)
        self.windows = windows(len(stream), block_size, stride)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict:
        start, end, score_from = self.windows[index]
        # x = [eos] + s: input i is x[i] = s[i - 1], target i is s[i]
        inputs = self.stream[start - 1 : end - 1] if start else torch.cat([self.eos, self.stream[: end - 1]])
        return {
            "input_ids": inputs.long(),
            "target_ids": self.stream[start:end].long(),
            "score_mask": torch.arange(start, end) >= score_from,
        }

    def scored_tokens(self) -> int:
        return sum(end - score_from for _, end, score_from in self.windows)


class EvaluationShards(DistributedSampler):
    """Windows rank, rank + world, rank + 2 world, ... for one of `world` processes, nothing repeated.

    Lightning's DistributedSampler pads an evaluation split with repeated windows so that every
    process gets as many: their tokens would be scored twice and bias the perplexity. Being a
    DistributedSampler, this one is kept by Lightning as it is; the processes may then see one
    batch more or less than each other, which evaluation allows (metrics are summed at the end).
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.indices = list(range(rank, len(dataset), num_replicas))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def collate_windows(pad_id: int):
    """Stack windows, padding short ones at the end: padding is never scored.

    Adds `padding_mask` (True = padding, the library's convention); it is all False unless a
    split is shorter than one block.
    """

    def collate(items: Sequence[dict]) -> dict:
        length = max(len(item["input_ids"]) for item in items)
        batch = {
            "input_ids": torch.full((len(items), length), pad_id, dtype=torch.long),
            "target_ids": torch.full((len(items), length), pad_id, dtype=torch.long),
            "score_mask": torch.zeros(len(items), length, dtype=torch.bool),
            "padding_mask": torch.ones(len(items), length, dtype=torch.bool),
        }
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            for name in ("input_ids", "target_ids", "score_mask"):
                batch[name][row, :n] = item[name]
            batch["padding_mask"][row, :n] = False
        return batch

    return collate
