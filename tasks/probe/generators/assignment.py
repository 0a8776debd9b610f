"""Monotone matching: pair queries with keys by rank (the 1-D optimal transport plan).

A sequence is `num_items` keys, each followed by its colour (in a random order), then
`num_items` queries (in a random order); keys and queries are points on a line of `positions`
cells. Sorting both, the query of rank r is matched with the key of rank r, which is the
optimal transport plan between the two point sets on the line (for any convex cost); at each
query the target is the colour of its rank-matched key:

    K5 c2 K1 c0 K9 c7 | Q3 Q0 Q2      sorted keys 1 5 9, queries 0 2 3: Q0 -> K1 (c0),
                                      Q2 -> K5 (c2), Q3 -> K9 (c7); targets c7 c0 c2
                                      (Q2 and Q3 collide: K1 and K5 are nearer them)

Tokens: 0 pad, query positions [1, 1+P), key positions [1+P, 1+2P) (P = positions), colours
[1+2P, 1+2P+C) (C = num_colours; the class is the colour index 0..C-1). Length 3 * num_items;
no padding. Roles: the key block (keys and colours) is `key_only`, the query block
`query_only` (cross-attention from the queries to the keys).

A query "collides" when its rank-matched key is not among its nearest keys (its distance to it
is strictly larger than the smallest distance to a key): there the nearest key, which
softmax-over-keys attention finds on its own, is the wrong answer, and the queries must
compete for the keys, one key per query, which attention normalized over queries and keys
approximates (Sinkhorn's doubly stochastic plan is an entropic transport plan; DNAS's two
normalizations are one step toward it). Every row has exactly round(collisions * num_items)
colliding queries (`meta["collides"]`); at most num_items - 1 can collide (walking up the
ranks, the index of the key nearest the rank-r query minus r starts >= 0 and ends <= 0 in steps
of at least -1, so it is 0 somewhere).
No query is equidistant from two nearest keys: such a query (a cell at the midpoint of two
keys) would be neither plainly answered by its nearest key nor plainly colliding (15% of the
queries at the defaults if allowed, which then cost the nearest-key rule 7 points at
collisions=0), so the cells with two nearest keys are left out; `collisions` alone sets how
much of the task the matching decides.
Controls: target="nearest" (positive control) asks the colour of the nearest key instead (ties:
the smaller position, though none occur), removing the matching from the task over the same
inputs.

Construction (whole arrays at once, no row-by-row rejection): the keys are num_items distinct
cells drawn uniformly; the colliding ranks a uniform subset of round(collisions * num_items)
ranks; the queries a uniform draw among the strictly increasing sequences q_0 < ... < q_{N-1}
whose rank-r query is on a cell with one nearest key, that of rank r exactly when rank r is not
in the subset (counted by dynamic programming over (rank, cell), then sampled rank by rank).
Rows whose keys admit no such queries draw their keys again, keeping their subset, so that
which ranks collide stays uniform (redrawing the subset too would spare the end ranks, whose
collisions need more room). Queries are distinct, as keys are; a query may share a cell with a
key.

No generator in Zoology or the Long Range Arena is followed.

Trivial baseline ("chance"): a uniform colour, accuracy 1 / num_colours (theory).
Shortcut ("nearest key's colour", ties: the smaller position): right at every non-colliding
query, and at a colliding one only where its nearest key's colour, drawn independently,
happens to be the rank-matched key's: for target="rank" its expected accuracy is
1 - f + f / num_colours exactly, f = round(collisions * num_items) / num_items (theory).
For target="nearest" it is the target (accuracy 1).
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

TARGETS = ("rank", "nearest")
QUERY0 = 1  # query at cell x is token QUERY0 + x
MAX_REDRAWS = 200


def vocabulary(positions: int, num_colours: int) -> dict[str, tuple[int, int]]:
    """Token ranges [low, high): query cells, key cells, colours."""
    keys = (QUERY0 + positions, QUERY0 + 2 * positions)
    return {"queries": (QUERY0, keys[0]), "keys": keys, "colours": (keys[1], keys[1] + num_colours)}


def _allowed(keys: np.ndarray, collide: np.ndarray, positions: int) -> np.ndarray:
    """(t, N, P): may the rank-r query sit at cell x? Only where one key is nearest (no ties),
    and where that key is rank r's exactly when rank r does not collide."""
    dist = np.abs(np.arange(positions)[None, None, :] - keys[:, :, None])  # (t, N, P)
    own_nearest = dist == dist.min(axis=1, keepdims=True)
    unique = own_nearest.sum(axis=1, keepdims=True) == 1
    return unique & np.where(collide[:, :, None], ~own_nearest, own_nearest)


def _sample_queries(rng: np.random.Generator, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A uniform strictly increasing query sequence per row with query r on an allowed cell of
    rank r; returns (queries (t, N), feasible (t,)); infeasible rows' queries are meaningless."""
    t, num, cells = allowed.shape
    # ways[:, r, x]: the sequences q_r < ... < q_{N-1} on allowed cells with q_r >= x
    ways = np.zeros((t, num + 1, cells + 1))
    ways[:, num, :] = 1.0
    for r in range(num - 1, -1, -1):
        here = allowed[:, r, :] * ways[:, r + 1, 1:]
        ways[:, r, :cells] = np.cumsum(here[:, ::-1], axis=1)[:, ::-1]
    feasible = ways[:, 0, 0] > 0
    queries = np.zeros((t, num), dtype=np.int64)
    previous = np.full(t, -1)
    cell = np.arange(cells)[None, :]
    for r in range(num):
        weight = allowed[:, r, :] * ways[:, r + 1, 1:] * (cell > previous[:, None])
        cumulative = np.cumsum(weight, axis=1)
        draw = rng.random(t) * cumulative[:, -1]
        queries[:, r] = previous = np.argmax(cumulative > draw[:, None], axis=1)
    return queries, feasible


def generate(
    n: int,
    seed: int,
    *,
    num_items: int = 8,
    positions: int = 32,
    num_colours: int = 8,
    collisions: float = 0.5,
    target: str = "rank",
) -> ProbeData:
    """`n` sequences of `num_items` coloured keys and `num_items` queries on `positions` cells,
    round(collisions * num_items) of the queries colliding in every row; `target` "rank" (the
    matched key's colour) or "nearest" (the nearest key's colour)."""
    check_positive(n=n, num_items=num_items, positions=positions, num_colours=num_colours)
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not an assignment target; use one of {TARGETS}")
    if not 0.0 <= float(collisions) <= 1.0:
        raise ValueError(f"collisions={collisions} is a fraction of the queries; pass 0..1")
    n, num, cells, c = int(n), int(num_items), int(positions), int(num_colours)
    if cells < num:
        raise ValueError(f"positions={positions} cannot hold {num} distinct keys; pass "
                         f"positions >= num_items={num}")
    colliding = round(float(collisions) * num)
    if colliding > num - 1:
        raise ValueError(
            f"collisions={collisions} asks {colliding} colliding queries of {num}, but at most "
            f"num_items - 1 can collide (some query always lies nearest its rank-matched key); "
            f"pass collisions <= {(num - 1) / num:.3f}"
        )
    vocab = vocabulary(cells, c)
    rng = rng_for(seed)

    keys = np.zeros((n, num), dtype=np.int64)
    queries = np.zeros((n, num), dtype=np.int64)
    collide = np.argsort(rng.random((n, num)), axis=1) < colliding  # by rank, kept throughout
    todo = np.arange(n)
    for _ in range(MAX_REDRAWS):
        draw_keys = np.sort(np.argsort(rng.random((len(todo), cells)), axis=1)[:, :num], axis=1)
        draw_queries, ok = _sample_queries(rng, _allowed(draw_keys, collide[todo], cells))
        keys[todo[ok]], queries[todo[ok]] = draw_keys[ok], draw_queries[ok]
        todo = todo[~ok]
        if len(todo) == 0:
            break
    else:
        raise ValueError(
            f"collisions={collisions}: {colliding} colliding queries of {num} found no placement "
            f"in {MAX_REDRAWS} draws of keys on {cells} cells; pass a smaller collisions or "
            f"more positions"
        )

    rows = np.arange(n)[:, None]
    colours = rng.integers(0, c, size=(n, num))  # colours[:, r]: the colour of the rank-r key
    key_order = np.argsort(rng.random((n, num)), axis=1)  # key rank at each key-block slot
    query_order = np.argsort(rng.random((n, num)), axis=1)  # query rank at each query slot
    inputs = np.empty((n, 3 * num), dtype=np.int64)
    inputs[:, 0 : 2 * num : 2] = vocab["keys"][0] + keys[rows, key_order]
    inputs[:, 1 : 2 * num : 2] = vocab["colours"][0] + colours[rows, key_order]
    inputs[:, 2 * num :] = QUERY0 + queries[rows, query_order]

    # the nearest key of each (sorted) query: argmin takes the first, the smaller position
    dist = np.abs(queries[:, :, None] - keys[:, None, :])  # (n, query rank, key rank)
    nearest = dist.argmin(axis=2)
    answer = colours if target == "rank" else np.take_along_axis(colours, nearest, axis=1)
    targets = np.full((n, 3 * num), IGNORE, dtype=np.int64)
    targets[:, 2 * num :] = answer[rows, query_order]
    guess_nearest = np.full((n, 3 * num), IGNORE, dtype=np.int64)
    guess_nearest[:, 2 * num :] = np.take_along_axis(colours, nearest, axis=1)[rows, query_order]
    at_queries = np.zeros((n, 3 * num), dtype=bool)
    at_queries[:, 2 * num :] = True
    collides = np.zeros_like(at_queries)
    collides[:, 2 * num :] = collide[rows, query_order]

    # the key-block slot of each key rank; a query reads the entry of the key its answer is from
    slot_of_rank = np.argsort(key_order, axis=1)
    source = np.broadcast_to(np.arange(num), (n, num)) if target == "rank" else nearest
    read_at = np.full((n, 3 * num), -1, dtype=np.int64)
    read_at[:, 2 * num :] = 2 * np.take_along_axis(slot_of_rank, source, axis=1)[rows, query_order]

    targets_t = torch.from_numpy(targets)
    share = colliding / num  # the colliding share of the queries
    guesses = chance_predictions(rng, targets_t, np.arange(c))
    key_only = torch.from_numpy(~at_queries)
    return ProbeData(
        inputs=torch.from_numpy(inputs),
        targets=targets_t,
        padding_mask=torch.zeros((n, 3 * num), dtype=torch.bool),
        target_kind=TOKEN_CLASS,
        num_classes=c,
        vocab_size=vocab["colours"][1],
        baseline=Baseline("chance", guesses, score(TOKEN_CLASS, guesses, targets_t), 1 / c),
        meta={
            "collides": torch.from_numpy(collides),  # at query positions: rank-match not nearest
            "num_colliding": colliding,
            **vocab,
        },
        shortcut=rule("nearest key's colour", TOKEN_CLASS, torch.from_numpy(guess_nearest),
                      targets_t, 1.0 if target == "nearest" else 1 - share + share / c),
        key_only=key_only,
        query_only=torch.from_numpy(at_queries),
        read_at=torch.from_numpy(read_at),
    )
