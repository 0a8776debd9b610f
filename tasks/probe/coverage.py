"""Coverage: count every token type, so that every input position decides part of the answer.

A sequence is `num_types` count slots, then `length` tokens drawn uniformly from `num_types`
types; the target at slot t is how many tokens of type t the sequence holds (0..length):

    c1 c2 c3 | 2 1 3 3 1 3 [pad ...]      targets: c1 -> 2, c2 -> 1, c3 -> 3

The counts are the sequence's multiset, so every content position enters exactly one target:
a position that no query attends to (a key "explained away" by softmax-over-keys attention,
UNAS) drops out of its type's count, and that slot is off by one, a wrong class. Normalizing
over queries too (DNAS, HNAS, Sinkhorn) gives every key attention mass by construction: this is
the DNAS paper's argument in its purest form. UNAS is not barred from the task (a slot that
spreads its weight evenly over all positions reads its type's share exactly); the probe measures
whether a trained UNAS model does leave positions out, and what that costs. Averaging attention reads a fraction, count /
length; with the default fixed length the fraction decides the count, while `min_length` below
`length` adds padding and makes the model find the length too (a harder variant).

No generator in Zoology or the Long Range Arena is followed; the slots come first so that their
positions are fixed whatever the length.

Trivial baseline ("majority"): the most frequent count at every slot. A count is
Binomial(length, 1/num_types), so with a fixed length the baseline's accuracy is the binomial's
largest probability (theory; None with variable lengths).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tasks.probe.data import (
    IGNORE,
    PAD,
    TOKEN_CLASS,
    Baseline,
    ProbeData,
    check_positive,
    majority_predictions,
    rng_for,
    score,
)


def generate(
    n: int,
    seed: int,
    *,
    length: int = 32,
    num_types: int = 8,
    min_length: int | None = None,
) -> ProbeData:
    """`n` sequences of `num_types` count slots and `length` tokens (between `min_length` and
    `length` when `min_length` is given). Tokens: 0 pad, 1..num_types the types, then the slots."""
    check_positive(n=n, length=length, num_types=num_types)
    lo = int(length) if min_length is None else int(min_length)
    if not 1 <= lo <= length:
        raise ValueError(f"min_length={min_length} must be within 1..length={length}")
    n, length, num_types = int(n), int(length), int(num_types)
    rng = rng_for(seed)
    seq_len = num_types + length

    lengths = rng.integers(lo, length + 1, size=n)
    content = rng.integers(1, num_types + 1, size=(n, length))
    padded = np.arange(length)[None, :] >= lengths[:, None]
    content[padded] = PAD
    slots = np.broadcast_to(num_types + np.arange(1, num_types + 1), (n, num_types))
    inputs = np.concatenate([slots, content], axis=1)

    # counts of types 1..num_types (padding, 0, counted in column 0 and dropped)
    offsets = np.arange(n)[:, None] * (num_types + 1)
    counts = np.bincount((content + offsets).ravel(), minlength=n * (num_types + 1))
    counts = counts.reshape(n, num_types + 1)[:, 1:]
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    targets[:, :num_types] = counts

    targets_t = torch.from_numpy(targets)
    guesses = majority_predictions(targets_t)
    theory = None
    if lo == length:
        p = 1.0 / num_types
        theory = max(math.comb(length, k) * p**k * (1 - p) ** (length - k) for k in range(length + 1))
    padding = np.concatenate([np.zeros((n, num_types), dtype=bool), padded], axis=1)
    return ProbeData(
        inputs=torch.from_numpy(inputs).long(),
        targets=targets_t,
        padding_mask=torch.from_numpy(padding),
        target_kind=TOKEN_CLASS,
        num_classes=length + 1,
        vocab_size=2 * num_types + 1,
        baseline=Baseline("majority", guesses, score(TOKEN_CLASS, guesses, targets_t), theory),
        meta={"num_types": num_types, "lengths": torch.from_numpy(lengths)},
    )
