"""`attnlab.compare --stability` (study/compare/stability.py): Wortsman et al.'s LR sensitivity
against a hand computation, the grid (>= 7 log-spaced rates over >= 2 decades, one `lr=` each in
the dry run), the verdicts on synthetic run records whose answer is known (lower / higher /
equivalent, Holm across the pre-registered family), "mechanism not engaged" when UNAS never
spikes or diverges, a seed that did not learn leaving its contrasts, and the report's files."""

import json
import math

import numpy as np
import pytest
from helpers.paths import ROOT

from attnlab.study.compare import cli, stability
from attnlab.study.compare.stability import GATE_LABEL, NOT_ENGAGED, UNAS, StabilityPlan


def test_lr_sensitivity_is_the_mean_capped_gap_to_the_best_rate():
    # l_0 = 7: 9.0 is capped at 7, a diverged rate (inf) counts as 7, the best is 4
    assert stability.lr_sensitivity([5.0, 4.0, math.inf, 9.0], 7.0) == pytest.approx((1 + 0 + 3 + 3) / 4)
    assert stability.lr_sensitivity([4.0, 4.0, 4.0], 7.0) == 0.0  # every rate reaches the best
    assert stability.lr_sensitivity([math.nan, math.inf], 7.0) == 0.0  # nothing learned: all at l_0


@pytest.fixture(scope="module")
def plan():
    return StabilityPlan.build(ROOT, "quick")


def test_the_quick_grid_spans_two_decades_in_seven_log_spaced_rates(plan):
    rates = np.array(plan.rates)
    assert len(rates) >= 7 and rates.max() / rates.min() >= 100
    assert np.allclose(np.diff(np.log10(rates)), np.log10(rates[1] / rates[0]), atol=0.01)
    assert [a.label for a in plan.arms] == ["unas", GATE_LABEL, "sigmoid", "softpick"]
    run = plan.run(UNAS, plan.rates[0], 1)
    assert run.task == "lm" and run.extra[-1] == f"task.module.optimizer.lr={plan.rates[0]}"
    assert sum(o.split("=")[0].endswith("optimizer.lr") for o in run.extra) == 1  # the card's rate dropped


def test_dry_run_prints_one_lr_per_rate(capsys, tmp_path):
    assert cli.main(["--stability", "--quick", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("# lr=")]
    assert len(headers) == len(stability.MODES["quick"].rates) >= 7
    for rate in stability.MODES["quick"].rates:
        assert f"task.module.optimizer.lr={rate} " in out
    assert "model.gate=headwise" in out and not (tmp_path / "runs").exists()


def records(plan, loss, spikes=lambda arm, rate, seed: 0, diverged=lambda arm, rate, seed: False,
            baseline=900.0):
    """A record for every run: final val loss `loss(arm, rate_index, seed)`, l_0 = 7.0."""
    found = {}
    for arm in plan.arms:
        for i, rate in enumerate(plan.rates):
            for seed in range(1, plan.seeds + 1):
                found[plan.run(arm, rate, seed)] = {
                    "status": "ok",
                    "metrics": {"val/loss": loss(arm, i, seed), "val/baseline_ppl": baseline},
                    "stability": {"diverged": diverged(arm, i, seed), "loss_spikes": spikes(arm, i, seed),
                                  "initial_loss": 7.0}}
    return found


def bowl(extra: dict[str, float]):
    """Loss 5 at the middle rate rising by 0.3 per grid step (UNAS), plus `extra[label]` per step
    away from the middle for another arm, with a seed's jitter."""
    def loss(arm, i, seed):
        steps = abs(i - 3)
        return 5.0 + (0.3 + extra.get(arm.label, 0.0)) * steps + 0.01 * ((seed * 7 + i) % 5)
    return loss


def unas_spikes_at_the_top(arm, i, seed):
    return 3 if arm.label == "unas" and i == 6 else 0


def by_name(judged):
    return {j.name.split(" vs ")[0]: j for j in judged}


def test_lower_higher_and_equivalent_sensitivities_get_their_verdicts(plan):
    found = stability.measure(plan, records(plan, bowl({GATE_LABEL: -0.2, "softpick": 0.3}),
                                            spikes=unas_spikes_at_the_top))
    judged = by_name(stability.judge(plan, found))
    assert judged[GATE_LABEL].verdict == "lower (as predicted)"
    assert judged["softpick"].verdict == "higher (against the prediction)"
    assert judged["sigmoid"].verdict == "equivalent"
    # Holm across the three: the k-th smallest p times (4 - k), kept monotone
    names = list(judged)
    ps = np.array([judged[n].contrast.p_value for n in names])
    order = np.argsort(ps)
    steps = np.maximum.accumulate([(3 - k) * ps[i] for k, i in enumerate(order)])
    for k, i in enumerate(order):
        assert judged[names[i]].contrast.p_adjusted == pytest.approx(min(1.0, steps[k]))
    gate = judged[GATE_LABEL].contrast
    assert gate.difference < 0 and gate.n == plan.seeds
    assert all(j.family == "pre-registered" for j in judged.values())


def test_no_spike_in_unas_is_mechanism_not_engaged(plan):
    found = stability.measure(plan, records(plan, bowl({GATE_LABEL: -0.2})))
    assert not stability.engaged(found)[0]
    assert {j.verdict for j in stability.judge(plan, found)} == {NOT_ENGAGED}
    # a divergence engages it as a spike does
    diverged = records(plan, bowl({}), diverged=lambda arm, i, seed: arm.label == "unas" and i == 6 and seed == 1)
    assert stability.engaged(stability.measure(plan, diverged))[0]


def test_a_diverged_run_counts_as_the_loss_at_initialization(plan):
    found = stability.measure(plan, records(plan, bowl({}), diverged=lambda arm, i, seed: i == 6))
    unas = found["unas"][1]
    assert math.isinf(unas.losses[6]) and unas.diverged == 1
    capped = [min(x, 7.0) if math.isfinite(x) else 7.0 for x in unas.losses]
    assert unas.sensitivity == pytest.approx(np.mean(np.array(capped) - min(capped)))


def test_a_seed_that_learned_at_no_rate_leaves_its_contrasts(plan):
    def loss(arm, i, seed):  # softpick in seed 2: above the unigram loss (ln 900 = 6.80) everywhere
        return 6.9 if arm.label == "softpick" and seed == 2 else bowl({})(arm, i, seed)
    found = stability.measure(plan, records(plan, loss, spikes=unas_spikes_at_the_top))
    assert not found["softpick"][2].learned and "did not learn" in found["softpick"][2].why
    assert by_name(stability.judge(plan, found))["softpick"].contrast.n == plan.seeds - 1


def test_a_failed_run_is_named_and_its_seed_has_no_sensitivity(plan):
    found = records(plan, bowl({}))
    found[plan.run(UNAS, plan.rates[2], 1)] = {"status": "failed", "error": "ConfigError: boom"}
    seed = stability.measure(plan, found)["unas"][1]
    assert math.isnan(seed.sensitivity) and f"lr={plan.rates[2]}: ConfigError: boom" in seed.why


def test_the_command_writes_its_report_from_the_runs(plan, tmp_path, monkeypatch, capsys):
    fake = records(plan, bowl({GATE_LABEL: -0.2}), spikes=unas_spikes_at_the_top)
    monkeypatch.setattr(cli, "train", lambda runs, *args, **kw: ({r: fake[r] for r in runs}, len(runs)))
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert cli.main(["--stability", "--quick", "--wandb", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "STABILITY.md").read_text()
    assert "Mechanism engaged: UNAS over the grid: 9 loss spike(s)" in report
    assert f"| {GATE_LABEL} vs unas | pre-registered | 3 | -" in report
    saved = json.loads((tmp_path / "stability.json").read_text())  # strict JSON: no NaN, no Infinity
    assert saved["engaged"] and len(saved["rates"]) == 7
    assert (tmp_path / "lr_sensitivity.png").is_file()
    out = capsys.readouterr().out
    assert "lower (as predicted)" in out
    assert list(tmp_path.glob("wandb/offline-run-*")) and "W&B run:" in out


def test_schemes_add_exploratory_arms_and_a_non_causal_one_is_refused(capsys, tmp_path):
    plan = StabilityPlan.build(ROOT, "quick", seeds=2, schemes=["sink", "softpick"])
    assert [a.label for a in plan.exploratory] == ["sink"] and plan.seeds == 2  # softpick is registered
    assert cli.main(["--stability", "--schemes", "dnas", "--dry-run", "--out", str(tmp_path)]) == 2
    assert "model=dnas normalizes over queries" in capsys.readouterr().err
