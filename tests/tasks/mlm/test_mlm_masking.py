"""n-gram whole-word masking: statistics on a large sample, whole words, determinism."""

from collections import Counter

import numpy as np
import pytest

from tasks.mlm.masking import IGNORE, MaskingConfig, example_rng, mask_example, word_groups

MASK, VOCAB, LOW, CLS, SEP = 103, 30522, 999, 101, 102


def synthetic_example(rng: np.random.Generator, n_tokens: int = 126):
    """[CLS] + words of 1-3 word pieces + [SEP], as the tokenizer's word ids describe them."""
    ids, word_ids, word = [CLS], [None], 0
    while len(ids) < n_tokens + 1:
        for _ in range(min(int(rng.integers(1, 4)), n_tokens + 1 - len(ids))):
            ids.append(int(rng.integers(LOW, VOCAB)))
            word_ids.append(word)
        word += 1
    return ids + [SEP], word_ids + [None]


@pytest.fixture(scope="module")
def sample():
    rng = np.random.default_rng(0)
    cfg = MaskingConfig(mask_id=MASK, vocab_size=VOCAB, random_low=LOW)
    examples = [synthetic_example(rng) for _ in range(1500)]
    masked = [mask_example(ids, w, cfg, example_rng(7, 0, i)) for i, (ids, w) in enumerate(examples)]
    return cfg, examples, masked


def test_rate_and_ngram_lengths_follow_the_paper(sample):
    _, examples, masked = sample
    selected = sum(int((m.labels != IGNORE).sum()) for m in masked)
    tokens = sum(sum(w is not None for w in word_ids) for _, word_ids in examples)
    assert abs(selected / tokens - 0.15) < 0.003
    spans = Counter(n for m in masked for n in m.span_lengths)
    total = sum(spans.values())
    expected = np.array([1, 1 / 2, 1 / 3]) / (11 / 6)  # p(n) ~ 1/n, n <= 3
    observed = np.array([spans[1], spans[2], spans[3]]) / total
    assert set(spans) == {1, 2, 3}
    assert np.abs(observed - expected).max() < 0.02, observed


def test_80_10_10_replacement(sample):
    _, examples, masked = sample
    original = np.concatenate([np.asarray(ids)[m.labels != IGNORE] for (ids, _), m in zip(examples, masked)])
    replaced = np.concatenate([m.input_ids[m.labels != IGNORE] for m in masked])
    labels = np.concatenate([m.labels[m.labels != IGNORE] for m in masked])
    assert np.array_equal(labels, original)  # labels are the original tokens
    is_mask = replaced == MASK
    kept = replaced == original
    randomized = ~is_mask & ~kept
    assert abs(is_mask.mean() - 0.8) < 0.01
    assert abs(kept.mean() - 0.1) < 0.01  # (a random draw equal to the original is ~1e-5)
    assert abs(randomized.mean() - 0.1) < 0.01
    assert replaced[randomized].min() >= LOW and replaced[randomized].max() < VOCAB
    # tokens that are not selected are never changed
    for (ids, _), m in zip(examples[:100], masked[:100]):
        untouched = m.labels == IGNORE
        assert np.array_equal(m.input_ids[untouched], np.asarray(ids)[untouched])


def test_whole_words_and_specials(sample):
    _, examples, masked = sample
    for (ids, word_ids), m in zip(examples[:300], masked[:300]):
        chosen = m.labels != IGNORE
        assert not chosen[0] and not chosen[-1]  # [CLS], [SEP]
        for group in word_groups(word_ids):
            assert chosen[group].all() or not chosen[group].any()  # all pieces of a word, or none


def test_masks_are_deterministic_per_seed_epoch_and_example():
    cfg = MaskingConfig(mask_id=MASK, vocab_size=VOCAB, random_low=LOW)
    ids, word_ids = synthetic_example(np.random.default_rng(1))

    def labels(seed, epoch, index):
        return mask_example(ids, word_ids, cfg, example_rng(seed, epoch, index)).labels

    assert np.array_equal(labels(3, 1, 5), labels(3, 1, 5))
    assert not np.array_equal(labels(3, 1, 5), labels(3, 2, 5))  # a new epoch masks anew
    assert not np.array_equal(labels(3, 1, 5), labels(4, 1, 5))
    assert not np.array_equal(labels(3, 1, 5), labels(3, 1, 6))


def test_short_texts_mask_at_least_one_token():
    cfg = MaskingConfig(mask_id=MASK, vocab_size=VOCAB, random_low=LOW)
    m = mask_example([CLS, 2000, SEP], [None, 0, None], cfg, example_rng(0, 0, 0))
    assert m.labels.tolist() == [IGNORE, 2000, IGNORE]
    empty = mask_example([CLS, SEP], [None, None], cfg, example_rng(0, 0, 0))
    assert (empty.labels == IGNORE).all()
