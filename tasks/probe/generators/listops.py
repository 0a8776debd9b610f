"""ListOps at reduced length: nested MIN / MAX / MED / SM (sum mod 10) over digits; the answer is
the value of the whole expression, one of 10 classes, read at a CLS token:

    CLS [MAX 2 9 [MIN 4 7 ] 0 ]      target 9

Re-implements the rules of the Long Range Arena generator (google-research/long-range-arena,
lra_benchmarks/data/listops.py), not its code: a node below `max_depth` is a digit 0..9 with
probability 0.75 (VALUE_P = 0.25 is its chance of being an operator), an operator has
2..max_args arguments, each drawn the same way one level deeper; at `max_depth` every node is a
digit; the operators are MIN, MAX, MED (the median, truncated: int(np.median) in LRA) and SM
(the sum mod 10; LRA's FIRST and LAST are unused there too); trees are drawn until one's length
is in range, and a data set holds no tree twice. The token stream is LRA's after its input
pipeline: operators, digits and the closing bracket, no parentheses (the length counts these
tokens, as LRA's does).
Differs from it: lengths `min_length`..`seq_len - 1` inclusive (LRA: 500 < length < 2000,
strict), a CLS token at position 0 (LRA's classifiers pool), token ids fixed here (LRA builds a
vocabulary from the data), and a tree is abandoned as soon as it passes the maximum length
(the same accepted trees, fewer wasted draws). ListOps is a standard hierarchical task, here so
that the probe results sit beside one the field knows.

Trivial baseline ("majority"): the most frequent answer in the data; no closed form (theory None).
Shortcut ("top operator on every digit"): the expression's top-level operator (its first
token) applied to all of its digits at once, ignoring the nesting (MED as `apply`; a bare digit
is its own value): what a model that reads the operators and digits but not the brackets'
structure can answer, right whenever the nesting does not change the value (0.45 at seq_len=32,
min_length=8, max_depth=3, max_args=5, and 0.42 at the defaults, against majority's 0.11 and
0.15, at n=4096, seed 0); theory None.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from tasks.probe.data import (
    PAD,
    SEQUENCE_CLASS,
    Baseline,
    ProbeData,
    check_positive,
    majority_predictions,
    rule,
    score,
)

CLS = 1
DIGIT0 = 2  # digit d is token DIGIT0 + d
OPERATORS = ("MIN", "MAX", "MED", "SM")
OPERATOR0 = DIGIT0 + 10  # operator i is token OPERATOR0 + i
END = OPERATOR0 + len(OPERATORS)
VOCAB_SIZE = END + 1
VALUE_P = 0.25  # LRA's name: the chance that a node above max_depth is an operator


class _TooLong(Exception):
    pass


def apply(op: str, args: list[int]) -> int:
    if op == "MIN":
        return min(args)
    if op == "MAX":
        return max(args)
    if op == "SM":
        return sum(args) % 10
    ordered = sorted(args)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) // 2


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int, out: list,
          budget: int) -> int:
    """Appends the tokens of one random node to `out` and returns its value."""
    if len(out) >= budget:
        raise _TooLong
    draw = rng.random  # floats scaled to integers: a third of randrange's cost, same law
    if depth >= max_depth or draw() > VALUE_P:
        digit = int(draw() * 10)
        out.append(DIGIT0 + digit)
        return digit
    op = int(draw() * len(OPERATORS))
    out.append(OPERATOR0 + op)
    args = [_tree(rng, depth + 1, max_depth, max_args, out, budget)
            for _ in range(2 + int(draw() * (max_args - 1)))]
    out.append(END)
    return apply(OPERATORS[op], args)


def generate(
    n: int,
    seed: int,
    *,
    seq_len: int = 64,
    min_length: int = 16,
    max_depth: int = 10,
    max_args: int = 10,
    max_draws: int = 10_000_000,
) -> ProbeData:
    """`n` distinct expressions of `min_length`..`seq_len - 1` tokens, after a CLS token."""
    check_positive(n=n, seq_len=seq_len, min_length=min_length, max_depth=max_depth)
    n, seq_len = int(n), int(seq_len)
    if not 1 <= min_length <= seq_len - 1 or max_args < 2:
        raise ValueError(
            f"need 1 <= min_length={min_length} <= seq_len - 1={seq_len - 1} and "
            f"max_args={max_args} >= 2; pass values in those ranges"
        )
    # Python's Mersenne Twister, not numpy's generator: a tree takes many scalar draws, ~20x
    # cheaper here, and its integers are the same on every platform (getrandbits-based)
    rng = random.Random(int(seed))
    seen: set[tuple[int, ...]] = set()
    inputs = np.full((n, seq_len), PAD, dtype=np.int64)
    inputs[:, 0] = CLS
    targets = np.empty(n, dtype=np.int64)
    draws = 0
    while len(seen) < n:
        draws += 1
        if draws > max_draws:
            raise ValueError(
                f"only {len(seen)} distinct expressions of length {min_length}..{seq_len - 1} in "
                f"{max_draws} draws; pass a smaller n or min_length, or a larger seq_len"
            )
        tokens: list[int] = []
        try:
            value = _tree(rng, 1, int(max_depth), int(max_args), tokens, seq_len - 1)
        except _TooLong:
            continue
        key = tuple(tokens)
        if len(tokens) < min_length or len(tokens) > seq_len - 1 or key in seen:
            continue
        row = len(seen)
        seen.add(key)
        inputs[row, 1 : 1 + len(tokens)] = tokens
        targets[row] = value

    inputs_t, targets_t = torch.from_numpy(inputs), torch.from_numpy(targets)
    guesses = majority_predictions(targets_t)
    flat = np.empty(n, dtype=np.int64)
    for row, tokens in enumerate(inputs[:, 1:].tolist()):
        digits = [t - DIGIT0 for t in tokens if DIGIT0 <= t < OPERATOR0]
        top = tokens[0] - OPERATOR0
        flat[row] = apply(OPERATORS[top], digits) if top >= 0 else digits[0]
    return ProbeData(
        inputs=inputs_t,
        targets=targets_t,
        padding_mask=inputs_t == PAD,
        target_kind=SEQUENCE_CLASS,
        num_classes=10,
        vocab_size=VOCAB_SIZE,
        baseline=Baseline("majority", guesses, score(SEQUENCE_CLASS, guesses, targets_t), None),
        meta={"lengths": (inputs_t != PAD).sum(dim=1) - 1},
        shortcut=rule("top operator on every digit", SEQUENCE_CLASS, torch.from_numpy(flat),
                      targets_t),
    )
