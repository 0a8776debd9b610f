"""`ProbeData`: what every probe generator returns, and how a probe's predictions are scored.

Conventions shared by the token probes (recall, retrieval, listops, unmatched, hub, assignment):
    token 0 is padding; `padding_mask` is True at padding (the attention modules' convention);
    a sequence-level target is read at position 0, where the probes put a CLS token;
    a per-position target is `IGNORE` (-100, cross-entropy's default ignore_index) where no
    answer is asked.
The cluster probe's inputs are float points (n, L, d) instead of token ids.

Each probe carries its trivial baseline (chance / majority), its predictions and score on the
data, and the score theory expects (None where no closed form exists), so a report can show
the baseline beside the schemes and a test can check the generator against the theory.

Optional fields (None where a probe has no use for them; every consumer must accept None):
    shortcut           a `Baseline` for the best simple rule that ignores the probe's mechanism
                       (its `name` describes the rule): predictions shaped like the targets,
                       IGNORE exactly where the targets are, its score on all rows and the
                       score theory expects (None where no closed form). A scheme that only
                       matches the shortcut has not shown the mechanism.
    shortcut_features  (n, f) float32 features for a *fitted* shortcut, for probes whose
                       shortcut is a classifier rather than a rule (clusters' count): the
                       datamodule fits a linear classifier on the training rows.
    aux_targets        (n, L) long, IGNORE where none: extra per-position targets that are
                       trained (their cross-entropy is added to the loss) but never scored;
                       class ids in 0..num_classes-1. IGNORE wherever `targets` asks (for a
                       sequence-level probe: at position 0) and at padding.
    key_only           (n, L) bool: positions that queries read but that ask nothing (keys, not
                       queries): the attention never uses them as queries.
    query_only         (n, L) bool: positions that ask (queries) but that no query reads (not
                       keys). Never True together with `key_only`; both False at padding.
                       Together they express cross-attention inside one sequence.
    slots              (n, L) long: the slot (0, 1, ...) each position belongs to, -1 elsewhere,
                       so that a report can tell which slot each head reads (head collisions).
    read_at            (n, L) long: at each asked position (position 0 for a sequence-level
                       target), the position of the entry the mechanism must read the answer from
                       (a key, and its value right after it), -1 elsewhere: the first layer's
                       attention weight on that entry (`test/target_mass`, tasks/probe/module.py)
                       shows whether the mechanism engaged (unmatched key: CLS -> the extra
                       object; hub key: a query -> its key; assignment: a query -> its match).
"""

from __future__ import annotations

import math
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
    """A trivial predictor or a shortcut rule: its name ("chance", "majority", or a short
    description of the rule), its predictions (shaped like the targets, IGNORE where nothing is
    asked), their score (accuracy, or mean squared error for regression) and the score theory
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
    # optional fields (see the module docstring)
    shortcut: Baseline | None = None  # the best simple rule that ignores the mechanism
    shortcut_features: Tensor | None = None  # (n, f) float32, for a fitted (linear) shortcut
    aux_targets: Tensor | None = None  # (n, L) long, trained but never scored; IGNORE where none
    key_only: Tensor | None = None  # (n, L) bool: read by queries, asks nothing
    query_only: Tensor | None = None  # (n, L) bool: asks, read by no query
    slots: Tensor | None = None  # (n, L) long: slot index of each position, -1 elsewhere
    read_at: Tensor | None = None  # (n, L) long: the key position each answer is read from, or -1

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


def plurality(values: np.ndarray, num_classes: int) -> np.ndarray:
    """The most frequent of each row's `values` (n, m) in 0..num_classes-1 (ties: the smallest)."""
    n = values.shape[0]
    offsets = np.arange(n)[:, None] * num_classes
    counts = np.bincount((values + offsets).ravel(), minlength=n * num_classes)
    return counts.reshape(n, num_classes).argmax(axis=1)  # argmax: the first of the maxima


def rule(name: str, target_kind: str, predictions: Tensor, targets: Tensor,
         theory: float | None = None) -> Baseline:
    """A shortcut rule's `Baseline`: its predictions kept where asked, IGNORE elsewhere."""
    if target_kind == TOKEN_CLASS:
        predictions = torch.where(targets == IGNORE, torch.full_like(targets, IGNORE),
                                  predictions.to(targets.dtype))
    return Baseline(name, predictions, score(target_kind, predictions, targets), theory)


def plurality_share(entries: int, num_classes: int) -> float | None:
    """P(a given entry's class is the plurality class) among `entries` i.i.d. uniform classes:
    E[the largest class count] / entries, by exact counting (the tie rule does not enter: given
    the counts, the entry is a uniform one of the `entries`). The expected accuracy of
    predicting `plurality` for an entry chosen independently of the classes. None beyond 170
    entries (the factorials leave float64's range)."""
    m, c = int(entries), int(num_classes)
    if m > 170:
        return None
    scale = np.array([1 / (c**j * math.factorial(j)) for j in range(m + 1)])  # (x / c)^j / j!

    def share_at_most(k: int) -> float:  # P(every class count <= k): m! [x^m] (EGF)^c
        factor, power = np.where(np.arange(m + 1) <= k, scale, 0.0), np.zeros(m + 1)
        power[0] = 1.0
        for _ in range(c):
            power = np.convolve(power, factor)[: m + 1]
        return float(power[m] * math.factorial(m))

    expected_max = sum(1 - share_at_most(k) for k in range(m))
    return expected_max / m
