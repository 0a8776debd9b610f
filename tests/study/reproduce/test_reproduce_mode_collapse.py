"""Mode collapse (DNAS paper App. E): the 1-D closed forms against the library's attention on the
toy, and the cluster counts of the 2-D experiment."""

import math

import numpy as np
import pytest
import torch

from attnlab.study.reproduce import mode_collapse as mc


@pytest.mark.parametrize("a", [0.5, 1.0, 1.5])
@pytest.mark.parametrize("n0", [10, 30, 200])
def test_closed_forms_equal_the_simulated_one_d_toy(a, n0):
    for scheme, formula in (("unas", mc.unas_distance_ratio), ("dnas", mc.dnas_distance_ratio)):
        simulated = mc.simulated_distance_ratio(n0, 10, a, scheme)
        assert simulated == pytest.approx(float(formula(n0 / 10, a)), abs=1e-12)


def test_closed_forms_by_hand():
    # r = 1: both schemes move each cluster to a tanh(a^2): d'/d = tanh(a^2)
    assert mc.unas_distance_ratio(1.0, 1.0) == pytest.approx(math.tanh(1.0))
    assert mc.dnas_distance_ratio(1.0, 1.0) == pytest.approx(math.tanh(1.0))
    # r = 3, a = 1, E = e^2: UNAS query at +1 weighs the clusters 3e : 1/e, at -1 3/e : e
    e = math.e
    up = (3 * e - 1 / e) / (3 * e + 1 / e)
    down = (3 / e - e) / (3 / e + e)
    assert mc.unas_distance_ratio(3.0, 1.0) == pytest.approx((up - down) / 2)
    # DNAS = UNAS at r_eff = r (r + E) / (r E + 1)
    E = math.exp(2.0)
    assert mc.dnas_distance_ratio(3.0, 1.0) == pytest.approx(mc.unas_distance_ratio(3 * (3 + E) / (3 * E + 1), 1.0))
    # DNAS keeps the centres at least as far apart as UNAS, strictly for r > 1
    r = np.logspace(0.1, 2, 20)
    assert (mc.dnas_distance_ratio(r, 1.0) > mc.unas_distance_ratio(r, 1.0)).all()


def test_the_one_d_comparison_reports_its_worst_difference():
    rows, worst = mc.one_d_comparison()
    assert len(rows) == 2 * len(mc.A_VALUES) * len(mc.SIM_N0)
    assert worst == max(abs(r["closed"] - r["simulated"]) for r in rows)
    assert worst < 1e-9


def test_count_clusters_rule():
    gen = torch.Generator().manual_seed(1)
    blob = 0.1 * torch.randn(200, 2, generator=gen, dtype=torch.float64)
    assert mc.count_clusters(blob) == 1
    assert mc.count_clusters(torch.cat([blob, blob + 3.0])) == 2
    # a straggler group smaller than min_samples is noise, not a cluster
    assert mc.count_clusters(torch.cat([blob, blob[:3] + 5.0])) == 1
    # two groups that touch (gap below eps) are one
    assert mc.count_clusters(torch.cat([blob, blob + torch.tensor([0.2, 0.0], dtype=torch.float64)])) == 1


@pytest.mark.parametrize("setting, scheme, clusters", [
    ("imbalanced", "unas", 1), ("imbalanced", "dnas", 2), ("balanced", "unas", 2), ("balanced", "dnas", 2)])
def test_two_d_experiment_after_four_steps(setting, scheme, clusters):
    n0, n1 = mc.SETTINGS[setting]
    steps = mc.attention_steps(mc.toy_points(n0, n1), scheme)
    assert len(steps) == mc.STEPS + 1
    assert mc.count_clusters(steps[0]) == 2
    assert mc.count_clusters(steps[-1]) == clusters
