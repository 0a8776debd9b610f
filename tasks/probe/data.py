"""`ProbeData`: what every probe generator returns, and how a probe's predictions are scored.

Conventions shared by the token probes (recall, coverage, retrieval, listops):
    token 0 is padding; `padding_mask` is True at padding (the attention modules' convention);
    a sequence-level target is read at position 0, where the probes put a CLS token;
    a per-position target is `IGNORE` (-100, cross-entropy's default ignore_index) where no
    answer is asked.
The cluster probe's inputs are float points (n, L, d) instead of token ids.

Each probe carries its trivial baseline (chance / majority), its predictions and score on the
data, and the score theory expects (None where no closed form exists), so a report can show
the baseline beside the schemes and a test can check the generator against the theory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

IGNORE = -100
PAD = 0

SEQUENCE_CLASS = "sequence_class"  # targets (n,): one class per sequence, read at position 0
TOKEN_CLASS = "token_class"  # targets (n, L): a class per position, IGNORE where none is asked
REGRESSION = "regression"  # targets (n, d) floats, scored by mean squared error
TARGET_KINDS = (SEQUENCE_CLASS, TOKEN_CLASS, REGRESSION)


@dataclass(frozen=True)
class Baseline:
    """A trivial predictor: its name ("chance", "majority"), its predictions (shaped like the
    targets), their score (accuracy, or mean squared error for regression) and the score theory
    expects on a large sample (None where there is no closed form)."""

    name: str
    predictions: Tensor
    score: float
    theory: float | None


@dataclass(frozen=True)
class ProbeData:
    inputs: Tensor  # (n, L) long token ids, or (n, L, d) float points
    targets: Tensor  # (n,) | (n, L) long, or (n, d) float: see target_kind
    padding_mask: Tensor  # (n, L) bool, True at padding
    target_kind: str
    num_classes: int  # 0 for regression
    vocab_size: int  # 0 for float inputs
    baseline: Baseline
    meta: dict[str, Any] = field(default_factory=dict)  # the probe's options and per-example facts

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


def rng_for(seed: int) -> np.random.Generator:
    """The probes' one random stream: numpy's PCG64, the same numbers on every platform."""
    return np.random.Generator(np.random.PCG64(int(seed)))


def score(target_kind: str, predictions: Tensor, targets: Tensor) -> float:
    """Accuracy over the asked positions (class kinds) or mean squared error (regression)."""
    if target_kind == REGRESSION:
        return float(((predictions.double() - targets.double()) ** 2).mean())
    if target_kind not in TARGET_KINDS:
        raise ValueError(f"unknown target kind {target_kind!r}; use one of {TARGET_KINDS}")
    asked = targets != IGNORE
    return float((predictions[asked] == targets[asked]).double().mean())


def chance_predictions(rng: np.random.Generator, targets: Tensor, classes: np.ndarray) -> Tensor:
    """Uniform guesses among `classes` at the asked positions (IGNORE elsewhere)."""
    guesses = torch.from_numpy(rng.choice(classes, size=tuple(targets.shape))).long()
    return torch.where(targets == IGNORE, torch.full_like(targets, IGNORE), guesses)


def majority_predictions(targets: Tensor) -> Tensor:
    """The most frequent asked class everywhere it is asked (ties: the smallest class)."""
    asked = targets[targets != IGNORE]
    majority = int(torch.bincount(asked).argmax())
    return torch.where(targets == IGNORE, targets, torch.full_like(targets, majority))


def check_positive(**options: int) -> None:
    for name, value in options.items():
        if int(value) < 1:
            raise ValueError(f"{name}={value} must be at least 1; pass a positive {name}")
