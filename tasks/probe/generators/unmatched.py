"""The unmatched key: find the one object of list B that list A lacks (explaining away; DNAS paper).

A sequence is a list A of `num_objects` objects, each followed by a colour, then a list B of the
same objects plus one more, each followed by a colour of its own; the target (read at CLS) is
the colour of the extra B object, the one A lacks:

    CLS a3 c5 a1 c0 SEP b1 c2 b7 c4 b3 c1      target 4 (b7's colour: A has no 7)

Tokens: 0 pad, 1 CLS, 2 SEP, 3 MARK, A objects [4, 4+V), B objects [4+V, 4+2V)
(V = object_vocab; object o is token 4+o in A and 4+V+o in B, so that matching an A object with
its B mirror has to be learned, not read off equal embeddings), colours [4+2V, 4+2V+C)
(C = num_colours; the class is the colour index 0..C-1). Length 4 * num_objects + 4; no padding.
Each occurrence draws its own uniform colour: A's colour of an object is not its colour in B, so
the colours carry no multiset-difference shortcut, only the objects tell which B entry is extra.

This is the DNAS paper's explaining-away argument: the A objects, as queries, each find their
mirror in B; under attention normalized over queries too (DNAS, HNAS, Sinkhorn) a B entry that
an A query claims has less mass left for other queries, so the unclaimed (extra) entry stands
out to the CLS query; softmax over keys alone lets every query read every key regardless of
the others. `aux_target=True` makes the A queries claim their mirrors: at each A object
position the model is trained (never scored) to name the colour of its mirror in B
(`aux_targets`).

Controls:
    a_queries=False  (positive control) the A segment, objects and colours, is `key_only`: read,
                     but it asks nothing, so no query competes with CLS (no aux targets: a
                     position that asks nothing cannot answer);
    disjoint=True    (negative control) B's num_objects + 1 objects share none with A, and one
                     B object token, chosen uniformly, is replaced by MARK: the target is the
                     colour after MARK, found by reading a token, no matching (no aux targets).

No generator in Zoology or the Long Range Arena is followed.

Trivial baseline ("chance"): a uniform colour, accuracy 1 / num_colours (theory).
Shortcut ("plurality colour of the B list"): the most frequent of B's num_objects + 1 colours
(ties: the smallest colour index). The target's colour is one of them, so the rule beats chance:
its expected accuracy is E[the largest colour count] / (num_objects + 1) (given the counts, the
target's entry is a uniform one of B's entries), computed exactly by counting colourings (theory).
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.probe.data import (
    IGNORE,
    SEQUENCE_CLASS,
    Baseline,
    ProbeData,
    chance_predictions,
    check_positive,
    plurality,
    plurality_share,
    rng_for,
    rule,
    score,
)

CLS, SEP, MARK = 1, 2, 3
A0 = 4  # A object o is token A0 + o


def vocabulary(object_vocab: int, num_colours: int) -> dict[str, tuple[int, int]]:
    """Token ranges [low, high): A objects, B objects, colours."""
    b0 = A0 + object_vocab
    c0 = b0 + object_vocab
    return {"a_objects": (A0, b0), "b_objects": (b0, c0), "colours": (c0, c0 + num_colours)}


def generate(
    n: int,
    seed: int,
    *,
    num_objects: int = 4,
    object_vocab: int = 16,
    num_colours: int = 8,
    aux_target: bool = True,
    a_queries: bool = True,
    disjoint: bool = False,
) -> ProbeData:
    """`n` sequences: A of `num_objects` (object, colour) pairs, B of `num_objects + 1`; the
    target is the colour of B's object that A lacks (of MARK's entry when `disjoint`)."""
    check_positive(n=n, num_objects=num_objects, object_vocab=object_vocab,
                   num_colours=num_colours)
    n, k, v, c = int(n), int(num_objects), int(object_vocab), int(num_colours)
    need = 2 * k + 1 if disjoint else k + 1
    if v < need:
        raise ValueError(
            f"object_vocab={object_vocab} cannot hold the {need} distinct objects a row needs "
            f"(disjoint={disjoint}); pass object_vocab >= {need}"
        )
    vocab = vocabulary(v, c)
    rng = rng_for(seed)
    b_start = 2 * k + 2
    seq_len = b_start + 2 * (k + 1)

    objects = np.argsort(rng.random((n, v)), axis=1)[:, :need]  # distinct, in random order
    a_objects = objects[:, :k]
    b_pool = objects[:, k:] if disjoint else objects  # disjoint: the next k + 1 objects
    b_objects = np.take_along_axis(b_pool, np.argsort(rng.random((n, k + 1)), axis=1), axis=1)
    a_colours = rng.integers(0, c, size=(n, k))
    b_colours = rng.integers(0, c, size=(n, k + 1))

    if disjoint:  # the marked entry: uniform among B's
        extra = rng.integers(0, k + 1, size=n)
    else:  # the entry of the object A lacks (objects[:, k], the last drawn)
        extra = np.argmax(b_objects == objects[:, k : k + 1], axis=1)

    inputs = np.empty((n, seq_len), dtype=np.int64)
    inputs[:, 0] = CLS
    inputs[:, 1 : 2 * k + 1 : 2] = A0 + a_objects
    inputs[:, 2 : 2 * k + 1 : 2] = vocab["colours"][0] + a_colours
    inputs[:, 2 * k + 1] = SEP
    inputs[:, b_start::2] = vocab["b_objects"][0] + b_objects
    inputs[:, b_start + 1 :: 2] = vocab["colours"][0] + b_colours
    extra_position = b_start + 2 * extra
    if disjoint:
        inputs[np.arange(n), extra_position] = MARK
    targets = torch.from_numpy(b_colours[np.arange(n), extra]).long()

    aux = None
    if aux_target and a_queries and not disjoint:
        mirror = np.argmax(b_objects[:, None, :] == a_objects[:, :, None], axis=2)  # (n, k)
        aux_np = np.full((n, seq_len), IGNORE, dtype=np.int64)
        aux_np[:, 1 : 2 * k + 1 : 2] = np.take_along_axis(b_colours, mirror, axis=1)
        aux = torch.from_numpy(aux_np)
    key_only = None
    if not a_queries:
        key_only = torch.zeros((n, seq_len), dtype=torch.bool)
        key_only[:, 1 : 2 * k + 1] = True

    read_at = torch.full((n, seq_len), -1, dtype=torch.long)
    read_at[:, 0] = torch.from_numpy(extra_position)  # CLS reads the extra (or marked) entry
    guesses = chance_predictions(rng, targets, np.arange(c))
    shortcut = rule("plurality colour of the B list", SEQUENCE_CLASS,
                    torch.from_numpy(plurality(b_colours, c)).long(), targets,
                    plurality_share(k + 1, c))
    return ProbeData(
        inputs=torch.from_numpy(inputs),
        targets=targets,
        padding_mask=torch.zeros((n, seq_len), dtype=torch.bool),
        target_kind=SEQUENCE_CLASS,
        num_classes=c,
        vocab_size=vocab["colours"][1],
        baseline=Baseline("chance", guesses, score(SEQUENCE_CLASS, guesses, targets), 1 / c),
        meta={
            "extra_position": torch.from_numpy(extra_position).long(),
            "b_start": b_start,
            **vocab,
        },
        shortcut=shortcut,
        aux_targets=aux,
        key_only=key_only,
        read_at=read_at,
    )
