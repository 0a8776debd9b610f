"""The hub key: many queries want the same key (the cost of normalizing over queries).

A sequence is a context of `num_pairs` (key, value) pairs, then a query region of `num_queries`
key tokens; at each query the target is the value bound to that key in the context:

    k4 v2 k9 v7 k1 v2 ... | k9 k9 k4 k9 ...      targets at k9: v7, at k4: v2

Tokens: 0 pad, keys [1, 1+K), values [1+K, 1+K+V) (K = key_vocab, V = value_vocab; the class is
the value index 0..V-1). The context's keys are distinct, its values uniform with replacement,
the pairs in a random order. Roles: the context is `key_only` and the query region
`query_only` (cross-attention from the queries to the context: a query never reads another
query, a context position asks nothing).

Which keys the queries ask (`popularity`):
    "hub"   `hub_queries` of the queries ask one context key chosen at random (the hub, in
            `meta["hub_key"]`), the other num_queries - hub_queries ask distinct other context
            keys; the query order is shuffled;
    "zipf"  each query's key is drawn independently, p(rank r) ~ r^-zipf_exponent over the
            context keys put in a random rank order (`hub_queries` is ignored; a key may be
            asked by several queries or by none).
`meta["demand"]` holds, at each scored query, how many scored queries ask its key.

Why: attention normalized over queries too (DNAS, HNAS, Sinkhorn) gives each key a fixed
budget of attention mass to share among the queries that read it; a hub key wanted by
`hub_queries` queries has to split it, so each of them reads the hub faintly, while the
mass of the keys nobody asks still has to go to some query, as noise. Softmax over keys alone
lets every query take the hub whole. The probe measures that cost; by the same argument the
cost should vanish when every key is wanted by someone:
    ask_every_key=True  (positive control) one extra query position is appended for every
                        context key that no scored query asks, so every key has demand; their
                        answers are `aux_targets` (trained, never scored), their targets
                        IGNORE; the scored queries are unchanged. Under "zipf" the number of
                        extra queries varies by row: rows are padded (token 0, padding_mask
                        True) to the longest possible, 2 * num_pairs + num_queries +
                        num_pairs - 1.
Length 2 * num_pairs + num_queries (+ the extra queries).

No generator in Zoology or the Long Range Arena is followed (it is associative recall with the
queries' popularity skewed, and the keys read by cross-attention).

Trivial baseline ("chance"): at each scored query a value drawn uniformly from the context's
num_pairs bindings. Values repeat in the context, so its accuracy is not 1 / num_pairs but
1 / num_pairs + (1 - 1 / num_pairs) / value_vocab (the drawn binding is the asked one, or
another whose independent value happens to agree; theory).
Shortcut ("plurality value of the context"): the context's most frequent value (ties: the
smallest value index) at every scored query. The asked pair is chosen independently of the
values, so its expected accuracy is E[the largest value count] / num_pairs, counted exactly
(tasks/probe/data.py, `plurality_share`; theory).
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.probe.data import (
    IGNORE,
    PAD,
    TOKEN_CLASS,
    Baseline,
    ProbeData,
    check_positive,
    plurality,
    plurality_share,
    rng_for,
    rule,
    score,
)

POPULARITIES = ("hub", "zipf")


def generate(
    n: int,
    seed: int,
    *,
    num_pairs: int = 24,
    num_queries: int = 16,
    hub_queries: int = 16,
    key_vocab: int = 32,
    value_vocab: int = 32,
    popularity: str = "hub",
    zipf_exponent: float = 1.0,
    ask_every_key: bool = False,
) -> ProbeData:
    """`n` sequences of a `num_pairs`-pair context and `num_queries` scored queries whose keys
    follow `popularity` (plus, with `ask_every_key`, one query per key no scored query asks)."""
    check_positive(n=n, num_pairs=num_pairs, num_queries=num_queries, key_vocab=key_vocab,
                   value_vocab=value_vocab)
    n, p, r = int(n), int(num_pairs), int(num_queries)
    k_voc, v_voc = int(key_vocab), int(value_vocab)
    if popularity not in POPULARITIES:
        raise ValueError(f"popularity={popularity!r} is not a popularity; use one of "
                         f"{POPULARITIES}")
    if k_voc < p:
        raise ValueError(f"key_vocab={key_vocab} cannot hold {p} distinct keys; pass "
                         f"key_vocab >= num_pairs={p}")
    q = int(hub_queries)
    if popularity == "hub" and not (1 <= q <= r and r - q <= p - 1):
        raise ValueError(
            f"hub_queries={hub_queries} must be within 1..num_queries={r}, and the other "
            f"{r - q} queries need as many distinct non-hub keys among num_pairs - 1={p - 1}; "
            f"pass hub_queries >= {max(1, r - p + 1)} (or more num_pairs)"
        )
    if popularity == "zipf" and not (np.isfinite(zipf_exponent) and zipf_exponent >= 0):
        raise ValueError(f"zipf_exponent={zipf_exponent} must be a finite number >= 0")
    rng = rng_for(seed)
    rows = np.arange(n)[:, None]
    context = 2 * p
    key0, value0 = 1, 1 + k_voc

    keys = key0 + np.argsort(rng.random((n, k_voc)), axis=1)[:, :p]  # distinct, random order
    values = rng.integers(0, v_voc, size=(n, p))
    rank = np.argsort(rng.random((n, p)), axis=1)  # rank[:, i]: the pair of popularity rank i
    if popularity == "hub":
        # the hub (rank 0) hub_queries times, then ranks 1..r-q once each; order shuffled
        asked = np.concatenate([np.zeros((n, q), dtype=np.int64),
                                np.broadcast_to(np.arange(1, 1 + r - q), (n, r - q))], axis=1)
        asked = np.take_along_axis(asked, np.argsort(rng.random((n, r)), axis=1), axis=1)
    else:
        cdf = np.cumsum(np.arange(1, p + 1, dtype=np.float64) ** -float(zipf_exponent))
        asked = np.searchsorted(cdf / cdf[-1], rng.random((n, r)), side="right")
        asked = np.minimum(asked, p - 1)  # guards the rounding of the last cdf entry
    asked = np.take_along_axis(rank, asked, axis=1)  # (n, r) the pair each query asks

    wanted = np.zeros((n, p), dtype=bool)
    wanted[rows, asked] = True
    extra = 0
    if ask_every_key:
        extra = p - (1 + r - q) if popularity == "hub" else p - 1
    seq_len = context + r + extra

    inputs = np.full((n, seq_len), PAD, dtype=np.int64)
    inputs[:, 0:context:2] = keys
    inputs[:, 1:context:2] = value0 + values
    inputs[:, context : context + r] = np.take_along_axis(keys, asked, axis=1)
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    targets[:, context : context + r] = np.take_along_axis(values, asked, axis=1)
    aux = None
    if ask_every_key:  # the unwanted pairs, in a random order, after the scored queries
        order = np.where(wanted, np.inf, rng.random((n, p)))
        unwanted = np.argsort(order, axis=1)[:, :extra]
        real = np.arange(extra)[None, :] < (~wanted).sum(axis=1, keepdims=True)
        region = np.s_[:, context + r :]
        inputs[region] = np.where(real, np.take_along_axis(keys, unwanted, axis=1), PAD)
        aux_np = np.full((n, seq_len), IGNORE, dtype=np.int64)
        aux_np[region] = np.where(real, np.take_along_axis(values, unwanted, axis=1), IGNORE)
        aux = torch.from_numpy(aux_np)

    read_at = np.full((n, seq_len), -1, dtype=np.int64)
    read_at[:, context : context + r] = 2 * asked  # a scored query reads its pair's entry
    demand = np.zeros((n, seq_len), dtype=np.int64)
    demand[:, context : context + r] = (asked[:, :, None] == asked[:, None, :]).sum(axis=2)
    inputs_t, targets_t = torch.from_numpy(inputs), torch.from_numpy(targets)
    padding = inputs_t == PAD
    key_only = torch.zeros((n, seq_len), dtype=torch.bool)
    key_only[:, :context] = True
    query_only = ~key_only & ~padding

    # chance: per asked position, one of the row's context values (as recall)
    pick = rng.integers(0, p, size=(n, seq_len))
    guesses = torch.from_numpy(np.take_along_axis(values, pick, axis=1))
    guesses = torch.where(targets_t == IGNORE, targets_t, guesses)
    common = torch.from_numpy(plurality(values, v_voc)).long()[:, None].expand(n, seq_len)
    hub_key = keys[np.arange(n), rank[:, 0]] if popularity == "hub" else np.full(n, -1)
    return ProbeData(
        inputs=inputs_t,
        targets=targets_t,
        padding_mask=padding,
        target_kind=TOKEN_CLASS,
        num_classes=v_voc,
        vocab_size=value0 + v_voc,
        baseline=Baseline("chance", guesses, score(TOKEN_CLASS, guesses, targets_t),
                          1 / p + (1 - 1 / p) / v_voc),
        meta={
            "hub_key": torch.from_numpy(hub_key).long(),
            "demand": torch.from_numpy(demand),
            "context_length": context,
            "key_range": (key0, value0),
            "value_range": (value0, value0 + v_voc),
        },
        shortcut=rule("plurality value of the context", TOKEN_CLASS, common.clone(), targets_t,
                      plurality_share(p, v_voc)),
        aux_targets=aux,
        key_only=key_only,
        query_only=query_only,
        read_at=torch.from_numpy(read_at),
    )
