"""Comparing a scheme with a baseline over seeds: mean ± s.e., a paired t-test, a bootstrap
interval, Holm's correction across the cells of a table, and a verdict in words.

A cell is one comparison (e.g. probe=coverage, model=dnas vs model=unas): the two configurations
run with the same seeds, so the runs pair by seed and the test is on the per-seed differences
(scheme - baseline), which removes what the seed does to both (data order, initialization).
A table tests many cells at once; Holm-Bonferroni keeps the chance of any false "better" or
"worse" in the whole table below `alpha` (uniformly more powerful than Bonferroni, and valid
without assumptions on how the cells depend on one another).

The verdict is "better", "worse" or "no difference detected", never "equal": a test that finds
nothing says only that these seeds could not tell. Degenerate cases, each one on purpose:
    fewer than 2 paired seeds    no test (p NaN): "no difference detected"
    identical results            (every difference 0, e.g. one configuration run twice)
                                 t = 0, p = 1: "no difference detected", never 0 / 0
    a constant non-zero shift    (differences all equal, not 0) t = ±inf, p = 0, as scipy has it
Pairs where either run has no finite value (a failed run) are left out, and counted.

`did_learn` decides whether a run beat its task's trivial baseline (the card's `baseline` key):
a run that did not is a warning in a report, never a result, and enters no verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import special

BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no difference detected"
VERDICTS = (BETTER, WORSE, NO_DIFFERENCE)

Values = Sequence[float] | Mapping[object, float]  # by position, or by seed


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (sample s.d. / sqrt(n)); s.e. NaN with one value."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_se of no values; pass at least one value")
    if x.size < 2:
        return float(x[0]), math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


# How much a run must beat its trivial baseline by to count as having learned: a run within this
# of the baseline (e.g. accuracy 0.251 against chance 0.25 on a few hundred examples) is noise.
DID_LEARN_MARGIN = 0.01


def did_learn(metric: float, baseline: float, higher_is_better: bool = True,
              margin: float = DID_LEARN_MARGIN) -> bool:
    """Whether a run's optimized metric beats the task's trivial baseline (majority class, chance,
    unigram, lead...) by more than `margin`, in the metric's units and direction. The one place
    that decides "did not learn": such a run is shown as a warning, never as a result, and enters
    no verdict. A missing value (NaN: a failed run, or no baseline logged) did not learn."""
    if not (math.isfinite(metric) and math.isfinite(baseline)):
        return False
    return metric > baseline + margin if higher_is_better else metric < baseline - margin


@dataclass(frozen=True)
class TTest:
    t: float
    df: int
    p_value: float  # two-sided


def paired_t_test(scheme: Sequence[float], baseline: Sequence[float]) -> TTest:
    """Two-sided paired t-test of mean(scheme - baseline) = 0, as scipy.stats.ttest_rel, with the
    degenerate cases of the module docstring defined instead of NaN and warnings."""
    d = np.asarray(scheme, dtype=float) - np.asarray(baseline, dtype=float)
    n = d.size
    if n < 2:
        return TTest(math.nan, max(n - 1, 0), math.nan)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        if mean == 0.0:
            return TTest(0.0, n - 1, 1.0)
        return TTest(math.copysign(math.inf, mean), n - 1, 0.0)
    t = mean / (sd / math.sqrt(n))
    # Student's t CDF from scipy.special: p = 2 * P(T_df <= -|t|)
    return TTest(t, n - 1, float(min(1.0, 2.0 * special.stdtr(n - 1, -abs(t)))))


def bootstrap_interval(
    differences: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean difference (seeds resampled with replacement);
    NaN with fewer than 2 differences. Rough with few seeds: the t-test decides the verdict."""
    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        return math.nan, math.nan
    rng = np.random.Generator(np.random.PCG64(seed))
    means = d[rng.integers(0, d.size, size=(int(resamples), d.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order: the i-th smallest of m p-values is
    multiplied by m - i + 1, then made non-decreasing, capped at 1. A NaN (no test) stays NaN and
    is not counted in m. Reject at level alpha where the adjusted p-value is below alpha."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, math.nan)
    tested = np.flatnonzero(~np.isnan(p))
    m = tested.size
    running = 0.0
    for rank, index in enumerate(tested[np.argsort(p[tested], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * float(p[index])))
        adjusted[index] = running
    return adjusted.tolist()


def verdict(difference: float, p_value: float, alpha: float = 0.05,
            higher_is_better: bool = True) -> str:
    """"better" / "worse" where the (adjusted) p-value is below alpha, by the sign of the mean
    difference scheme - baseline; otherwise "no difference detected" (NaN p included)."""
    if math.isnan(p_value) or p_value >= alpha or difference == 0.0:
        return NO_DIFFERENCE
    return BETTER if (difference > 0) == higher_is_better else WORSE


@dataclass(frozen=True)
class Comparison:
    n: int  # paired seeds used
    dropped: int  # pairs left out: a run without a finite value, or a seed run on one side only
    scheme_mean: float
    scheme_se: float
    baseline_mean: float
    baseline_se: float
    difference: float  # mean of scheme - baseline over the paired seeds
    difference_se: float
    t: float
    df: int
    p_value: float  # the cell's own paired t-test
    p_adjusted: float  # after Holm across the table's cells (= p_value for one cell)
    interval: tuple[float, float]  # bootstrap (1 - alpha) interval of the difference
    verdict: str


def pair(scheme: Values, baseline: Values) -> tuple[np.ndarray, np.ndarray, int]:
    """The two results paired by seed (mappings) or by position (sequences of equal length),
    pairs with a non-finite value left out; returns (scheme, baseline, number left out)."""
    if isinstance(scheme, Mapping) != isinstance(baseline, Mapping):
        raise TypeError("pass both results as {seed: value} mappings or both as sequences")
    if isinstance(scheme, Mapping):
        seeds = [s for s in scheme if s in baseline]
        unmatched = len(scheme) + len(baseline) - 2 * len(seeds)
        a = np.array([scheme[s] for s in seeds], dtype=float)
        b = np.array([baseline[s] for s in seeds], dtype=float)
    else:
        if len(scheme) != len(baseline):
            raise ValueError(
                f"{len(scheme)} scheme results and {len(baseline)} baseline results cannot pair "
                "by position; pass {seed: value} mappings to pair them by seed"
            )
        unmatched = 0
        a, b = np.asarray(scheme, dtype=float), np.asarray(baseline, dtype=float)
    finite = np.isfinite(a) & np.isfinite(b)
    return a[finite], b[finite], unmatched + int((~finite).sum())


def compare(scheme: Values, baseline: Values, alpha: float = 0.05, higher_is_better: bool = True,
            bootstrap_seed: int = 0) -> Comparison:
    """One cell: scheme vs baseline over seeds, uncorrected (Holm over one test is the test)."""
    a, b, dropped = pair(scheme, baseline)
    if a.size == 0:
        nan = math.nan
        return Comparison(0, dropped, nan, nan, nan, nan, nan, nan, nan, 0, nan, nan, (nan, nan),
                          NO_DIFFERENCE)
    d = a - b
    test = paired_t_test(a, b)
    difference, difference_se = mean_se(d)
    return Comparison(
        n=int(a.size),
        dropped=dropped,
        scheme_mean=mean_se(a)[0],
        scheme_se=mean_se(a)[1],
        baseline_mean=mean_se(b)[0],
        baseline_se=mean_se(b)[1],
        difference=difference,
        difference_se=difference_se,
        t=test.t,
        df=test.df,
        p_value=test.p_value,
        p_adjusted=test.p_value,
        interval=bootstrap_interval(d, 1.0 - alpha, seed=bootstrap_seed),
        verdict=verdict(difference, test.p_value, alpha, higher_is_better),
    )


def compare_cells(cells: Mapping[str, tuple[Values, Values]], alpha: float = 0.05,
                  higher_is_better: bool = True) -> dict[str, Comparison]:
    """Every cell {name: (scheme results, baseline results)} compared, its verdict from the
    Holm-adjusted p-value across all the cells (one metric, one direction per call)."""
    single = {name: compare(s, b, alpha, higher_is_better) for name, (s, b) in cells.items()}
    adjusted = holm([c.p_value for c in single.values()])
    return {
        name: replace(c, p_adjusted=p,
                      verdict=verdict(c.difference, p, alpha, higher_is_better))
        for (name, c), p in zip(single.items(), adjusted)
    }
