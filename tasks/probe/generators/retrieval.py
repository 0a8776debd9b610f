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

`slots` (n, L) marks each slot's marker and value positions with the slot's index h = 0..H-1
(marker M_{h+1}), -1 elsewhere, so that a report can tell which slot each head reads.

The rich-get-richer variant (`focus_fraction`): in a random `focus_fraction` of the first
`focus_rows` rows (None: all rows), only the first slot (M_1) varies: every other slot holds
value 0 (its value token, the tuple target and `meta["slot_values"]` follow; the focus rows are
`meta["focus"]`). Those rows reward reading slot 1 alone, pulling every head toward it, and a
scheme whose heads stay there (redundant heads) misses the other slots on the rows where they
vary; the datamodule passes the number of training rows as `focus_rows`, so only training
sequences are skewed and the evaluation splits measure every slot. focus_fraction=0 leaves the
data as without the option.

No generator in Zoology or the Long Range Arena is followed (it is a multi-key variant of
associative recall with the keys fixed per slot and one answer for all of them).

Trivial baseline ("chance"): a uniform guess among the tuples, accuracy 1 / num_values ** num_slots.
Shortcut ("values in order of appearance"): the tuple read from the first num_slots value tokens
by position (distractors included), ignoring the markers: right when the markers appear in the
order M_1..M_H and no distractor comes before the last slot's value, or when the values
coincide; theory None.
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
    rule,
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
    focus_fraction: float = 0.0,
    focus_rows: int | None = None,
) -> ProbeData:
    """`n` sequences of `seq_len` tokens (CLS included) with `num_slots` marker-value pairs and
    `num_value_distractors` stray value tokens in filler drawn from `num_filler` tokens; in
    `focus_fraction` of the first `focus_rows` rows (None: all) only the first slot varies."""
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
    focus_rows = n if focus_rows is None else int(focus_rows)
    if not 0.0 <= float(focus_fraction) <= 1.0 or not 0 <= focus_rows <= n:
        raise ValueError(
            f"focus_fraction={focus_fraction} must be within 0..1 and focus_rows={focus_rows} "
            f"within 0..n={n}; pass a fraction and at most n rows (None: all rows)"
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

    guesses = chance_predictions(rng, torch.zeros(n, dtype=torch.long), np.arange(m**slots))
    focus = np.zeros(n, dtype=bool)
    chosen = round(float(focus_fraction) * focus_rows)
    if chosen:  # drawn last, so that focus_fraction=0 leaves every other draw as it was
        focus[np.argsort(rng.random(focus_rows))[:chosen]] = True
        slot_values[focus, 1:] = 0
        inputs[rows, starts + 1] = vocab["values"][0] + slot_values
    targets = torch.from_numpy(slot_values @ (m ** np.arange(slots))).long()

    slot_of = np.full((n, seq_len), -1, dtype=np.int64)
    slot_of[rows, starts] = slot_of[rows, starts + 1] = np.arange(slots)
    # the shortcut: the first `slots` value tokens by position (there are at least `slots`)
    is_value = (inputs >= vocab["values"][0]) & (inputs < vocab["values"][1])
    first = np.argsort(~is_value, axis=1, kind="stable")[:, :slots]
    in_order = np.take_along_axis(inputs, first, axis=1) - vocab["values"][0]
    in_order = in_order @ (m ** np.arange(slots))
    return ProbeData(
        inputs=torch.from_numpy(inputs).long(),
        targets=targets,
        padding_mask=torch.zeros((n, seq_len), dtype=torch.bool),
        target_kind=SEQUENCE_CLASS,
        num_classes=m**slots,
        vocab_size=vocab_size,
        baseline=Baseline("chance", guesses, score(SEQUENCE_CLASS, guesses, targets), 1 / m**slots),
        meta={"slot_values": torch.from_numpy(slot_values), "focus": torch.from_numpy(focus),
              **vocab},
        shortcut=rule("values in order of appearance", SEQUENCE_CLASS,
                      torch.from_numpy(in_order).long(), targets),
        slots=torch.from_numpy(slot_of),
    )
