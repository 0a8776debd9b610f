"""Did a run learn: the sanity check before any contrast. A run that did not learn is a warning
in a report, never a result, and enters no verdict. A leaf, like `attnlab.study.stats`: scipy,
the standard library and stats' argument check only.

`did_learn` decides whether a run beat its task's trivial baseline (the card's `baseline` key)
by a margin (attnlab.reproduce); `learned_test` decides it for an accuracy by an exact binomial
test on the test set's answers (attnlab.compare).
"""

from __future__ import annotations

import math

from scipy import stats as _stats

from attnlab.study.stats import _check_level

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


def learned_test(correct: int, total: int, chance: float, alpha: float = 0.01
                 ) -> tuple[bool, float]:
    """Whether a run beat its trivial baseline by an exact test: the one-sided binomial test of
    `correct` right answers out of `total` against accuracy `chance` (scipy.stats.binomtest,
    alternative "greater"); returns (p < alpha, p). (False, NaN) when there is nothing to test:
    total 0, or chance outside [0, 1). Treats answers as independent (examples, not seeds)."""
    _check_level(alpha, "alpha")
    if total == 0 or not 0.0 <= chance < 1.0:
        return False, math.nan
    if not 0 <= correct <= total:
        raise ValueError(f"correct ({correct}) must lie in [0, total={total}]; pass the number of "
                         "right answers out of total")
    p = float(_stats.binomtest(int(correct), int(total), float(chance),
                               alternative="greater").pvalue)
    return p < alpha, p
