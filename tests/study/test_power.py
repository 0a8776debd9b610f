"""attnlab.study.power: the paired t-test's power against Monte-Carlo simulation and G*Power,
its degenerate cases, and the seeds a contrast needs."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from attnlab.study.power import paired_power, seeds_for_power


def _simulated_power(n, effect, sd, alpha, trials=20_000, seed=0):
    """Share of 20,000 simulated paired experiments (a seed effect common to both runs, noise on
    each) whose scipy paired t-test rejects at alpha."""
    rng = np.random.Generator(np.random.PCG64(seed))
    common = rng.normal(0.0, 1.0, size=(trials, n))
    noise = sd / math.sqrt(2.0)  # the difference of two runs' noise has sd `sd`
    scheme = 0.8 + common + effect + rng.normal(0.0, noise, size=(trials, n))
    baseline = 0.8 + common + rng.normal(0.0, noise, size=(trials, n))
    return float(np.mean(stats.ttest_rel(scheme, baseline, axis=1).pvalue < alpha))


@pytest.mark.parametrize(
    "n, effect, sd, alpha",
    [(10, 1.0, 1.0, 0.05), (5, 0.03, 0.02, 0.05), (15, -0.4, 1.0, 0.05), (8, 0.02, 0.01, 0.01),
     (6, 0.0, 1.0, 0.05)],
)
def test_paired_power_matches_a_monte_carlo_simulation(n, effect, sd, alpha):
    assert paired_power(n, effect, sd, alpha) == pytest.approx(
        _simulated_power(n, effect, sd, alpha), abs=0.01)


def test_paired_power_degenerate_cases():
    assert paired_power(1, 1.0, 1.0) == 0.0
    assert paired_power(5, 0.1, 0.0) == 1.0 and paired_power(5, 0.0, 0.0) == 0.05
    assert paired_power(12, 0.0, 1.0) == pytest.approx(0.05)  # no effect: power is alpha
    assert paired_power(12, 0.5, 1.0) == pytest.approx(paired_power(12, -0.5, 1.0))
    # either value missing: no power, not 1
    assert math.isnan(paired_power(5, math.nan, 1.0)) and math.isnan(paired_power(5, 0.5, math.nan))
    with pytest.raises(ValueError, match=r"^sd must be >= 0 \(got -1.0\); pass the sd of the "
                                         r"per-seed differences$"):
        paired_power(5, 0.5, -1.0)
    with pytest.raises(ValueError, match=r"^alpha must lie strictly between 0 and 1 \(got 0.0\); "
                                         r"pass e.g. alpha=0.05$"):
        paired_power(5, 0.5, 1.0, alpha=0.0)


@pytest.mark.parametrize("d_z, seeds", [(0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_for_power_reproduces_g_power(d_z, seeds):
    # G*Power, paired t-test (difference between two dependent means), two-sided alpha 0.05,
    # power 0.8: d_z 0.5 -> 34, 0.8 -> 15, 1.0 -> 10; in the metric's units or in sd units alike
    assert seeds_for_power(d_z, 1.0) == seeds
    assert seeds_for_power(0.02 * d_z, 0.02) == seeds
    assert paired_power(seeds, d_z, 1.0) >= 0.8 > paired_power(seeds - 1, d_z, 1.0)


def test_seeds_for_power_bounds():
    assert seeds_for_power(0.1, 1.0) == 200 and paired_power(200, 0.1, 1.0) < 0.8  # unreachable
    assert seeds_for_power(0.5, 1.0, maximum=20) == 20
    assert seeds_for_power(3.0, 1.0) == 4  # the smallest n with power >= 0.8
    assert seeds_for_power(3.0, 1.0, minimum=6) == 6
    assert seeds_for_power(0.01, 0.0) == 2  # no noise: two seeds tell
    exactly = paired_power(10, 1.0, 1.0)  # a power reached exactly counts (>=)
    assert seeds_for_power(1.0, 1.0, power=exactly) == 10
    with pytest.raises(ValueError, match="effect and sd"):
        seeds_for_power(math.nan, 1.0)
    # a bad level names the argument the caller gave, with a value that works
    with pytest.raises(ValueError, match=r"^alpha must lie strictly between 0 and 1 \(got 1.5\); "
                                         r"pass e.g. alpha=0.05$"):
        seeds_for_power(0.5, 1.0, alpha=1.5)
    with pytest.raises(ValueError, match=r"^power must lie strictly between 0 and 1 \(got 1.0\); "
                                         r"pass e.g. power=0.95$"):
        seeds_for_power(0.5, 1.0, power=1.0)
    with pytest.raises(ValueError, match=r"pass the smallest difference worth detecting and the sd "
                                         r"of the per-seed differences \(e.g. from a pilot"):
        seeds_for_power(0.5, -1.0)
    with pytest.raises(ValueError, match=r"^maximum \(5\) is below minimum \(6\); pass maximum >= "
                                         r"minimum >= 2$"):
        seeds_for_power(3.0, 1.0, minimum=6, maximum=5)
    # the search runs up to maximum itself, and no further
    assert seeds_for_power(3.0, 1.0, minimum=6, maximum=6) == 6
    assert seeds_for_power(3.0, 1.0, maximum=5) == 4 and seeds_for_power(3.0, 1.0, maximum=3) == 3
    # no noise and no effect: the test rejects at rate alpha whatever n, so power is reached at
    # once or never (reached exactly counts)
    assert seeds_for_power(0.0, 0.0) == 200
    assert seeds_for_power(0.0, 0.0, alpha=0.5, power=0.5) == 2




def test_paired_power_rises_with_the_seeds_where_scipys_far_tail_is_nan():
    """At a large noncentrality scipy's noncentral t gives NaN for the far tail (n = 8 here); the
    power must still rise with n (a NaN summed in once read as power 1.0 at n = 8, 0.97 at 9),
    match a Monte-Carlo simulation, and not depend on the effect's sign."""
    alpha, effect, sd = 0.05 / 22, 0.05, 0.0214
    powers = [paired_power(n, effect, sd, alpha) for n in range(4, 14)]
    assert all(b >= a for a, b in itertools.pairwise(powers)) and powers[-1] <= 1.0
    rng = np.random.Generator(np.random.PCG64(0))
    d = rng.normal(effect, sd, size=(40_000, 8))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(8))
    simulated = float((np.abs(t) > stats.t.ppf(1 - alpha / 2, 7)).mean())
    assert paired_power(8, effect, sd, alpha) == pytest.approx(simulated, abs=0.01)
    assert paired_power(8, -effect, sd, alpha) == pytest.approx(paired_power(8, effect, sd, alpha))
    assert seeds_for_power(effect, sd, alpha) == 8
