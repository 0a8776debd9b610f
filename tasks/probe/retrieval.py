"""Multi-position retrieval: the answer is read at `num_slots` distinct positions at once.

A sequence is a CLS token, then random filler in which each of `num_slots` marker tokens
M_1..M_H appears once, each followed by a value token; the target (read at CLS) is the ordered
tuple of the values after M_1, ..., M_H, one class among num_values ** num_slots:

    CLS f f M2 v5 f f f M1 v3 f v6 f ...      target (3, 5) -> class 3 + 5 * num_values

(v6, a value token after no marker, is a distractor: `num_value_distractors` of them.)
The values of all slots share one vocabulary, so an attention pattern spread over several
slots' values reads an unordered mix and cannot tell which value belongs to which marker: each
slot needs an attention pattern of its own, one head per slot when num_slots = the number of
heads. Two heads attending to the same slot (redundant heads) leave another slot unread, and
the tuple is then right with probability 1 / num_values at best, however well the rest is
read: this is the CODA and repulsive-attention argument for diverse heads. Per-slot values are
in `meta["slot_values"]`, so a report can show slots-right beside tuple accuracy (a model with
redundant heads gets most slots right and few tuples).
Caveat: a value is bound to its marker by position (it follows it), so a deeper model can copy
the marker into the value's position in an earlier layer and then read several slots with one
head; the argument is strict for one attention layer. Distractor values force that binding:
without them a head may attend to every value token regardless of its marker.

No generator in Zoology or the Long Range Arena is followed (it is a multi-key variant of
associative recall with the keys fixed per slot and one answer for all of them).

Trivial baseline ("chance"): a uniform guess among the tuples, accuracy 1 / num_values ** num_slots.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.probe.data import (
    SEQUENCE_CLASS,
    Baseline,
    ProbeData,
    chance_predictions,
    check_positive,
    rng_for,
    score,
)

CLS = 1


def vocabulary(num_slots: int, num_values: int) -> dict[str, tuple[int, int]]:
    """Token ranges [low, high): 0 pad, 1 CLS, then markers, values, filler."""
    markers = (CLS + 1, CLS + 1 + num_slots)
    values = (markers[1], markers[1] + num_values)
    return {"markers": markers, "values": values, "filler_low": values[1]}


def generate(
    n: int,
    seed: int,
    *,
    seq_len: int = 32,
    num_slots: int = 2,
    num_values: int = 8,
    num_filler: int = 16,
    num_value_distractors: int = 0,
) -> ProbeData:
    """`n` sequences of `seq_len` tokens (CLS included) with `num_slots` marker-value pairs and
    `num_value_distractors` stray value tokens in filler drawn from `num_filler` tokens."""
    check_positive(n=n, seq_len=seq_len, num_slots=num_slots, num_values=num_values,
                   num_filler=num_filler)
    n, seq_len, slots, m = int(n), int(seq_len), int(num_slots), int(num_values)
    stray = int(num_value_distractors)
    room = seq_len - 1  # positions after CLS
    if stray < 0 or 2 * slots + stray > room:
        raise ValueError(
            f"seq_len={seq_len} has {room} positions after CLS, too few for {slots} marker-value "
            f"pairs and {stray} distractors; pass seq_len >= {2 * slots + stray + 1}"
        )
    vocab = vocabulary(slots, m)
    vocab_size = vocab["filler_low"] + int(num_filler)
    rng = rng_for(seed)

    inputs = rng.integers(vocab["filler_low"], vocab_size, size=(n, seq_len))
    inputs[:, 0] = CLS
    slot_values = rng.integers(0, m, size=(n, slots))
    # `slots` non-overlapping (marker, value) blocks in `room` cells: sorted starts among
    # room - slots cells (a uniform draw without replacement: the first columns of a random
    # permutation), block i shifted by i; markers assigned to blocks at random. Whole arrays at
    # once: a loop over rows took seconds per run.
    rows = np.arange(n)[:, None]
    cells = np.argsort(rng.random((n, room - slots)), axis=1)[:, :slots]
    starts = np.sort(cells, axis=1) + np.arange(slots)
    starts = 1 + np.take_along_axis(starts, np.argsort(rng.random((n, slots)), axis=1), axis=1)
    inputs[rows, starts] = vocab["markers"][0] + np.arange(slots)  # starts[:, h]: marker h
    inputs[rows, starts + 1] = vocab["values"][0] + slot_values
    if stray:  # distractor cells: uniform among the cells no block takes
        draw = rng.random((n, seq_len))
        draw[:, 0] = np.inf  # CLS
        draw[rows, starts] = draw[rows, starts + 1] = np.inf
        where = np.argsort(draw, axis=1)[:, :stray]
        inputs[rows, where] = vocab["values"][0] + rng.integers(0, m, size=(n, stray))

    targets = torch.from_numpy(slot_values @ (m ** np.arange(slots))).long()
    guesses = chance_predictions(rng, targets, np.arange(m**slots))
    return ProbeData(
        inputs=torch.from_numpy(inputs).long(),
        targets=targets,
        padding_mask=torch.zeros((n, seq_len), dtype=torch.bool),
        target_kind=SEQUENCE_CLASS,
        num_classes=m**slots,
        vocab_size=vocab_size,
        baseline=Baseline("chance", guesses, score(SEQUENCE_CLASS, guesses, targets), 1 / m**slots),
        meta={"slot_values": torch.from_numpy(slot_values), **vocab},
    )
