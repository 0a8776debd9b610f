"""The probe generators: determinism by seed, labels recomputed by brute force on small cases, and
the trivial baselines' scores against theory on large samples."""

from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.cluster.hierarchy import fcluster, linkage

from tasks.probe import GENERATORS, clusters, coverage, listops, recall, retrieval
from tasks.probe.data import IGNORE, PAD, REGRESSION, SEQUENCE_CLASS, TOKEN_CLASS

CASES = {
    "recall": {},
    "recall_dup_distract": {"num_duplicates": 2, "num_distractors": 3},
    "coverage": {},
    "coverage_variable": {"min_length": 20},
    "clusters_count": {"target": "count"},
    "clusters_centre": {"target": "centre"},
    "retrieval": {"num_value_distractors": 3},
    "listops": {},
}


def make(case: str, n: int, seed: int):
    return GENERATORS[case.split("_")[0]](n, seed, **CASES[case])


def tensors(data) -> list[torch.Tensor]:
    extra = [v for v in data.meta.values() if isinstance(v, torch.Tensor)]
    return [data.inputs, data.targets, data.padding_mask, data.baseline.predictions, *extra]


@pytest.mark.parametrize("case", CASES)
def test_same_seed_same_data_other_seed_other_data(case):
    a, b, c = make(case, 40, 3), make(case, 40, 3), make(case, 40, 4)
    for x, y in zip(tensors(a), tensors(b)):
        assert torch.equal(x, y)
    assert a.baseline.score == b.baseline.score
    assert not torch.equal(a.inputs, c.inputs)


@pytest.mark.parametrize("case", CASES)
def test_shapes_ranges_and_padding(case):
    data = make(case, 40, 0)
    n, length = data.inputs.shape[:2]
    assert n == len(data) == 40 and data.padding_mask.shape == (n, length)
    assert data.baseline.predictions.shape == data.targets.shape
    if data.target_kind == REGRESSION:
        assert data.targets.shape == (n, data.inputs.shape[2]) and data.num_classes == 0
        return
    if data.vocab_size:  # token probes: ids in range, padding is token 0 exactly where masked
        assert data.inputs.min() >= 0 and data.inputs.max() < data.vocab_size
        assert torch.equal(data.padding_mask, data.inputs == PAD)
    asked = data.targets[data.targets != IGNORE]
    assert asked.min() >= 0 and asked.max() < data.num_classes
    if data.target_kind == TOKEN_CLASS:
        assert data.targets.shape == (n, length)
        assert not (data.padding_mask & (data.targets != IGNORE)).any()
        unasked = data.targets == IGNORE
        assert (data.baseline.predictions[unasked] == IGNORE).all()
    else:
        assert data.target_kind == SEQUENCE_CLASS and data.targets.shape == (n,)


# ---- labels by brute force ---------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"num_duplicates": 3, "num_distractors": 2}])
def test_recall_targets_are_the_latest_binding(options):
    data = recall.generate(30, 1, seq_len=32, vocab_size=40, num_kv_pairs=4, **options)
    context = data.meta["context_length"]
    key_low, key_high = data.meta["key_range"]
    for row, labels in zip(data.inputs.tolist(), data.targets.tolist()):
        pairs = [(row[i], row[i + 1]) for i in range(0, context, 2)]
        keys = Counter(k for k, _ in pairs)
        assert len(keys) == 4 + options.get("num_distractors", 0)
        assert sum(c == 2 for c in keys.values()) == options.get("num_duplicates", 0)
        asked = [q for q, label in enumerate(labels) if label != IGNORE]
        assert len(asked) == 4 and min(asked) >= context
        assert len({row[q] for q in asked}) == 4  # each queried key asked once
        for q in asked:
            assert key_low <= row[q] < key_high
            expected = None
            for key, value in pairs:  # the last binding of the key wins
                if key == row[q]:
                    expected = value
            assert labels[q] == expected


def test_coverage_targets_are_the_counts():
    data = coverage.generate(30, 2, length=12, num_types=4, min_length=6)
    for row, labels, size in zip(data.inputs.tolist(), data.targets.tolist(),
                                 data.meta["lengths"].tolist()):
        content = row[4:]
        assert all(t != PAD for t in content[:size]) and all(t == PAD for t in content[size:])
        counts = Counter(content[:size])
        assert row[:4] == [5, 6, 7, 8]  # the count slots
        assert labels[:4] == [counts[t] for t in (1, 2, 3, 4)]
        assert all(label == IGNORE for label in labels[4:])


def test_clusters_are_recovered_by_single_linkage():
    # separation 1.0 against noise 0.05: cutting the single-linkage tree at 0.45 finds the clusters
    count = clusters.generate(30, 5, target="count")
    centre = clusters.generate(30, 5, target="centre")
    assert torch.equal(count.inputs, centre.inputs)  # the target changes nothing else
    for points, k, target in zip(count.inputs.double().numpy(), count.targets.tolist(),
                                 centre.targets.double().numpy()):
        found = fcluster(linkage(points, "single"), t=0.45, criterion="distance")
        sizes = Counter(found.tolist())
        assert len(sizes) == k
        smallest = sorted(sizes.values())
        assert smallest[0] == 2 and smallest[1] > 2  # one minority cluster, unbalanced
        label = min(sizes, key=sizes.get)
        np.testing.assert_allclose(points[found == label].mean(axis=0), target, atol=1e-6)


def test_retrieval_target_is_the_ordered_tuple():
    data = retrieval.generate(40, 3, seq_len=20, num_slots=3, num_values=5,
                              num_value_distractors=2)
    (m_low, m_high), (v_low, v_high) = data.meta["markers"], data.meta["values"]
    for row, target in zip(data.inputs.tolist(), data.targets.tolist()):
        assert row[0] == retrieval.CLS
        values = []
        for marker in range(m_low, m_high):
            where = [i for i, t in enumerate(row) if t == marker]
            assert len(where) == 1
            values.append(row[where[0] + 1] - v_low)
        assert all(0 <= v < 5 for v in values)
        assert sum(v_low <= t < v_high for t in row) == 3 + 2  # slots' values + distractors
        assert target == sum(v * 5**h for h, v in enumerate(values))


def evaluate_listops(tokens: list[int]) -> int:
    """A stack evaluator of the token stream (LRA's semantics: MED is int(np.median))."""
    ops = {listops.OPERATOR0 + i: name for i, name in enumerate(listops.OPERATORS)}
    stack: list = []
    for t in tokens:
        if t in ops:
            stack.append([ops[t]])
        elif t == listops.END:
            op, *args = stack.pop()
            value = {"MIN": min, "MAX": max, "MED": lambda a: int(np.median(a)),
                     "SM": lambda a: sum(a) % 10}[op](args)
            if not stack:
                return value
            stack[-1].append(value)
        else:
            digit = t - listops.DIGIT0
            if not stack:
                return digit
            stack[-1].append(digit)
    raise AssertionError("unclosed expression")


def test_listops_targets_by_a_stack_evaluator():
    data = listops.generate(150, 7, seq_len=40, min_length=8, max_args=5)
    rows = [tuple(t for t in row if t != PAD) for row in data.inputs.tolist()]
    assert len(set(rows)) == 150  # no expression twice, as LRA
    lengths = data.meta["lengths"].tolist()
    assert all(8 <= size <= 39 for size in lengths)
    for row, target, size in zip(rows, data.targets.tolist(), lengths):
        assert row[0] == listops.CLS and len(row) == size + 1
        assert evaluate_listops(list(row[1:])) == target
    median_cases = [([4, 7], 5), ([1, 2, 3, 9], 2), ([0, 9], 4), ([3, 1, 2], 2)]
    for args, expected in median_cases:
        assert listops.apply("MED", args) == int(np.median(args)) == expected


# ---- the trivial baselines against theory --------------------------------------------------


@pytest.mark.parametrize(
    "options, pairs",
    [({}, 8), ({"num_kv_pairs": 4, "num_distractors": 3, "num_duplicates": 2}, 9)],
)
def test_recall_chance_is_one_over_the_pairs_in_context(options, pairs):
    data = recall.generate(3000, 0, **options)
    assert data.baseline.theory == pytest.approx(1 / pairs)
    # >= 12000 asked positions: s.e. <= 0.003
    assert data.baseline.score == pytest.approx(1 / pairs, abs=0.012)


def test_coverage_majority_is_the_binomial_mode():
    data = coverage.generate(3000, 0, length=32, num_types=8)
    mode_share = float(stats.binom.pmf(4, 32, 1 / 8))  # mode of Binomial(32, 1/8): floor(33/8)
    assert data.baseline.theory == pytest.approx(mode_share, rel=1e-9)
    asked = data.baseline.predictions[data.targets != IGNORE]
    assert (asked == 4).all()
    assert data.baseline.score == pytest.approx(mode_share, abs=0.012)  # 24000 slots


def test_cluster_count_chance_is_one_over_the_counts():
    data = clusters.generate(3000, 0, target="count", min_clusters=2, max_clusters=5)
    assert data.num_classes == 6 and data.baseline.theory == 0.25
    assert data.baseline.score == pytest.approx(0.25, abs=0.03)  # s.e. 0.008
    shares = torch.bincount(data.targets, minlength=6)[2:] / 3000
    assert torch.allclose(shares, torch.full((4,), 0.25), atol=0.03)


def test_cluster_centre_mean_baseline_error_is_theory():
    data = clusters.generate(3000, 0, target="centre", dim=4, noise=0.05, minority_size=2)
    theory = 1.0 / 4 + 0.05**2 / 2
    assert data.baseline.theory == pytest.approx(theory)
    assert data.baseline.score == pytest.approx(theory, rel=0.05)
    # the collapsed answer (the global mean) is no better than the constant: the probe's point
    collapsed = float(((data.meta["collapsed"] - data.targets) ** 2).mean())
    assert collapsed > 0.8 * theory


def test_retrieval_chance_is_one_over_the_tuples():
    data = retrieval.generate(4000, 0, num_slots=2, num_values=4)
    assert data.num_classes == 16 and data.baseline.theory == 1 / 16
    assert data.baseline.score == pytest.approx(1 / 16, abs=0.015)  # s.e. 0.004
    slot_shares = torch.bincount(data.meta["slot_values"].flatten(), minlength=4) / 8000
    assert torch.allclose(slot_shares, torch.full((4,), 0.25), atol=0.02)


def test_listops_majority_is_the_most_frequent_answer():
    data = listops.generate(300, 0)
    counts = torch.bincount(data.targets, minlength=10)
    assert data.baseline.theory is None
    assert (data.baseline.predictions == counts.argmax()).all()
    assert data.baseline.score == pytest.approx(float(counts.max()) / 300)
    assert 0.1 <= data.baseline.score < 0.5  # all ten answers occur, none dominates


@pytest.mark.parametrize(
    "probe, options, words",
    [
        ("recall", {"vocab_size": 10}, "pass a larger vocab_size"),
        ("recall", {"seq_len": 20}, "pass seq_len >= 24"),
        ("coverage", {"min_length": 40}, "min_length=40"),
        ("clusters", {"target": "radius"}, "use one of"),
        ("retrieval", {"seq_len": 4}, "pass seq_len >= 5"),
        ("listops", {"min_length": 80}, "min_length=80"),
    ],
)
def test_impossible_options_fail_in_one_line(probe, options, words):
    with pytest.raises(ValueError, match=words) as error:
        GENERATORS[probe](10, 0, **options)
    assert "\n" not in str(error.value)


def test_retrieval_places_markers_and_distractors_uniformly():
    """Markers in a random order and anywhere after CLS; distractors on the free cells only."""
    data = retrieval.generate(4000, 1, seq_len=12, num_slots=2, num_values=4,
                              num_value_distractors=3)
    (m_low, _), (v_low, v_high) = data.meta["markers"], data.meta["values"]
    first = (data.inputs == m_low).float().argmax(1)
    second = (data.inputs == m_low + 1).float().argmax(1)
    assert float((first < second).float().mean()) == pytest.approx(0.5, abs=0.03)  # s.e. 0.008
    # marker 0's cell: the 36 placements of two blocks of 2 in cells 1..11, half of them with
    # marker 0 in each block, put it at cells 1 and 10 in 8 of 72 cases, at 2..9 in 7
    shares = torch.bincount(first, minlength=12)[1:11] / 4000
    theory = torch.tensor([8, 7, 7, 7, 7, 7, 7, 7, 7, 8]) / 72
    assert torch.allclose(shares, theory, atol=0.015)  # s.e. 0.005
    is_value = (data.inputs >= v_low) & (data.inputs < v_high)
    assert (is_value.sum(1) == 2 + 3).all()  # no distractor lands on a marker's value
