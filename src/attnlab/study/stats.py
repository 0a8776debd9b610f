"""Comparing a scheme with a baseline over seeds, and the statistics of a pre-registered family
of contrasts. A leaf module: numpy, scipy and the standard library only.

Design. A contrast (in a table: a cell) is one scheme against one baseline, e.g. probe=hub_key,
model=dnas vs model=unas. The two configurations run with the same seeds, so the runs pair by
seed and every test is on the per-seed differences d = scheme - baseline, which removes what the
seed does to both (data order, initialization). Results come as {seed: value} mappings (paired
by seed) or as equal-length sequences (paired by position); a pair where either run has no
finite value (a failed run), or a seed run on one side only, is left out and counted (`pair`).

`contrast` / `contrast_family` (the family of contrasts fixed before the runs: pre-registered),
each with an equivalence margin: Student-t intervals, paired effect size d_z, probability of
improvement with its bootstrap interval, paired t-test and TOST, Holm within the family; verdict
"better", "worse", "equivalent" or "inconclusive" (`VERDICTS`). attnlab.compare, attnlab.report
--baseline and attnlab.reproduce all judge with it. Around it, in leaves of their own: planning,
`attnlab.study.power` (`paired_power` / `seeds_for_power`: how many seeds a contrast needs), and
sanity, `attnlab.study.learned` (`did_learn` / `learned_test`: did a run beat its trivial
baseline).

Why Holm within a family. Each contrast alone tests at level alpha; a family of m contrasts read
together would then find a false "better" or "worse" far more often than alpha. Holm-Bonferroni
keeps the chance of any false rejection in the whole family below alpha (the family-wise error
rate), is uniformly more powerful than Bonferroni, and needs no assumption on how the contrasts
depend on one another (they share baselines and seeds). The family is the set of contrasts
pre-registered for one question, not whatever was looked at afterwards: correcting within a
family chosen after seeing the results does not control anything. `contrast_family` applies Holm
twice, separately: across the family's difference tests (a false "better"/"worse" anywhere has
probability <= alpha) and across its TOST p-values (a false "equivalent" anywhere has
probability <= alpha).

What "equivalent" means. A contrast is equivalent when the two one-sided tests (TOST) reject
both "mean(d) <= -margin" and "mean(d) >= margin" (after Holm): the data show the true mean
difference lies within ±margin, the smallest difference the study said matters, in the metric's
units. At level alpha this is the (1 - 2 alpha) paired t interval of the difference lying inside
(-margin, margin). "Equivalent" never comes from a difference test that did not reject: a test
that finds nothing says only that these seeds could not tell (too few seeds, too much noise);
that is "inconclusive". The verdict of a contrast, with adjusted p-values:
    difference p < alpha         "better" / "worse" by the sign of the mean difference and
                                 `higher_is_better` (a real difference may also lie within the
                                 margin: then tost_adjusted is small too, and it still says
                                 "better"/"worse", the finer claim being the detected difference)
    else TOST p < alpha          "equivalent"
    else                         "inconclusive"

Degenerate cases, each one defined on purpose (no 0 / 0, no NaN warnings):
    no pair at all               every statistic NaN (df 0); verdict inconclusive
    fewer than 2 paired seeds    no test (p, TOST p, intervals, d_z NaN); inconclusive
    identical results            (every difference 0, e.g. one configuration run twice)
                                 t = 0, p = 1, d_z = 0, probability of improvement 0.5, TOST p 0:
                                 "equivalent"
    a constant non-zero shift    (differences all equal, not 0) t = ±inf, p = 0 as scipy has it,
                                 d_z = ±inf; TOST p 0 if |shift| < margin else 1; "better"/"worse"
    zero spread in one sample    the t interval of its mean is (mean, mean)
"All equal" is tested exactly (x == x[0]), not as sd == 0: numpy's sd of equal floats can be
1e-16 (their mean rounds), which would make a t of 1e16 where the definition above is meant.

The probability of improvement is rliable's (Agarwal et al. 2021) for one task, with its
stratified bootstrap; rliable itself is not a dependency (rliable 1.2.0 needs arch < 8, which
fails to import with pandas 3), the definition is the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import special
from scipy import stats as _stats

BETTER, WORSE = "better", "worse"
EQUIVALENT, INCONCLUSIVE = "equivalent", "inconclusive"
VERDICTS = (BETTER, WORSE, EQUIVALENT, INCONCLUSIVE)

Values = Sequence[float] | Mapping[object, float]  # by position, or by seed


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (sample s.d. / sqrt(n)); s.e. NaN with one value."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_se of no values; pass at least one value")
    if x.size < 2:
        return float(x[0]), math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


@dataclass(frozen=True)
class TTest:
    t: float
    df: int
    p_value: float  # two-sided


def _constant(x: np.ndarray) -> bool:
    """Whether all the values are equal: the "sd 0" of the degenerate cases, tested exactly."""
    return bool(x.size) and bool(np.all(x == x[0]))


def paired_t_test(scheme: Sequence[float], baseline: Sequence[float]) -> TTest:
    """Two-sided paired t-test of mean(scheme - baseline) = 0, as scipy.stats.ttest_rel, with the
    degenerate cases of the module docstring defined instead of NaN and warnings."""
    d = np.asarray(scheme, dtype=float) - np.asarray(baseline, dtype=float)
    n = d.size
    if n < 2:
        return TTest(math.nan, max(n - 1, 0), math.nan)
    if _constant(d):  # exactly (np.std of equal values can be 1e-17, not 0)
        if d[0] == 0.0:
            return TTest(0.0, n - 1, 1.0)
        return TTest(math.copysign(math.inf, float(d[0])), n - 1, 0.0)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    t = mean / (sd / math.sqrt(n))
    # Student's t CDF from scipy.special: p = 2 * P(T_df <= -|t|)
    return TTest(t, n - 1, float(min(1.0, 2.0 * special.stdtr(n - 1, -abs(t)))))


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


def _check_level(value: float, name: str = "level") -> None:
    if not 0.0 < value < 1.0:  # NaN fails too
        example = "0.95" if name in ("level", "power") else "0.05"
        raise ValueError(f"{name} must lie strictly between 0 and 1 (got {value}); "
                         f"pass e.g. {name}={example}")


def _check_margin(margin: float, where: str = "") -> None:
    if not margin > 0.0:  # NaN fails too
        raise ValueError(
            f"margin must be > 0{where} (got {margin}): it is the smallest difference that "
            "matters, in the metric's units, within which the two count as equivalent; pass a "
            "positive margin, e.g. margin=0.01 for an accuracy"
        )


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Two-sided Student-t interval of the mean at `level`: mean ± t_{(1+level)/2, n-1} s.e., as
    scipy.stats.t.interval(level, n - 1, loc=mean, scale=sem); (NaN, NaN) with fewer than 2
    values, (mean, mean) when the values do not vary."""
    _check_level(level)
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return math.nan, math.nan
    mean = float(x.mean())
    if _constant(x):
        return mean, mean
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    low, high = _stats.t.interval(level, x.size - 1, loc=mean, scale=se)
    return float(low), float(high)


def effect_size_dz(differences: Sequence[float]) -> float:
    """Paired Cohen's d_z = mean(d) / sd(d) (sample sd, ddof 1) of the per-seed differences, signed
    like them; NaN with fewer than 2 differences; when they are all equal (sd 0), 0.0 if they
    are 0 and ±inf otherwise. The paired t statistic is d_z sqrt(n)."""
    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        return math.nan
    if _constant(d):
        return 0.0 if d[0] == 0.0 else math.copysign(math.inf, float(d[0]))
    return float(d.mean()) / float(d.std(ddof=1))


def _poi_statistic(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(A > B) + P(A = B) / 2 over all pairs, along `axis`, batched over the other axes."""
    a, b = np.moveaxis(np.asarray(a), axis, -1), np.moveaxis(np.asarray(b), axis, -1)
    x, y = a[..., :, None], b[..., None, :]
    return (x > y).mean(axis=(-2, -1)) + 0.5 * (x == y).mean(axis=(-2, -1))


def probability_of_improvement(a: Sequence[float], b: Sequence[float]) -> float:
    """P(A > B) + P(A = B) / 2 for a run A drawn from sample `a` and a run B from sample `b`,
    counted over all n m pairs (unpaired: every run of one against every run of the other):
    rliable's probability of improvement for one task, = scipy.stats.mannwhitneyu(a, b).statistic
    / (n m). 0.5 for identical samples, 1 when every run of `a` beats every run of `b`; NaN when
    either sample is empty. rliable itself is not a dependency (rliable 1.2.0 needs arch < 8,
    which fails to import with pandas 3); the definition is the same."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        return math.nan
    return float(_poi_statistic(x, y))


def probability_of_improvement_interval(
    a: Sequence[float], b: Sequence[float], level: float = 0.95, resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval at `level` of probability_of_improvement(a, b), each sample
    resampled on its own (rliable's stratified bootstrap for one task), by scipy.stats.bootstrap
    seeded with `seed` (the same seed gives the same interval); (NaN, NaN) when either sample has
    fewer than 2 values. Not a dependency on rliable (see probability_of_improvement)."""
    _check_level(level)
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return math.nan, math.nan
    result = _stats.bootstrap(
        (x, y), _poi_statistic, n_resamples=int(resamples), paired=False, vectorized=True,
        confidence_level=level, method="percentile",
        rng=np.random.Generator(np.random.PCG64(seed)),  # scipy >= 1.15 names it rng
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _tost(d: np.ndarray, margin: float) -> float:
    n = d.size
    if n < 2:
        return math.nan
    if _constant(d):
        return 0.0 if abs(float(d[0])) < margin else 1.0
    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n)
    p_low = special.stdtr(n - 1, -(mean + margin) / se)  # H0: mean <= -margin; P(T >= t_low)
    p_high = special.stdtr(n - 1, (mean - margin) / se)  # H0: mean >= margin; P(T <= t_high)
    return float(max(p_low, p_high))


def tost_paired(scheme: Sequence[float], baseline: Sequence[float], margin: float) -> float:
    """The p-value of the two one-sided paired t-tests (TOST) of equivalence within ±margin on
    d = scheme - baseline (paired by position): max(p of H0 mean(d) <= -margin, p of H0
    mean(d) >= margin), = max(scipy.stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
    ttest_1samp(d, margin, alternative="less").pvalue). Small: the mean difference lies within
    the margin. NaN with fewer than 2 pairs; with differences that do not vary, 0.0 if
    |mean| < margin else 1.0. `margin` > 0, in the metric's units."""
    _check_margin(margin)
    a, b = np.asarray(scheme, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"{a.size} scheme results and {b.size} baseline results cannot pair "
                         "by position; pair them first (attnlab.study.stats.pair)")
    return _tost(a - b, margin)


@dataclass(frozen=True)
class Contrast:
    n: int  # paired seeds used
    dropped: int  # pairs left out: a run without a finite value, or a seed run on one side only
    scheme_mean: float
    scheme_interval: tuple[float, float]  # Student-t interval of the mean at `level`
    baseline_mean: float
    baseline_interval: tuple[float, float]
    difference: float  # mean of scheme - baseline over the paired seeds
    difference_interval: tuple[float, float]  # paired t interval of the mean difference
    effect_size: float  # paired Cohen's d_z of scheme - baseline, signed like `difference`
    probability_of_improvement: float  # P(scheme better than baseline), in the metric's direction
    poi_interval: tuple[float, float]  # its stratified percentile bootstrap interval
    t: float
    df: int
    p_value: float  # two-sided paired t-test of mean difference 0
    p_adjusted: float  # after Holm across the family's difference tests (= p_value alone)
    margin: float  # equivalence margin, in the metric's units
    tost_p: float  # TOST p-value of equivalence within ±margin
    tost_adjusted: float  # after Holm across the family's TOST p-values (= tost_p alone)
    verdict: str  # BETTER | WORSE | EQUIVALENT | INCONCLUSIVE


def contrast_verdict(difference: float, p_adjusted: float, tost_adjusted: float,
                     alpha: float = 0.05, higher_is_better: bool = True) -> str:
    """BETTER / WORSE (by the sign of the mean difference scheme - baseline and the metric's
    direction) where the adjusted difference p < alpha; else EQUIVALENT where the adjusted TOST
    p < alpha; else INCONCLUSIVE (NaN p-values included). A difference test that did not reject
    is never EQUIVALENT by itself."""
    if p_adjusted < alpha and difference != 0.0:  # NaN compares False
        return BETTER if (difference > 0) == higher_is_better else WORSE
    if tost_adjusted < alpha:
        return EQUIVALENT
    return INCONCLUSIVE


def contrast(scheme: Values, baseline: Values, margin: float, alpha: float = 0.05,
             higher_is_better: bool = True, level: float = 0.95) -> Contrast:
    """One contrast, scheme vs baseline over seeds, uncorrected (p_adjusted = p_value,
    tost_adjusted = tost_p); results paired as `pair` does. Intervals at `level`, tests at
    `alpha`; `margin` > 0 is the equivalence margin in the metric's units. No pair at all:
    every statistic NaN, verdict INCONCLUSIVE."""
    _check_margin(margin)
    _check_level(alpha, "alpha")
    _check_level(level)
    a, b, dropped = pair(scheme, baseline)
    if a.size == 0:
        nan, nans = math.nan, (math.nan, math.nan)
        return Contrast(0, dropped, nan, nans, nan, nans, nan, nans, nan, nan, nans, nan, 0, nan,
                        nan, float(margin), nan, nan, INCONCLUSIVE)
    d = a - b
    test = paired_t_test(a, b)
    tost_p = _tost(d, margin)
    better, worse = (a, b) if higher_is_better else (b, a)
    difference = float(d.mean())
    return Contrast(
        n=int(a.size),
        dropped=dropped,
        scheme_mean=float(a.mean()),
        scheme_interval=t_interval(a, level),
        baseline_mean=float(b.mean()),
        baseline_interval=t_interval(b, level),
        difference=difference,
        difference_interval=t_interval(d, level),
        effect_size=effect_size_dz(d),
        probability_of_improvement=probability_of_improvement(better, worse),
        poi_interval=probability_of_improvement_interval(better, worse, level),
        t=test.t,
        df=test.df,
        p_value=test.p_value,
        p_adjusted=test.p_value,
        margin=float(margin),
        tost_p=tost_p,
        tost_adjusted=tost_p,
        verdict=contrast_verdict(difference, test.p_value, tost_p, alpha, higher_is_better),
    )


def contrast_family(cells: Mapping[str, tuple[Values, Values, float]], alpha: float = 0.05,
                    higher_is_better: bool = True, level: float = 0.95) -> dict[str, Contrast]:
    """The pre-registered family {name: (scheme results, baseline results, margin)}, one metric
    and one direction per call: each contrast as `contrast`, then Holm across the family for the
    difference tests and, separately, Holm across the family for the TOST p-values; the verdict
    from the adjusted p-values (contrast_verdict). A contrast without a test (fewer than 2 pairs)
    is not counted in either family size."""
    for name, (_, _, margin) in cells.items():
        _check_margin(margin, f" for contrast {name!r}")
    single = {name: contrast(s, b, m, alpha, higher_is_better, level)
              for name, (s, b, m) in cells.items()}
    p_adjusted = holm([c.p_value for c in single.values()])
    tost_adjusted = holm([c.tost_p for c in single.values()])
    return {
        name: replace(c, p_adjusted=p, tost_adjusted=q,
                      verdict=contrast_verdict(c.difference, p, q, alpha, higher_is_better))
        for (name, c), p, q in zip(single.items(), p_adjusted, tost_adjusted)
    }
