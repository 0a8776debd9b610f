"""attnlab.comparison_stats against scipy and hand computation on fixed numbers, and its verdicts."""

import math

import numpy as np
import pytest
from scipy import stats

from attnlab.comparison_stats import (
    BETTER,
    NO_DIFFERENCE,
    WORSE,
    bootstrap_interval,
    compare,
    compare_cells,
    did_learn,
    holm,
    mean_se,
    paired_t_test,
)

SCHEME = [0.81, 0.84, 0.79, 0.86, 0.83]
BASELINE = [0.78, 0.80, 0.79, 0.81, 0.80]


def test_mean_se_is_the_sample_sd_over_root_n():
    mean, se = mean_se([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert se == pytest.approx(stats.sem([1.0, 2.0, 4.0]))
    assert math.isnan(mean_se([3.0])[1]) and mean_se([3.0])[0] == 3.0


@pytest.mark.parametrize(
    "a, b",
    [
        (SCHEME, BASELINE),
        (BASELINE, SCHEME),
        ([1.0, 2.0, 3.0, 4.0], [1.5, 1.0, 3.5, 2.0]),
        ([10.0, 12.5], [9.0, 12.0]),
    ],
)
def test_paired_t_test_matches_scipy_ttest_rel(a, b):
    ours, theirs = paired_t_test(a, b), stats.ttest_rel(a, b)
    assert ours.t == pytest.approx(float(theirs.statistic), rel=1e-12)
    assert ours.p_value == pytest.approx(float(theirs.pvalue), rel=1e-10)
    assert ours.df == int(theirs.df)


def test_holm_by_hand():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> made monotone: 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == pytest.approx([0.02])
    adjusted = holm([0.01, math.nan, 0.02])  # NaN: not tested, not counted in m
    assert adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.02)
    assert math.isnan(adjusted[1])


def test_holm_rejects_what_the_step_down_procedure_rejects():
    # Holm at alpha = 0.05 by its definition: reject the smallest while p_(i) <= alpha / (m - i + 1)
    p = [0.008, 0.03, 0.009, 0.2, 0.011]
    rejected_by_steps = set()
    for i, index in enumerate(np.argsort(p)):
        if p[index] > 0.05 / (len(p) - i):
            break
        rejected_by_steps.add(int(index))
    adjusted = holm(p)
    assert {i for i, q in enumerate(adjusted) if q <= 0.05} == rejected_by_steps == {0, 2, 4}


def test_a_clear_improvement_is_better_and_its_mirror_worse():
    up = compare(SCHEME, BASELINE)
    assert up.verdict == BETTER and up.n == 5 and up.difference == pytest.approx(0.03)
    assert up.interval[0] > 0 and up.interval[1] < 0.1
    assert compare(BASELINE, SCHEME).verdict == WORSE
    # a loss: lower is better
    assert compare(BASELINE, SCHEME, higher_is_better=False).verdict == BETTER


def test_identical_configurations_show_no_difference():
    runs = {1: 0.8125, 2: 0.79, 3: 0.8333}
    same = compare(runs, dict(runs))
    assert same.verdict == NO_DIFFERENCE
    assert same.p_value == 1.0 and same.t == 0.0 and same.difference == 0.0
    assert same.interval == (0.0, 0.0)
    table = compare_cells({"coverage": (runs, dict(runs)), "recall": (SCHEME, BASELINE)})
    assert table["coverage"].verdict == NO_DIFFERENCE and table["coverage"].p_adjusted == 1.0


def test_fewer_than_two_seeds_give_no_test():
    one = compare([0.9], [0.1])
    assert one.verdict == NO_DIFFERENCE and math.isnan(one.p_value) and one.n == 1
    assert math.isnan(one.interval[0])
    none = compare({1: 0.9}, {2: 0.1})  # no seed in common
    assert none.verdict == NO_DIFFERENCE and none.n == 0 and none.dropped == 2


def test_pairs_by_seed_and_drops_failed_runs():
    c = compare({3: 0.7, 1: 0.9, 2: math.nan, 4: 0.5}, {1: 0.8, 2: 0.1, 3: 0.65, 4: 0.45})
    assert c.n == 3 and c.dropped == 1
    assert c.t == pytest.approx(float(stats.ttest_rel([0.9, 0.7, 0.5], [0.8, 0.65, 0.45]).statistic))
    with pytest.raises(ValueError, match="cannot pair"):
        compare([1.0, 2.0], [1.0])


def test_a_constant_shift_follows_scipy():
    test = paired_t_test([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
    assert test.t == math.inf and test.p_value == 0.0


def test_holm_changes_the_verdict_of_a_marginal_cell():
    # the marginal cell alone is better at 0.05; among 4 cells Holm withholds it
    marginal = ([0.80, 0.82, 0.81, 0.84], [0.79, 0.80, 0.80, 0.81])
    alone = compare(*marginal)
    assert 0.01 < alone.p_value < 0.05 and alone.verdict == BETTER
    noise = ([0.5, 0.6, 0.4, 0.5], [0.55, 0.5, 0.45, 0.5])
    table = compare_cells({"a": marginal, "b": noise, "c": noise, "d": noise})
    assert table["a"].p_adjusted == pytest.approx(min(1.0, 4 * alone.p_value))
    assert table["a"].verdict == NO_DIFFERENCE


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    d = [0.03, 0.04, 0.0, 0.05, 0.03]
    low, high = bootstrap_interval(d)
    assert (low, high) == bootstrap_interval(d)
    assert low <= np.mean(d) <= high and low >= min(d) and high <= max(d)


@pytest.mark.parametrize(
    "metric, baseline, higher, margin, learned",
    [
        (0.80, 0.25, True, 0.01, True),  # far above chance
        (0.255, 0.25, True, 0.01, False),  # within the margin: noise, not learning
        (0.2601, 0.25, True, 0.01, True),  # just past the margin
        (0.10, 0.25, True, 0.01, False),  # below chance
        (3.0, 5.0, False, 0.01, True),  # lower is better (perplexity): below the unigram's
        (4.995, 5.0, False, 0.01, False),
        (5.5, 5.0, False, 0.01, False),
        (0.30, 0.25, True, 0.1, False),  # a wider margin asks for more
        (math.nan, 0.25, True, 0.01, False),  # a failed run did not learn
        (0.9, math.nan, True, 0.01, False),  # no baseline logged: cannot say it learned
    ],
)
def test_did_learn_beats_the_baseline_by_more_than_the_margin(metric, baseline, higher, margin,
                                                               learned):
    assert did_learn(metric, baseline, higher_is_better=higher, margin=margin) is learned
