"""The probe generators: determinism by seed, the optional fields' invariants, labels and
shortcuts recomputed by brute force on small cases, and the trivial baselines' scores against
theory on large samples. The generic tests run on every generator at its defaults (discovered:
a new generator is covered with no edit here) and on option variants of particular ones. The
mechanism probes' labels (unmatched, hub, assignment) are checked in
test_mechanism_generators.py; the contract every probe config keeps, in test_probe_contract.py."""

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage

from tasks.probe.data import IGNORE, PAD, REGRESSION, SEQUENCE_CLASS, TOKEN_CLASS, score
from tasks.probe.generators import GENERATORS, clusters, listops, recall, retrieval

# option variants of particular generators: case -> (generator, options)
VARIANTS = {
    "recall_dup_distract": ("recall", {"num_duplicates": 2, "num_distractors": 3}),
    "clusters_centre": ("clusters", {"target": "centre"}),
    "retrieval_distract": ("retrieval", {"num_value_distractors": 3}),
    "retrieval_focus": ("retrieval", {"num_value_distractors": 2, "focus_fraction": 0.5,
                                      "focus_rows": 30}),
    "unmatched_keyonly": ("unmatched", {"a_queries": False}),
    "unmatched_disjoint": ("unmatched", {"disjoint": True}),
    "unmatched_noaux": ("unmatched", {"aux_target": False}),
    "hub_some": ("hub", {"hub_queries": 6}),
    "hub_every": ("hub", {"hub_queries": 8, "ask_every_key": True}),
    "hub_zipf": ("hub", {"popularity": "zipf"}),
    "hub_zipf_every": ("hub", {"popularity": "zipf", "ask_every_key": True}),
    "assignment_none": ("assignment", {"collisions": 0.0}),
    "assignment_nearest": ("assignment", {"target": "nearest", "collisions": 0.25}),
}
# every generator at its defaults, then the variants
CASES = {**{name: (name, {}) for name in GENERATORS}, **VARIANTS}
OPTIONAL = ("shortcut_features", "aux_targets", "key_only", "query_only", "slots")


def make(case: str, n: int, seed: int):
    name, options = CASES[case]
    return GENERATORS[name](n, seed, **options)


def tensors(data) -> list[torch.Tensor]:
    extra = [v for v in data.meta.values() if isinstance(v, torch.Tensor)]
    optional = [getattr(data, name) for name in OPTIONAL if getattr(data, name) is not None]
    if data.shortcut is not None:
        optional.append(data.shortcut.predictions)
    return [data.inputs, data.targets, data.padding_mask, data.baseline.predictions, *extra,
            *optional]


@pytest.mark.parametrize("case", CASES)
def test_same_seed_same_data_other_seed_other_data(case):
    a, b, c = make(case, 40, 3), make(case, 40, 3), make(case, 40, 4)
    assert len(tensors(a)) == len(tensors(b))
    for x, y in zip(tensors(a), tensors(b)):
        assert torch.equal(x, y)
    assert a.baseline.score == b.baseline.score
    for name in OPTIONAL:  # set or unset alike
        unset = [getattr(x, name) is None for x in (a, b, c)]
        assert unset[0] == unset[1] == unset[2]
    assert (a.shortcut is None) == (c.shortcut is None)
    if a.shortcut is not None:
        assert a.shortcut.score == b.shortcut.score and a.shortcut.name == b.shortcut.name
    assert not torch.equal(a.inputs, c.inputs)
    assert not torch.equal(a.targets, c.targets)


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


@pytest.mark.parametrize("case", CASES)
def test_optional_fields_keep_their_invariants(case):
    data = make(case, 40, 1)
    n, length = data.inputs.shape[:2]
    padding = data.padding_mask
    if data.target_kind != REGRESSION:  # every class probe brings a shortcut, a rule or features
        assert data.shortcut is not None or data.shortcut_features is not None
    asked = data.targets != IGNORE
    if data.shortcut is not None:
        predictions = data.shortcut.predictions
        assert predictions.shape == data.targets.shape and predictions.dtype == torch.long
        assert torch.equal(predictions == IGNORE, ~asked)  # IGNORE exactly where nothing is asked
        assert predictions[asked].min() >= 0 and predictions[asked].max() < data.num_classes
        assert data.shortcut.score == score(data.target_kind, predictions, data.targets)
        assert data.shortcut.name and "\n" not in data.shortcut.name
    if data.shortcut_features is not None:
        features = data.shortcut_features
        assert features.dtype == torch.float32 and features.shape[0] == n and features.ndim == 2
        assert torch.isfinite(features).all()
    if data.aux_targets is not None:
        aux = data.aux_targets
        assert aux.shape == (n, length) and aux.dtype == torch.long
        trained = aux != IGNORE
        assert trained.any()
        assert aux[trained].min() >= 0 and aux[trained].max() < data.num_classes
        assert not (trained & padding).any()
        if data.target_kind == TOKEN_CLASS:
            assert not (trained & asked).any()
        else:  # the sequence's answer is read at position 0
            assert not trained[:, 0].any()
    roles = [r for r in (data.key_only, data.query_only) if r is not None]
    for role in roles:
        assert role.shape == (n, length) and role.dtype == torch.bool
        assert not (role & padding).any()
    if len(roles) == 2:
        assert not (data.key_only & data.query_only).any()
    if data.key_only is not None and data.target_kind == TOKEN_CLASS:  # a key-only asks nothing
        assert not (data.key_only & asked).any()
        if data.aux_targets is not None:
            assert not (data.key_only & (data.aux_targets != IGNORE)).any()
    if data.slots is not None:
        assert data.slots.shape == (n, length) and data.slots.dtype == torch.long
        assert data.slots.min() >= -1 and (data.slots[padding] == -1).all()


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


@pytest.mark.parametrize("options", [{}, {"num_duplicates": 3, "num_distractors": 2}])
def test_recall_filler_holds_no_key_or_value_of_its_row(options):
    data = recall.generate(30, 2, seq_len=40, vocab_size=40, num_kv_pairs=4, **options)
    context = data.meta["context_length"]
    for row, labels in zip(data.inputs.tolist(), data.targets.tolist()):
        bound = set(row[:context])  # the row's keys and values
        filler = [t for q, t in enumerate(row) if q >= context and labels[q] == IGNORE]
        assert len(filler) == 40 - context - 4
        assert all(t != PAD and t not in bound for t in filler)
    # every free token is used: the filler is not a fixed subset
    assert len({t for row in data.inputs[:, context:].tolist() for t in row}) > 20


@pytest.mark.parametrize("options", [{}, {"num_duplicates": 3, "num_distractors": 2}])
def test_recall_first_binding_shortcut_by_brute_force(options):
    data = recall.generate(30, 4, seq_len=32, vocab_size=40, num_kv_pairs=4, **options)
    context = data.meta["context_length"]
    expected = torch.full_like(data.targets, IGNORE)
    for i, row in enumerate(data.inputs.tolist()):
        for q in range(context, len(row)):
            if data.targets[i, q] != IGNORE:
                first = next(j for j in range(0, context, 2) if row[j] == row[q])
                expected[i, q] = row[first + 1]
    assert torch.equal(data.shortcut.predictions, expected)
    asked = data.targets != IGNORE
    right = float((expected[asked] == data.targets[asked]).double().mean())
    assert data.shortcut.score == right == data.shortcut.theory  # exact: fixed counts per row
    assert data.shortcut.theory == 1 - options.get("num_duplicates", 0) / 4


def test_retrieval_focus_rows_vary_only_the_first_slot():
    data = retrieval.generate(60, 3, seq_len=20, num_slots=3, num_values=5,
                              num_value_distractors=2, focus_fraction=0.5, focus_rows=40)
    (m_low, _), (v_low, _) = data.meta["markers"], data.meta["values"]
    focus = data.meta["focus"].tolist()
    assert sum(focus[:40]) == 20 and not any(focus[40:])
    values = []
    for row, target in zip(data.inputs.tolist(), data.targets.tolist()):
        slot_values = [row[row.index(m_low + h) + 1] - v_low for h in range(3)]
        assert target == sum(v * 5**h for h, v in enumerate(slot_values))
        values.append(slot_values)
    assert data.meta["slot_values"].tolist() == values
    assert all(v[1:] == [0, 0] for v, f in zip(values, focus) if f)
    others = [v[1:] for v, f in zip(values, focus) if not f]
    assert any(v != [0, 0] for v in others)  # the other rows vary every slot
    assert len({v[0] for v, f in zip(values, focus) if f}) > 1  # slot 1 still varies
    # focus_fraction=0 is the plain probe, draw for draw
    plain = retrieval.generate(60, 3, seq_len=20, num_slots=3, num_values=5,
                               num_value_distractors=2)
    zero = retrieval.generate(60, 3, seq_len=20, num_slots=3, num_values=5,
                              num_value_distractors=2, focus_fraction=0.0, focus_rows=40)
    for a, b in [(plain.inputs, zero.inputs), (plain.targets, zero.targets),
                 (plain.baseline.predictions, zero.baseline.predictions)]:
        assert torch.equal(a, b)


def test_retrieval_slots_and_in_order_shortcut_by_brute_force():
    data = retrieval.generate(40, 5, seq_len=16, num_slots=3, num_values=4,
                              num_value_distractors=2)
    (m_low, _), (v_low, v_high) = data.meta["markers"], data.meta["values"]
    expected = []
    for row, slots in zip(data.inputs.tolist(), data.slots.tolist()):
        want = [-1] * len(row)
        for h in range(3):
            where = row.index(m_low + h)
            want[where] = want[where + 1] = h
        assert slots == want
        first = [t - v_low for t in row if v_low <= t < v_high][:3]
        expected.append(sum(v * 4**h for h, v in enumerate(first)))
    assert data.shortcut.predictions.tolist() == expected
    right = sum(e == t for e, t in zip(expected, data.targets.tolist())) / 40
    assert data.shortcut.score == pytest.approx(right)


def test_cluster_shortcut_features_by_brute_force():
    data = clusters.generate(20, 6, target="count", dim=3)
    assert data.shortcut is None and data.shortcut_features.shape == (20, 2 + 6 + 3)
    for points, features in zip(data.inputs.double().numpy(),
                                data.shortcut_features.double().numpy()):
        mean = points.mean(axis=0)
        second = sum(np.outer(x, x) for x in points) / len(points)
        upper = [second[i, j] for i in range(3) for j in range(i, 3)]
        spread = np.mean([np.sum((x - mean) ** 2) for x in points])
        eigen = np.sort(np.linalg.eigvalsh(np.cov(points.T, bias=True)))
        expected = [np.linalg.norm(mean), *upper, spread, *eigen]
        np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-6)
    assert clusters.generate(5, 6, target="centre").shortcut_features is None


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


def test_listops_top_operator_shortcut_by_a_separate_evaluator():
    data = listops.generate(150, 8, seq_len=32, min_length=1, max_depth=3, max_args=5)
    ops = {listops.OPERATOR0 + i: name for i, name in enumerate(listops.OPERATORS)}
    rules = {"MIN": min, "MAX": max, "MED": lambda a: int(np.median(a)),
             "SM": lambda a: sum(a) % 10}
    expected = []
    for row in data.inputs.tolist():
        tokens = [t for t in row[1:] if t != PAD]
        digits = [t - listops.DIGIT0 for t in tokens if t not in ops and t != listops.END]
        expected.append(rules[ops[tokens[0]]](digits) if tokens[0] in ops else digits[0])
    assert (data.meta["lengths"] == 1).any()  # bare digits are their own value
    assert data.shortcut.predictions.tolist() == expected
    right = sum(e == t for e, t in zip(expected, data.targets.tolist())) / 150
    assert data.shortcut.score == pytest.approx(right) and data.shortcut.theory is None
    assert 0.3 < right < 0.9  # the nesting matters, often but not always


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
        ("clusters", {"target": "radius"}, "use one of"),
        ("retrieval", {"seq_len": 4}, "pass seq_len >= 5"),
        ("listops", {"min_length": 80}, "min_length=80"),
        ("recall", {"vocab_size": 17}, "leaves no filler token"),
        ("retrieval", {"focus_fraction": 2.0}, "focus_fraction=2.0"),
        ("retrieval", {"focus_rows": 11}, "focus_rows=11"),
        ("unmatched", {"object_vocab": 4}, "pass object_vocab >= 5"),
        ("unmatched", {"object_vocab": 8, "disjoint": True}, "pass object_vocab >= 9"),
        ("unmatched", {"num_colours": 0}, "pass a positive num_colours"),
        ("hub", {"num_pairs": 4, "num_queries": 8, "hub_queries": 2}, "pass hub_queries >= 5"),
        ("hub", {"hub_queries": 0}, "hub_queries=0"),
        ("hub", {"key_vocab": 10}, "key_vocab >= num_pairs=24"),
        ("hub", {"popularity": "uniform"}, "use one of"),
        ("hub", {"popularity": "zipf", "zipf_exponent": -1.0}, "zipf_exponent=-1.0"),
        ("assignment", {"collisions": 1.0}, "pass collisions <= 0.875"),
        ("assignment", {"collisions": -0.5}, "pass 0..1"),
        ("assignment", {"positions": 4}, "pass positions >= num_items=8"),
        ("assignment", {"target": "farthest"}, "use one of"),
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
