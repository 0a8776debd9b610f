"""Associative recall (Zoology's MQAR), in an encoder's format, with duplicate and distractor keys.

A sequence is a context of key-value pairs, then a region of random filler tokens in which the
queried keys reappear; at each query position the target is the value bound to that key:

    k3 v3 k1 v1 k7 v7 k1 v9 | f f k7 f f k1 f k3 f ...      targets at k7: v7, at k1: v9, at k3: v3

Follows Zoology's `multiquery_ar` (HazyResearch/zoology, zoology/data/multiquery_ar.py): keys
from the lower half of the vocabulary and values from the upper half, each drawn without
replacement within a sequence; the queries' offsets in the query region drawn with the power law
p(k) ~ k^(power_a - 1) (Zoology's default power_a = 0.01: most queries soon after the context);
the rest of the query region random filler tokens.
Differs from it:
  - the target sits at the query token itself, not at the next position: the project's
    schemes that normalize over queries (DNAS, HNAS, Sinkhorn) are refused in causal attention,
    so the probe is read by a bidirectional encoder (after the context come only the queried
    keys and random filler, so seeing the whole sequence gives no answer away); the classes are
    the vocabulary's token ids, as Zoology's language-model head predicts them;
  - token 0 is padding, never a key, value or filler; the queries sit at any offsets of the
    query region (Zoology: even offsets), in a random order;
  - the filler is drawn uniformly from the tokens that are neither a key nor a value of the
    row (Zoology draws it from the whole vocabulary), so a queried key never reappears in the
    filler as a second, unscored query and a bound value never shows up out of its pair (from
    the whole vocabulary, a queried key reappeared in 78% of the rows at seq_len=32,
    vocab_size=48, num_kv_pairs=8, and in nearly all at the defaults);
  - `num_distractors` key-value pairs are in the context but never queried (Zoology queries
    every pair): more keys compete with the queried one, no more answers are asked;
  - `num_duplicates` of the queried keys are bound twice, to two different values, and the
    latest binding wins (a store being overwritten). A retrieval that spreads its weight over
    both occurrences of the key reads a mix of two values; only sharp attention to the later
    one answers, so this variant separates sharp from diffuse retrieval.

Trivial baseline ("chance"): a value drawn uniformly from those in the context, what a model
that learned the format but retrieves nothing does: accuracy 1 / (bindings in the context,
num_kv_pairs + num_distractors + num_duplicates).
Shortcut ("first binding"): the value after the queried key's first occurrence in the context,
what a model that ignores which binding is the latest answers: the target except at the keys
bound twice, so its accuracy is 1 - num_duplicates / num_kv_pairs exactly (theory).
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.probe.data import (
    IGNORE,
    TOKEN_CLASS,
    Baseline,
    ProbeData,
    check_positive,
    rng_for,
    rule,
    score,
)


def generate(
    n: int,
    seed: int,
    *,
    seq_len: int = 64,
    vocab_size: int = 64,
    num_kv_pairs: int = 8,
    num_distractors: int = 0,
    num_duplicates: int = 0,
    power_a: float = 0.01,
) -> ProbeData:
    """`n` sequences of `seq_len` tokens; `num_kv_pairs` queried pairs, plus `num_distractors`
    unqueried pairs and `num_duplicates` second bindings of queried keys in the context."""
    check_positive(n=n, seq_len=seq_len, vocab_size=vocab_size, num_kv_pairs=num_kv_pairs)
    queried, distinct = int(num_kv_pairs), int(num_kv_pairs) + int(num_distractors)
    bindings = distinct + int(num_duplicates)
    key_low, value_low = 1, 1 + (int(vocab_size) - 1) // 2
    if num_distractors < 0 or not 0 <= num_duplicates <= queried:
        raise ValueError(
            f"num_distractors={num_distractors} must be >= 0 and num_duplicates={num_duplicates} "
            f"within 0..num_kv_pairs={queried}; pass counts in those ranges"
        )
    if distinct > value_low - key_low or bindings > int(vocab_size) - value_low:
        raise ValueError(
            f"vocab_size={vocab_size} holds {value_low - key_low} keys and "
            f"{vocab_size - value_low} values, too few for {distinct} keys and {bindings} "
            f"values; pass a larger vocab_size"
        )
    context = 2 * bindings
    region = int(seq_len) - context
    if region < queried:
        raise ValueError(
            f"seq_len={seq_len} leaves {region} positions after a context of {context} tokens "
            f"for {queried} queries; pass seq_len >= {context + queried}"
        )
    fillers = int(vocab_size) - 1 - distinct - bindings  # tokens neither a key nor a value
    if region > queried and fillers < 1:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no filler token besides a row's {distinct} keys and "
            f"{bindings} values; pass vocab_size >= {distinct + bindings + 2}"
        )
    rng = rng_for(seed)
    n = int(n)

    # distinct keys and values per sequence: the first columns of a random permutation
    keys = key_low + np.argsort(rng.random((n, value_low - key_low)), axis=1)[:, :distinct]
    values = value_low + np.argsort(rng.random((n, vocab_size - value_low)), axis=1)[:, :bindings]
    # the first `queried` keys are asked; the first `num_duplicates` of them are bound twice
    pair_keys = np.concatenate([keys, keys[:, : int(num_duplicates)]], axis=1)
    order = np.argsort(rng.random((n, bindings)), axis=1)
    pair_keys = np.take_along_axis(pair_keys, order, axis=1)
    pair_values = np.take_along_axis(values, order, axis=1)

    # the filler: uniform among the tokens that are not one of the row's keys or values
    used = np.zeros((n, int(vocab_size)), dtype=bool)
    used[:, 0] = True  # padding
    np.put_along_axis(used, keys, True, axis=1)
    np.put_along_axis(used, values, True, axis=1)
    free = np.argsort(used, axis=1, kind="stable")[:, : max(fillers, 1)]
    inputs = np.take_along_axis(free, rng.integers(0, max(fillers, 1), size=(n, int(seq_len))),
                                axis=1)
    inputs[:, 0:context:2] = pair_keys
    inputs[:, 1:context:2] = pair_values

    # query offsets by the power law, without replacement (Gumbel top-k over log weights)
    log_p = (float(power_a) - 1.0) * np.log(np.arange(1, region + 1))
    gumbel = -np.log(-np.log(rng.random((n, region))))
    offsets = np.argsort(-(log_p + gumbel), axis=1)[:, :queried]
    query_keys = keys[:, :queried][np.arange(n)[:, None], np.argsort(rng.random((n, queried)))]
    positions = context + offsets
    np.put_along_axis(inputs, positions, query_keys, axis=1)

    # the value at the key's latest binding in the context
    match = pair_keys[:, None, :] == query_keys[:, :, None]  # (n, queried, bindings)
    latest = bindings - 1 - np.argmax(match[:, :, ::-1], axis=2)
    answers = np.take_along_axis(pair_values, latest, axis=1)
    targets = np.full((n, int(seq_len)), IGNORE, dtype=np.int64)
    np.put_along_axis(targets, positions, answers, axis=1)

    inputs_t, targets_t = torch.from_numpy(inputs).long(), torch.from_numpy(targets)
    # chance: per asked position, one of the sequence's context values (same count per row)
    pick = rng.integers(0, bindings, size=(n, int(seq_len)))
    guesses = torch.from_numpy(np.take_along_axis(pair_values, pick, axis=1))
    guesses = torch.where(targets_t == IGNORE, targets_t, guesses)
    first = np.argmax(match, axis=2)  # the key's first binding
    first_answers = np.take_along_axis(pair_values, first, axis=1)
    first_binding = np.full((n, int(seq_len)), IGNORE, dtype=np.int64)
    np.put_along_axis(first_binding, positions, first_answers, axis=1)
    return ProbeData(
        inputs=inputs_t,
        targets=targets_t,
        padding_mask=torch.zeros_like(inputs_t, dtype=torch.bool),
        target_kind=TOKEN_CLASS,
        num_classes=int(vocab_size),
        vocab_size=int(vocab_size),
        baseline=Baseline("chance", guesses, score(TOKEN_CLASS, guesses, targets_t), 1 / bindings),
        shortcut=rule("first binding", TOKEN_CLASS, torch.from_numpy(first_binding), targets_t,
                      1 - int(num_duplicates) / queried),
        meta={
            "context_length": context,
            "key_range": (key_low, value_low),
            "value_range": (value_low, int(vocab_size)),
            "num_kv_pairs": queried,
            "num_distractors": int(num_distractors),
            "num_duplicates": int(num_duplicates),
        },
    )
