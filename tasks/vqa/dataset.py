"""The encoded VQA splits: where each question's box features come from, and whole batches.

The batch layout is described in `tasks.vqa.datamodule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from tasks.vqa.vqav2 import MMFFeatures


@dataclass
class RawSplit:
    """One split before encoding: strings, plus where each question's image features are."""

    questions: list[str]
    answers: list[list[str]]
    question_types: list[str]
    image_keys: np.ndarray  # per question: its image's key in the feature store
    store: Any  # SyntheticStore | MMFStore
    hidden: np.ndarray | None = None  # synthetic: answer depends on objects the primary misses


class SyntheticStore:
    """The generated features, held in memory (float16) and converted per batch."""

    def __init__(
        self,
        features: np.ndarray,
        bbox: np.ndarray,
        num_boxes: np.ndarray,
        box_kind: np.ndarray | None = None,
    ) -> None:
        self.features = torch.from_numpy(features)
        self.bbox = torch.from_numpy(bbox)
        self.num_boxes = torch.from_numpy(num_boxes.astype(np.int64))
        self.box_kind = None if box_kind is None else torch.from_numpy(box_kind)

    @property
    def feature_dim(self) -> int:
        return self.features.shape[-1]

    def batch(self, keys: np.ndarray):
        idx = torch.from_numpy(np.asarray(keys, dtype=np.int64))
        return self.features[idx].float(), self.bbox[idx].float(), self.num_boxes[idx]


class MMFStore:
    """Real per-image feature files (read when a batch needs them)."""

    def __init__(self, features: MMFFeatures) -> None:
        self.files = features

    @property
    def feature_dim(self) -> int:
        return self.files.feature_dim

    def batch(self, keys: np.ndarray):
        loaded = [self.files.load(int(k)) for k in keys]
        return tuple(torch.from_numpy(np.stack(parts)) for parts in zip(*loaded))


class VQADataset(Dataset):
    """Encoded questions of one split; `__getitems__` builds a whole batch at once."""

    def __init__(
        self,
        split: RawSplit,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        answer_ids: torch.Tensor,
        answer_scores: torch.Tensor,
        type_ids: torch.Tensor,
        num_answers: int,
        box_coords: bool,
    ) -> None:
        self.split = split
        self.tokens, self.lengths = tokens, lengths
        # Sparse targets (answer index, score), -1 = none: dense (Q x A) would not fit for VQA-v2.
        self.answer_ids, self.answer_scores = answer_ids, answer_scores
        self.type_ids = type_ids
        self.num_answers = num_answers
        self.box_coords = box_coords

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        features, bbox, num_boxes = self.split.store.batch(self.split.image_keys[idx.numpy()])
        if self.box_coords:  # where the box is: what lets the fusion match boxes across views
            features = torch.cat([features, bbox], dim=-1)
        n_boxes = features.shape[2]
        box_mask = torch.arange(n_boxes)[None, None, :] >= num_boxes[:, :, None]
        ids, scores = self.answer_ids[idx], self.answer_scores[idx]
        dense = torch.zeros(len(idx), self.num_answers + 1)
        dense.scatter_(1, ids.clamp(min=-1) % (self.num_answers + 1), scores)  # -1 -> spare column
        batch = {
            "features": features,
            "box_mask": box_mask,
            "question": self.tokens[idx],
            "question_length": self.lengths[idx],
            "scores": dense[:, : self.num_answers],
            "question_type": self.type_ids[idx],
        }
        if self.split.hidden is not None:
            batch["hidden"] = torch.from_numpy(self.split.hidden[idx.numpy()])
        box_kind = getattr(self.split.store, "box_kind", None)
        if box_kind is not None:
            batch["box_kind"] = box_kind[torch.from_numpy(self.split.image_keys[idx.numpy()])]
        return batch



def batch_as_is(batch):
    """collate_fn: `__getitems__` already returns a collated batch."""
    return batch
