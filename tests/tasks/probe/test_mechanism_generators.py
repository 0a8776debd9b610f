"""The mechanism probes (unmatched, hub, assignment): labels, roles, auxiliary targets and
shortcuts recomputed by brute-force Python loops on small cases, the exact shortcut theories
against enumeration and large samples, and the generators' speed. Determinism by seed and the
optional fields' shared invariants are in test_generators.py (its CASES)."""

import itertools
import time
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from tasks.probe.data import IGNORE, PAD, plurality_share, rng_for
from tasks.probe.generators import GENERATORS, assignment, hub, unmatched

# ---- unmatched ------------------------------------------------------------------------------

SMALL = {"num_objects": 3, "object_vocab": 9, "num_colours": 4}


def unmatched_rows(data, k: int):
    """Each row parsed by position: A's (object, colour) pairs, B's, in the data's token ids."""
    (a0, _), (b0, _), (c0, _) = (data.meta[r] for r in ("a_objects", "b_objects", "colours"))
    b_start = data.meta["b_start"]
    assert b_start == 2 * k + 2 and data.inputs.shape[1] == 4 * k + 4
    for row in data.inputs.tolist():
        assert row[0] == unmatched.CLS and row[2 * k + 1] == unmatched.SEP
        a = [(row[1 + 2 * i] - a0, row[2 + 2 * i] - c0) for i in range(k)]
        b = [(row[b_start + 2 * j], row[b_start + 2 * j + 1] - c0) for j in range(k + 1)]
        b = [("MARK" if t == unmatched.MARK else t - b0, colour) for t, colour in b]
        yield a, b


def plurality_rule(colours: list[int]) -> int:
    counts = Counter(colours)
    return min(c for c in counts if counts[c] == max(counts.values()))


def test_unmatched_target_is_the_colour_of_the_object_a_lacks():
    k = SMALL["num_objects"]
    data = unmatched.generate(30, 1, **SMALL)
    aux = data.aux_targets.tolist()
    assert data.key_only is None and data.query_only is None
    for i, (a, b) in enumerate(unmatched_rows(data, k)):
        a_objects, b_objects = [o for o, _ in a], [o for o, _ in b]
        assert len(set(a_objects)) == k and len(set(b_objects)) == k + 1
        assert all(0 <= o < 9 for o in b_objects) and all(0 <= c < 4 for _, c in a + b)
        missing = [j for j, o in enumerate(b_objects) if o not in a_objects]
        assert len(missing) == 1  # B = A plus one object
        assert data.targets[i] == b[missing[0]][1]
        assert data.meta["extra_position"][i] == data.meta["b_start"] + 2 * missing[0]
        for q in range(data.inputs.shape[1]):  # aux: at A's objects, the mirror's colour in B
            if 1 <= q <= 2 * k and q % 2 == 1:
                mirror = b_objects.index(a_objects[(q - 1) // 2])
                assert aux[i][q] == b[mirror][1]
            else:
                assert aux[i][q] == IGNORE
    # A's colour of an object is its own draw, not B's: they disagree often
    pairs = [(ca, dict(b)[o]) for a, b in unmatched_rows(data, k) for o, ca in a]
    assert sum(x != y for x, y in pairs) > len(pairs) / 2


def test_unmatched_disjoint_reads_the_colour_after_mark():
    k = SMALL["num_objects"]
    data = unmatched.generate(30, 2, **SMALL, disjoint=True)
    assert data.aux_targets is None
    where = Counter()
    for i, (a, b) in enumerate(unmatched_rows(data, k)):
        marked = [j for j, (o, _) in enumerate(b) if o == "MARK"]
        assert len(marked) == 1
        b_objects = [o for o, _ in b if o != "MARK"]
        assert not set(b_objects) & {o for o, _ in a}  # B shares no object with A
        assert len(set(b_objects)) == k
        assert data.targets[i] == b[marked[0]][1]
        assert data.meta["extra_position"][i] == data.meta["b_start"] + 2 * marked[0]
        assert data.inputs[i].tolist().count(unmatched.MARK) == 1
        where[marked[0]] += 1
    assert len(where) > 1  # MARK moves


def test_unmatched_without_a_queries_makes_a_key_only_and_drops_aux():
    k = SMALL["num_objects"]
    plain = unmatched.generate(30, 3, **SMALL)
    control = unmatched.generate(30, 3, **SMALL, a_queries=False)
    assert torch.equal(plain.inputs, control.inputs)  # the same task, only the roles change
    assert torch.equal(plain.targets, control.targets)
    assert control.aux_targets is None and control.query_only is None
    expected = [1 <= q <= 2 * k for q in range(4 * k + 4)]
    assert all(row == expected for row in control.key_only.tolist())
    assert unmatched.generate(5, 3, **SMALL, aux_target=False).aux_targets is None


@pytest.mark.parametrize("disjoint", [False, True])
def test_unmatched_plurality_shortcut_by_brute_force(disjoint):
    k = SMALL["num_objects"]
    data = unmatched.generate(30, 4, **SMALL, disjoint=disjoint)
    expected = [plurality_rule([c for _, c in b]) for _, b in unmatched_rows(data, k)]
    assert data.shortcut.predictions.tolist() == expected
    right = sum(e == t for e, t in zip(expected, data.targets.tolist())) / 30
    assert data.shortcut.score == pytest.approx(right)


@pytest.mark.parametrize("entries, classes", [(1, 3), (3, 3), (4, 2), (5, 4)])
def test_plurality_share_by_enumeration(entries, classes):
    right = total = 0
    for colours in itertools.product(range(classes), repeat=entries):
        right += plurality_rule(list(colours)) == colours[0]
        total += 1
    assert plurality_share(entries, classes) == pytest.approx(right / total, abs=1e-12)


def test_unmatched_shortcut_and_chance_against_theory():
    data = unmatched.generate(20000, 0)
    assert data.shortcut.theory == pytest.approx(plurality_share(5, 8))
    assert data.shortcut.score == pytest.approx(data.shortcut.theory, abs=0.012)  # s.e. 0.0034
    assert data.baseline.theory == 1 / 8
    assert data.baseline.score == pytest.approx(1 / 8, abs=0.01)  # s.e. 0.0023
    assert torch.allclose(torch.bincount(data.targets, minlength=8) / 20000,
                          torch.full((8,), 1 / 8), atol=0.01)


# ---- hub ------------------------------------------------------------------------------------

HUB = {"num_pairs": 6, "num_queries": 5, "key_vocab": 8, "value_vocab": 5}


def hub_rows(data, pairs: int):
    """Each row's context as {key token: value index}, and its query positions' tokens."""
    (k0, k1), (v0, v1) = data.meta["key_range"], data.meta["value_range"]
    for row in data.inputs.tolist():
        keys, values = row[0 : 2 * pairs : 2], row[1 : 2 * pairs : 2]
        assert all(k0 <= k < k1 for k in keys) and all(v0 <= v < v1 for v in values)
        assert len(set(keys)) == pairs
        yield dict(zip(keys, [v - v0 for v in values])), row


def check_hub_labels(data, pairs: int, scored: int):
    context = 2 * pairs
    asked_counts = []
    for i, (bindings, row) in enumerate(hub_rows(data, pairs)):
        labels, demand = data.targets[i].tolist(), data.meta["demand"][i].tolist()
        asked = [row[q] for q in range(context, context + scored)]
        counts = Counter(asked)
        for q in range(len(row)):
            if context <= q < context + scored:
                assert labels[q] == bindings[row[q]] and demand[q] == counts[row[q]]
            else:
                assert labels[q] == IGNORE and demand[q] == 0
        asked_counts.append(counts)
        # roles: cross-attention from the queries to the context
        assert data.key_only[i].tolist() == [q < context for q in range(len(row))]
        assert data.query_only[i].tolist() == [q >= context and row[q] != PAD
                                               for q in range(len(row))]
    return asked_counts


def test_hub_queries_ask_the_hub_and_distinct_others():
    data = hub.generate(30, 1, **HUB, hub_queries=3)
    assert data.inputs.shape[1] == 12 + 5 and not data.padding_mask.any()
    counts = check_hub_labels(data, 6, 5)
    for i, c in enumerate(counts):
        hub_key = int(data.meta["hub_key"][i])
        assert c[hub_key] == 3 and sorted(c.values()) == [1, 1, 3]
    assert data.aux_targets is None
    # the hub moves in the context
    hubs = data.meta["hub_key"].tolist()
    hub_slots = {data.inputs[i, :12].tolist().index(hubs[i]) for i in range(30)}
    assert len(hub_slots) > 2


@pytest.mark.parametrize("exponent", [1.0, 0.0])
def test_hub_zipf_labels_and_demand(exponent):
    data = hub.generate(30, 2, **HUB, popularity="zipf", zipf_exponent=exponent)
    check_hub_labels(data, 6, 5)
    assert (data.meta["hub_key"] == -1).all()


def test_hub_zipf_exponent_sets_the_popularity():
    steep = hub.generate(50, 3, **HUB, popularity="zipf", zipf_exponent=60.0)
    assert (steep.meta["demand"][:, 12:] == 5).all()  # rank 1 takes every query
    flat = hub.generate(4000, 3, **HUB, popularity="zipf", zipf_exponent=0.0)
    queries = flat.inputs[:, 12:]
    same = float((queries[:, 0] == queries[:, 1]).double().mean())
    assert same == pytest.approx(1 / 6, abs=0.02)  # uniform over the six keys; s.e. 0.006
    mild = hub.generate(4000, 3, **HUB, popularity="zipf", zipf_exponent=1.0)
    # p(rank r) ~ 1/r over 6 keys: two queries agree with probability sum p_r^2
    weights = [1 / r for r in range(1, 7)]
    agree = sum((w / sum(weights)) ** 2 for w in weights)
    same = float((mild.inputs[:, 12] == mild.inputs[:, 13]).double().mean())
    assert same == pytest.approx(agree, abs=0.025)


@pytest.mark.parametrize("options", [{"hub_queries": 3}, {"popularity": "zipf"}])
def test_hub_ask_every_key_covers_every_key_once_more(options):
    plain = hub.generate(30, 4, **HUB, **options)
    data = hub.generate(30, 4, **HUB, **options, ask_every_key=True)
    scored = 5
    assert torch.equal(data.inputs[:, : 12 + scored], plain.inputs)  # scored queries unchanged
    assert torch.equal(data.targets[:, : 12 + scored], plain.targets)
    assert data.inputs.shape[1] == 12 + scored + (6 - 3 if "hub_queries" in options else 5)
    assert torch.equal(data.padding_mask, data.inputs == PAD)
    check_hub_labels(data, 6, scored)
    for i, (bindings, row) in enumerate(hub_rows(data, 6)):
        aux = data.aux_targets[i].tolist()
        scored_keys = set(row[12 : 12 + scored])
        extra = [q for q in range(12 + scored, len(row)) if row[q] != PAD]
        assert all(row[q] == PAD for q in range(12 + scored + len(extra), len(row)))  # tail pad
        extra_keys = [row[q] for q in extra]
        assert len(set(extra_keys)) == len(extra_keys)  # each unasked key once
        assert set(extra_keys) == set(bindings) - scored_keys  # every key asked
        assert all(aux[q] == bindings[row[q]] for q in extra)
        assert all(aux[q] == IGNORE for q in range(len(row)) if q not in extra)
    if "popularity" in options:
        assert data.padding_mask.any()  # the extra count varies by row


def test_hub_shortcut_by_brute_force():
    data = hub.generate(30, 5, **HUB, popularity="zipf")
    expected = torch.full_like(data.targets, IGNORE)
    for i, (bindings, row) in enumerate(hub_rows(data, 6)):
        common = plurality_rule(list(bindings.values()))
        expected[i, 12:17] = common
    assert torch.equal(data.shortcut.predictions, expected)
    asked = data.targets != IGNORE
    right = float((expected[asked] == data.targets[asked]).double().mean())
    assert data.shortcut.score == pytest.approx(right)


def test_hub_chance_and_shortcut_against_theory():
    data = hub.generate(6000, 0, hub_queries=1)  # 16 distinct asked pairs per row
    assert data.baseline.theory == pytest.approx(1 / 24 + (23 / 24) / 32)
    assert data.baseline.score == pytest.approx(data.baseline.theory, abs=0.008)  # s.e. 0.0009
    assert data.shortcut.theory == pytest.approx(plurality_share(24, 32))
    assert data.shortcut.score == pytest.approx(data.shortcut.theory, abs=0.015)


# ---- assignment -----------------------------------------------------------------------------


def assignment_rows(data, num: int, cells: int):
    """Each row's keys (cell, colour) and queries (slot, cell), parsed from the tokens."""
    (q0, _), (k0, _), (c0, _) = (data.meta[r] for r in ("queries", "keys", "colours"))
    for row in data.inputs.tolist():
        keys = [(row[2 * i] - k0, row[2 * i + 1] - c0) for i in range(num)]
        queries = [(2 * num + j, row[2 * num + j] - q0) for j in range(num)]
        assert all(0 <= x < cells for x, _ in keys) and all(0 <= x < cells for _, x in queries)
        yield keys, queries


@pytest.mark.parametrize("collisions, colliding", [(0.0, 0), (0.25, 2), (0.5, 4), (0.75, 6)])
def test_assignment_matches_by_rank_with_exact_collisions(collisions, colliding):
    num, cells = 8, 32
    data = assignment.generate(30, 6, collisions=collisions)
    nearest_data = assignment.generate(30, 6, collisions=collisions, target="nearest")
    assert torch.equal(data.inputs, nearest_data.inputs)  # the target changes nothing else
    for i, (keys, queries) in enumerate(assignment_rows(data, num, cells)):
        assert len({x for x, _ in keys}) == num and len({x for _, x in queries}) == num
        by_rank = sorted(keys)
        query_rank = {slot: r for r, (_, slot) in enumerate(sorted((x, s) for s, x in queries))}
        found = 0
        for slot, x in queries:
            matched = by_rank[query_rank[slot]]
            dists = [abs(x - k) for k, _ in keys]
            nearest = min((k for k, _ in keys), key=lambda k: (abs(x - k), k))
            collides = abs(x - matched[0]) > min(dists)
            found += collides
            assert dists.count(min(dists)) == 1  # no query between two equally near keys
            assert bool(data.meta["collides"][i, slot]) == collides
            assert data.targets[i, slot] == matched[1]
            assert nearest_data.targets[i, slot] == dict(keys)[nearest]
            assert data.shortcut.predictions[i, slot] == dict(keys)[nearest]
        assert found == colliding  # exactly round(collisions * num_items) in every row
        assert (data.targets[i, : 2 * num] == IGNORE).all()
        assert not data.meta["collides"][i, : 2 * num].any()
    assert data.key_only[:, : 2 * num].all() and not data.key_only[:, 2 * num :].any()
    assert torch.equal(data.query_only, ~data.key_only)
    assert (nearest_data.shortcut.predictions == nearest_data.targets).all()


def test_assignment_small_case_and_uniform_collision_ranks():
    data = assignment.generate(30, 7, num_items=5, positions=12, num_colours=3, collisions=0.4)
    for i, (keys, queries) in enumerate(assignment_rows(data, 5, 12)):
        matched = dict(zip(sorted(x for _, x in queries), sorted(keys)))
        collide = [abs(x - matched[x][0]) > min(abs(x - k) for k, _ in keys) for _, x in queries]
        assert sum(collide) == 2
        labels = [data.targets[i, s].item() for s, _ in queries]
        assert labels == [matched[x][1] for _, x in queries]
    big = assignment.generate(6000, 1, collisions=0.25)
    # which ranks collide is uniform, the end ranks included: each in a quarter of the rows
    queries = big.inputs[:, 16:]
    ranks = queries.argsort(dim=1).argsort(dim=1)
    per_rank = torch.zeros(8)
    per_rank.index_add_(0, ranks[big.meta["collides"][:, 16:]], torch.ones(12000))
    assert torch.allclose(per_rank / 6000, torch.full((8,), 0.25), atol=0.02)  # s.e. 0.0056


def test_assignment_queries_are_uniform_among_the_valid_placements():
    """The DP sampler against enumeration: keys 1 5 9 of 12 cells, rank 1 colliding."""
    keys = np.array([[1, 5, 9]])
    collide = np.array([[False, True, False]])
    allowed = assignment._allowed(keys, collide, 12)
    valid = []
    for q in itertools.combinations(range(12), 3):  # increasing: q[r] has rank r
        dists = [[abs(x - k) for k in keys[0]] for x in q]
        if any(d.count(min(d)) > 1 for d in dists):
            continue  # a cell with two nearest keys
        if all((d[r] > min(d)) == collide[0, r] for r, d in enumerate(dists)):
            valid.append(q)
    assert len(valid) > 10
    queries, ok = assignment._sample_queries(rng_for(0), np.repeat(allowed, 200 * len(valid), 0))
    assert ok.all()
    counts = Counter(map(tuple, queries.tolist()))
    assert set(counts) == set(valid)
    assert stats.chisquare(list(counts.values())).pvalue > 1e-3  # ~200 each: uniform
    none = np.array([[True, True, True]])  # every rank colliding: impossible
    assert not assignment._sample_queries(rng_for(0), assignment._allowed(keys, none, 12))[1][0]


def test_assignment_shortcut_and_chance_against_theory():
    data = assignment.generate(6000, 0, collisions=0.5)
    assert data.shortcut.theory == 1 - 0.5 + 0.5 / 8
    assert data.shortcut.score == pytest.approx(data.shortcut.theory, abs=0.01)  # s.e. 0.002
    assert data.baseline.theory == 1 / 8
    assert data.baseline.score == pytest.approx(1 / 8, abs=0.01)
    rounded = assignment.generate(50, 0, collisions=0.3)  # round(2.4): 2 of 8 collide
    assert (rounded.meta["collides"].sum(dim=1) == 2).all()
    assert rounded.meta["num_colliding"] == 2
    assert rounded.shortcut.theory == 1 - 0.25 + 0.25 / 8
    nearest = assignment.generate(500, 0, collisions=0.5, target="nearest")
    assert nearest.shortcut.score == nearest.shortcut.theory == 1.0


# ---- speed: the datamodule draws every split in one call ------------------------------------


@pytest.mark.parametrize("probe, options", [
    ("unmatched", {}), ("hub", {}), ("hub", {"popularity": "zipf", "ask_every_key": True}),
    ("assignment", {"collisions": 0.0}), ("assignment", {"collisions": 0.25}),
    ("assignment", {"collisions": 0.5}),
])
def test_generators_draw_6000_rows_quickly(probe, options):
    start = time.perf_counter()
    GENERATORS[probe](6000, 0, **options)
    assert time.perf_counter() - start < 2.0  # well under 1 s on an idle core


@pytest.mark.parametrize("name, options", [
    ("unmatched", {}), ("unmatched", {"disjoint": True}), ("hub", {}), ("hub", {"hub_queries": 3}),
    ("hub", {"popularity": "zipf", "ask_every_key": True}), ("assignment", {}),
    ("assignment", {"target": "nearest", "collisions": 0.25})])
def test_read_at_points_at_the_entry_whose_value_is_the_answer(name, options):
    """Brute force: the token right after the entry an answer is read from is that answer's value
    (colour or value token), at every asked position and nowhere else."""
    from tasks.probe.generators import GENERATORS

    data = GENERATORS[name](40, 5, **options)
    low = (data.meta.get("value_range") or data.meta["colours"])[0]
    for row, labels, read in zip(data.inputs.tolist(), data.targets.reshape(40, -1).tolist(),
                                 data.read_at.tolist()):
        asked = [0] if data.target_kind == "sequence_class" else [
            q for q, label in enumerate(labels) if label != -100]
        assert [q for q, k in enumerate(read) if k >= 0] == asked
        for q, label in zip(asked, [labels[0]] if data.target_kind == "sequence_class"
                            else [labels[q] for q in asked]):
            assert row[read[q] + 1] - low == label
