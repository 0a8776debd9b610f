"""Planning a contrast: the power of the paired t-test, and how many seeds a contrast needs to
detect a given difference (attnlab.compare's seeds from a pilot's spread). A leaf, like
`attnlab.study.stats` (the test it plans for): numpy, scipy, the standard library and stats'
argument check only.

Degenerate cases, each defined on purpose: fewer than 2 pairs has no test (power 0.0, and
`seeds_for_power`'s minimum is 2); when the differences do not vary (sd 0) the test rejects for
any non-zero effect (power 1.0) and at rate alpha for none; a NaN effect or sd has no power (NaN,
not 1).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _stats

from attnlab.study.stats import _check_level


def _power(n: np.ndarray, effect: float, sd: float, alpha: float) -> np.ndarray:
    """paired_power for an array of n >= 2 with sd > 0. The two-sided power is symmetric in the
    effect's sign, so the noncentrality is taken positive: the far tail is then tiny, and scipy's
    noncentral t returns NaN for it at large noncentralities (n = 8, nc 6.6), which counts as 0
    (a NaN would otherwise turn the sum into NaN, and min(1, NaN) into 1)."""
    df = n - 1.0
    nc = abs(effect) / (sd / np.sqrt(n))
    c = _stats.t.ppf(1.0 - alpha / 2.0, df)
    near = _stats.nct.sf(c, df, nc)
    far = np.nan_to_num(_stats.nct.cdf(-c, df, nc), nan=0.0)
    return near + far


def paired_power(n: int, effect: float, sd: float, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test at level `alpha` with `n` pairs when the true mean
    difference is `effect` and the sd of the differences is `sd` (so d_z = effect / sd): the
    noncentral t with df n - 1 and noncentrality effect / (sd / sqrt(n)) beyond ±t_{1-alpha/2,
    n-1}. 0.0 for n < 2 (no test); for sd 0, 1.0 if effect != 0 else alpha; NaN for a NaN effect
    or sd."""
    _check_level(alpha, "alpha")
    if n < 2:
        return 0.0
    if math.isnan(effect) or math.isnan(sd):
        return math.nan
    if sd < 0.0:
        raise ValueError(f"sd must be >= 0 (got {sd}); pass the sd of the per-seed differences")
    if sd == 0.0:
        return 1.0 if effect != 0.0 else alpha
    return float(min(1.0, _power(np.asarray(float(n)), effect, sd, alpha)))


def seeds_for_power(effect: float, sd: float, alpha: float = 0.05, power: float = 0.8,
                    minimum: int = 2, maximum: int = 200) -> int:
    """The smallest number of paired seeds n in [minimum, maximum] with
    paired_power(n, effect, sd, alpha) >= power; `maximum` when none reaches it (report then the
    power at maximum, paired_power(maximum, ...)). G*Power's paired t-test, two-sided alpha 0.05,
    power 0.8: d_z 0.5 -> 34 seeds, 0.8 -> 15, 1.0 -> 10."""
    _check_level(alpha, "alpha")
    _check_level(power, "power")
    if not (math.isfinite(effect) and math.isfinite(sd) and sd >= 0.0):
        raise ValueError(f"effect and sd must be finite, sd >= 0 (got effect={effect}, sd={sd}); "
                         "pass the smallest difference worth detecting and the sd of the "
                         "per-seed differences (e.g. from a pilot with a few seeds)")
    minimum = max(int(minimum), 2)  # no test with fewer than 2 pairs
    if int(maximum) < minimum:
        raise ValueError(f"maximum ({maximum}) is below minimum ({minimum}); pass maximum >= "
                         "minimum >= 2")
    if sd == 0.0:
        return minimum if paired_power(minimum, effect, sd, alpha) >= power else int(maximum)
    n = np.arange(minimum, int(maximum) + 1, dtype=float)
    reached = np.flatnonzero(_power(n, effect, sd, alpha) >= power)
    return int(n[reached[0]]) if reached.size else int(maximum)
