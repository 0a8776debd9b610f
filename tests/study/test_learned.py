"""attnlab.study.learned: did a run beat its trivial baseline, by a margin (did_learn) and by
scipy's exact one-sided binomial test (learned_test)."""

import math

import pytest
from scipy import stats

from attnlab.study.learned import did_learn, learned_test


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
        (0.75, 0.5, True, 0.25, False),  # exactly at the margin (exact in binary): not beyond it
        (0.25, 0.5, False, 0.25, False),
        (math.inf, 0.25, True, 0.01, False),  # a value that is not finite never learned
        (-math.inf, 5.0, False, 0.01, False),
    ],
)
def test_did_learn_beats_the_baseline_by_more_than_the_margin(metric, baseline, higher, margin,
                                                               learned):
    assert did_learn(metric, baseline, higher_is_better=higher, margin=margin) is learned
    # higher is better unless told
    assert did_learn(0.8, 0.25) and not did_learn(0.1, 0.25)


@pytest.mark.parametrize(
    "correct, total, chance",
    [(60, 100, 0.25), (27, 100, 0.25), (33, 100, 0.25), (9, 10, 0.5), (520, 1000, 0.5)],
)
def test_learned_test_is_scipys_one_sided_binomial_test(correct, total, chance):
    p = stats.binomtest(correct, total, chance, alternative="greater").pvalue
    learned, ours = learned_test(correct, total, chance)
    assert ours == pytest.approx(p, rel=1e-12) and learned is bool(p < 0.01)


def test_learned_test_verdicts_and_degenerate_cases():
    assert learned_test(60, 100, 0.25)[0] is True
    assert learned_test(27, 100, 0.25)[0] is False
    assert learned_test(33, 100, 0.25, alpha=0.05)[0] is True  # p 0.045
    assert learned_test(33, 100, 0.25)[0] is False
    assert learned_test(1, 100, 0.0) == (True, 0.0)  # any right answer beats chance 0
    assert learned_test(1, 1, 0.5, alpha=0.5) == (False, 0.5)  # p at alpha is not below it
    with pytest.raises(ValueError, match=r"^alpha must lie strictly between 0 and 1 \(got 2\); "
                                         r"pass e.g. alpha=0.05$"):
        learned_test(1, 2, 0.5, alpha=2)
    for total, chance in [(0, 0.25), (100, 1.0), (100, -0.1), (100, math.nan)]:
        learned, p = learned_test(0, total, chance)
        assert learned is False and math.isnan(p)
    with pytest.raises(ValueError, match=r"^correct \(101\) must lie in \[0, total=100\]; pass the "
                                         r"number of right answers out of total$"):
        learned_test(101, 100, 0.25)
    assert learned_test(0, 100, 0.25) == (False, 1.0)  # no right answer is a valid count
