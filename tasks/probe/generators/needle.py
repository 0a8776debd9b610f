"""Long-context retrieval (needles in a haystack), modelled on RULER's synthetic tasks.

A sequence of `length` tokens is a query block, then a haystack of random filler tokens in which
the entries hide: two-token pairs (a key or variable, then what it is bound to), each with at
least one filler token on both sides (but the depth-placed needle, which sits wherever its depth
says: at depth 0.0 right after the query block). At each ASK token of the query block the target is a value
(class = the value's index, 0..num_values-1):

    single      ASK k3 | f f f k3 v5 f f v2 f ...               ASK -> v5
                one needle (the asked key's pair) and `num_strays` stray value tokens
    multikey    ASK k3 | f k1 v0 f k3 v5 f f k7 v2 f ...         ASK -> v5
                `num_needles` needles with distinct keys, one of them asked (the others are
                distractor needles: RULER's multi-key NIAH)
    multivalue  ASK1 k3 ASK2 k3 | f k3 v5 f k1 v0 f k3 v2 ...    ASK1 -> v2, ASK2 -> v5
                the asked key bound to `num_answers` distinct values, all of which are asked:
                slot j answers the j-th smallest of them (the set, in an order that does not
                depend on where the needles sit), plus `num_needles - 1` distractor keys
    vartrack    ASK x4 | f x1 v5 f x2 x1 f x4 x2 f x6 v1 f ...    ASK -> v5
                `num_chains` chains x_0 = v, x_1 = x_0, ..., x_hops = x_(hops-1) with distinct
                variables and values; the asked variable is the last of the first chain and the
                answer its value (following `hops` links back to the value)

`depth` places the entry the first asked slot must read (`read_at`: the asked needle; multivalue:
the needle with the smallest value; vartrack: the asked variable's own statement, the first hop)
at haystack offset round(depth * (H - 2)), H = length - the query block: 0.0 right after the query
block, 1.0 in the last two tokens. depth=null (or "random") draws the offset uniformly per row.
Every other entry and stray sits at a uniform free place, never at offset 0. At depth 0.0 the asked
key and the needle's key are neighbours (`... ASK k3 | k3 v5 ...`), so the token shift mixes the
query into the needle: in the measured runs the hardest depth (docs/tasks.md).

Modelled on RULER (Hsieh et al. 2024; NVIDIA/RULER scripts/data/synthetic/niah.py and
variable_tracking.py). Differs from it:
  - tokens, not text: keys, values, variables and filler are disjoint token ranges, an entry is
    two tokens (RULER: a sentence "One of the special magic numbers for {key} is: {value}." in an
    essay or noise haystack); the query block comes first, since a bidirectional encoder reads the
    whole sequence anyway;
  - depth is exact and set per test cell (RULER draws each needle's depth from 40 levels);
  - multivalue's values are asked one slot each, in sorted order, and each slot is scored
    (RULER's string_match_all also gives partial credit per value); a row with all right is
    `seq_acc`;
  - variable tracking asks the value of the last variable of the chain (RULER asks for every
    variable that holds the value); its statements sit in any order (RULER keeps a chain in order),
    which a bidirectional encoder does not see anyway.

Trivial baseline ("chance"): a uniform guess among the values, 1 / num_values.
Shortcuts, each ignoring which key is asked (the mechanism):
    single      "first value token": the first value in the haystack (a stray or the needle's);
    multikey    "first needle": the value bound in the first entry of the haystack;
    multivalue  "smallest values of any needles": slot j answers the j-th smallest value bound in
                any entry (right when the distractors' values are larger);
    vartrack    "first bound value": the value of the first statement that binds a value (the
                asked chain's with probability about 1 / num_chains).
Theory for none (they depend on where the entries fall).
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.probe.data import (
    IGNORE,
    TOKEN_CLASS,
    Baseline,
    ProbeData,
    chance_predictions,
    check_positive,
    rng_for,
    rule,
    score,
)

VARIANTS = ("single", "multikey", "multivalue", "vartrack")
FIRST_ASK = 1  # ASK_1..ASK_m are tokens 1..m (0 is padding)


def vocabulary(num_answers: int, num_keys: int, num_values: int, num_filler: int) -> dict:
    """Token ranges [low, high): ASK tokens, keys (variables), values, filler."""
    asks = (FIRST_ASK, FIRST_ASK + num_answers)
    keys = (asks[1], asks[1] + num_keys)
    values = (keys[1], keys[1] + num_values)
    filler = (values[1], values[1] + num_filler)
    return {"asks": asks, "keys": keys, "values": values, "filler": filler}


def parse_depth(depth) -> float | None:
    """depth: a fraction in 0..1, or None / "random" (uniform per row)."""
    if depth is None or (isinstance(depth, str) and depth.lower() in ("random", "null", "none")):
        return None
    value = float(depth)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"depth={depth} must be a fraction within 0..1 or random")
    return value


def needle_offset(depth: float, haystack: int) -> int:
    """The haystack offset of the needle placed at `depth`: 0.0 first, 1.0 in the last two cells."""
    return round(depth * (haystack - 2))


def _place(rng: np.random.Generator, taken: np.ndarray, width: int) -> int:
    """A uniform start among those whose `width` cells and one cell on each side are free (a gap
    of filler keeps every entry readable as a pair); marks the cells taken."""
    size = len(taken)
    free = ~taken
    ok = np.ones(size - width + 1, dtype=bool)
    for i in range(width):
        ok &= free[i : size - width + 1 + i]
    ok[1:] &= free[: size - width]  # the cell before
    ok[:-1] &= free[width:]  # the cell after
    ok[0] = False  # nothing but a needle placed there right after the asked key
    starts = np.flatnonzero(ok)
    if starts.size == 0:
        raise ValueError("no room left in the haystack; pass a larger length")
    start = int(starts[rng.integers(0, starts.size)])
    taken[start : start + width] = True
    return start


def generate(
    n: int,
    seed: int,
    *,
    variant: str = "single",
    length: int = 128,
    depth: float | str | None = None,
    num_keys: int = 16,
    num_values: int = 16,
    num_filler: int = 16,
    num_needles: int | None = None,
    num_answers: int = 2,
    num_chains: int = 2,
    hops: int = 2,
    num_strays: int = 2,
) -> ProbeData:
    """`n` sequences of `length` tokens of the `variant` (module docstring); num_needles None:
    the variant's (single 1, multikey 4, multivalue 2: the asked key and one distractor key)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not a needle variant; use one of "
                         f"{', '.join(VARIANTS)}")
    check_positive(n=n, length=length, num_keys=num_keys, num_values=num_values,
                   num_filler=num_filler, num_answers=num_answers, num_chains=num_chains,
                   hops=hops)
    if int(num_strays) < 0:
        raise ValueError(f"num_strays={num_strays} must be at least 0")
    depth = parse_depth(depth)
    n, length, strays = int(n), int(length), int(num_strays)
    needles = {"single": 1, "multikey": 4, "multivalue": 2}.get(variant, 0)
    needles = needles if num_needles is None else int(num_needles)
    if variant == "single" and needles != 1:
        raise ValueError(f"num_needles={num_needles}: the single variant has one needle; use "
                         f"variant=multikey for distractor needles")
    answers = int(num_answers) if variant == "multivalue" else 1
    # each entry: (first token, second token) drawn per row below; keys / values needed per row
    if variant == "vartrack":
        entries, keys_needed = int(num_chains) * (int(hops) + 1), int(num_chains) * (int(hops) + 1)
        values_needed = int(num_chains)
    else:
        check_positive(num_needles=needles)
        entries, keys_needed = needles - 1 + answers, needles
        values_needed = entries
    if keys_needed > int(num_keys) or values_needed > int(num_values):
        raise ValueError(f"variant={variant} draws {keys_needed} distinct keys and "
                         f"{values_needed} distinct values per row; pass num_keys >= "
                         f"{keys_needed} and num_values >= {values_needed}")
    query = 2 * answers
    haystack = length - query
    # every entry takes 2 cells and strays 1, each with a gap; 3x room keeps the draws from
    # running out of gaps whatever order they land in
    if haystack < 3 * (3 * entries + 2 * strays) + 2:
        raise ValueError(f"length={length} is too short for {entries} entries and {strays} "
                         f"strays; pass length >= {query + 3 * (3 * entries + 2 * strays) + 2}")

    vocab = vocabulary(answers, int(num_keys), int(num_values), int(num_filler))
    k0, v0 = vocab["keys"][0], vocab["values"][0]
    vocab_size = vocab["filler"][1]
    rng = rng_for(seed)
    inputs = rng.integers(vocab["filler"][0], vocab["filler"][1], size=(n, length))
    targets = np.full((n, length), IGNORE, dtype=np.int64)
    read_at = np.full((n, length), -1, dtype=np.int64)
    shortcut = np.full((n, length), IGNORE, dtype=np.int64)
    asks = np.arange(answers) * 2  # the ASK positions; the asked key right after each
    for row in range(n):
        keys = k0 + rng.permutation(int(num_keys))[:keys_needed]
        values = rng.permutation(int(num_values))[:values_needed]
        if variant == "vartrack":  # chain c: x_(c,0) = v_c, x_(c,j) = x_(c,j-1)
            chains = keys.reshape(int(num_chains), int(hops) + 1)
            pairs = [(chains[c, 0], v0 + values[c]) for c in range(int(num_chains))]
            pairs += [(chains[c, j], chains[c, j - 1]) for c in range(int(num_chains))
                      for j in range(1, int(hops) + 1)]
            asked_key = chains[0, -1]
            read_first = int(num_chains) + int(hops) - 1  # the statement x_(0,hops) = ...
            answer = [values[0]]
            needle_of = [read_first]
        else:  # the asked key's `answers` needles first, then one per distractor key
            bound = values[:answers]
            pairs = [(keys[0], v0 + v) for v in bound]
            pairs += [(keys[1 + i], v0 + values[answers + i]) for i in range(needles - 1)]
            asked_key = keys[0]
            order = np.argsort(bound)  # slot j reads the needle of the j-th smallest value
            answer = list(bound[order])
            needle_of = [int(i) for i in order]
            read_first = needle_of[0]
        taken = np.zeros(haystack, dtype=bool)
        starts = np.zeros(len(pairs), dtype=np.int64)
        offset = needle_offset(depth, haystack) if depth is not None else int(
            rng.integers(0, haystack - 1))
        starts[read_first] = offset
        taken[offset : offset + 2] = True
        for i in range(len(pairs)):
            if i != read_first:
                starts[i] = _place(rng, taken, 2)
        stray_at = [_place(rng, taken, 1) for _ in range(strays)]
        line = inputs[row]
        for (first, second), start in zip(pairs, starts):
            line[query + start], line[query + start + 1] = first, second
        for at in stray_at:
            line[query + at] = v0 + rng.integers(0, int(num_values))
        line[asks] = FIRST_ASK + np.arange(answers)
        line[asks + 1] = asked_key
        targets[row, asks] = answer
        read_at[row, asks] = query + starts[needle_of]
        shortcut[row, asks] = shortcut_answers(variant, line[query:], vocab, answers)

    inputs_t, targets_t = torch.from_numpy(inputs).long(), torch.from_numpy(targets)
    guesses = chance_predictions(rng, targets_t, np.arange(int(num_values)))
    name = {"single": "first value token", "multikey": "first needle",
            "multivalue": "smallest values of any needles", "vartrack": "first bound value"}
    return ProbeData(
        inputs=inputs_t,
        targets=targets_t,
        padding_mask=torch.zeros_like(inputs_t, dtype=torch.bool),
        target_kind=TOKEN_CLASS,
        num_classes=int(num_values),
        vocab_size=int(vocab_size),
        baseline=Baseline("chance", guesses, score(TOKEN_CLASS, guesses, targets_t),
                          1 / int(num_values)),
        shortcut=rule(name[variant], TOKEN_CLASS, torch.from_numpy(shortcut), targets_t),
        read_at=torch.from_numpy(read_at),
        meta={"variant": variant, "query_length": query, "depth": depth, **vocab},
    )


def shortcut_answers(variant: str, haystack: np.ndarray, vocab: dict, answers: int) -> list[int]:
    """The variant's shortcut (module docstring) on one row's haystack tokens: the value indices
    it answers for the `answers` slots. Entries are read as pairs: a key token and the token after
    it (the gaps make that unambiguous)."""
    (k0, k1), (v0, v1) = vocab["keys"], vocab["values"]
    is_key = (haystack >= k0) & (haystack < k1)
    is_value = (haystack >= v0) & (haystack < v1)
    if variant == "single":
        return [int(haystack[np.argmax(is_value)]) - v0]
    bound_after_key = np.flatnonzero(is_key[:-1] & is_value[1:]) + 1  # values bound in an entry
    bound = haystack[bound_after_key] - v0
    if variant == "multivalue":
        return [int(v) for v in np.sort(bound)[:answers]]
    return [int(bound[0])]  # multikey: the first needle's; vartrack: the first bound value
