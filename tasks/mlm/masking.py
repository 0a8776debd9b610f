"""n-gram whole-word masking (ALBERT / SpanBERT style), deterministic per (seed, epoch, example).

Spans of n whole words are chosen with p(n) proportional to 1/n (n <= max_ngram) until about
`rate` of the tokens are selected; each selected token becomes [MASK] with probability 0.8, a
random token with 0.1, and stays itself with 0.1. The loss is taken on every selected token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IGNORE = -100  # label of tokens that are not predicted (the cross-entropy ignore_index)


@dataclass(frozen=True)
class MaskingConfig:
    mask_id: int
    vocab_size: int
    rate: float = 0.15
    max_ngram: int = 3
    mask_prob: float = 0.8
    random_prob: float = 0.1
    random_low: int = 0  # random replacements are drawn from [random_low, vocab_size)

    def ngram_probs(self) -> np.ndarray:
        weights = 1.0 / np.arange(1, self.max_ngram + 1)
        return weights / weights.sum()


@dataclass
class MaskedExample:
    input_ids: np.ndarray  # after replacement
    labels: np.ndarray  # original id where selected, IGNORE elsewhere
    span_lengths: list  # length in words of every chosen span (for statistics)


def word_groups(word_ids: Sequence[int | None]) -> list[list[int]]:
    """Token positions grouped by word, in order; special tokens (word id None or < 0) belong to none."""
    groups: list[list[int]] = []
    previous = None
    for position, word in enumerate(word_ids):
        if word is None or word < 0:
            previous = None
            continue
        if word != previous:
            groups.append([])
            previous = word
        groups[-1].append(position)
    return groups


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The RNG of one example: same (seed, epoch, index) -> same masks, in any worker or order."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), int(index)])


def mask_example(input_ids: Sequence[int], word_ids: Sequence[int | None], cfg: MaskingConfig,
                 rng: np.random.Generator) -> MaskedExample:
    ids = np.asarray(input_ids, dtype=np.int64)
    words = word_groups(word_ids)
    n_tokens = sum(len(w) for w in words)
    labels = np.full_like(ids, IGNORE)
    if n_tokens == 0:
        return MaskedExample(ids.copy(), labels, [])
    budget = max(1, round(n_tokens * cfg.rate))
    probs = cfg.ngram_probs()

    # Draw n from p(n), then put the span of n whole words at a random place where it does not
    # overlap an earlier span. Re-drawing the place (not n) on overlap keeps the span lengths
    # distributed as p(n). The span that crosses the budget is kept with probability
    # remaining/size, so the expected number of selected tokens is the budget exactly.
    free = np.ones(len(words), dtype=np.int64)
    word_sizes = np.asarray([len(w) for w in words])
    selected: list[int] = []
    spans: list[int] = []
    while len(selected) < budget:
        n = int(rng.choice(len(probs), p=probs)) + 1
        fits = np.flatnonzero(np.convolve(free, np.ones(n, dtype=np.int64), mode="valid") == n)
        if len(fits) == 0:
            if n == 1:
                break  # every word is taken
            continue
        start = int(fits[rng.integers(len(fits))])
        size = int(word_sizes[start:start + n].sum())
        remaining = budget - len(selected)
        if size > remaining and rng.random() >= remaining / size:
            break
        free[start:start + n] = 0
        for w in words[start:start + n]:
            selected.extend(w)
        spans.append(n)

    selected_arr = np.asarray(sorted(selected), dtype=np.int64)
    labels[selected_arr] = ids[selected_arr]
    out = ids.copy()
    action = rng.random(len(selected_arr))
    to_mask = selected_arr[action < cfg.mask_prob]
    to_random = selected_arr[(action >= cfg.mask_prob) & (action < cfg.mask_prob + cfg.random_prob)]
    out[to_mask] = cfg.mask_id
    out[to_random] = rng.integers(cfg.random_low, cfg.vocab_size, size=len(to_random))
    return MaskedExample(out, labels, spans)
