"""The sink, outlier and low-bit claims (reproduce/outliers.py and its three claims) on synthetic
run records whose answer is known: the runs they ask for (every arm scored quantized at the end);
"not tested: premise absent" when UNAS has no sink (with the measured rate) and tested when it
has; the kurtosis family's verdicts; the low-bit drop judged in the direction the kurtosis
decides (flipped when the baseline's kurtosis is the lower), premise absent without a kurtosis
verdict or without a drop; the kurtosis premise never enters the low-bit verdict."""

import re

import pytest
from helpers.paths import ROOT

from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED
from attnlab.study.reproduce import length, lowbit_kurtosis, outliers, sinks_gate, sinks_softpick
from attnlab.study.reproduce.outliers import DROP, GATE, KURTOSIS, SINK, SINK_RATE, SOFTPICK, UNAS
from attnlab.study.reproduce.plan import Plan
from attnlab.study.reproduce.registry import claims
from attnlab.study.reproduce.results import Results

ARMS = (UNAS, SOFTPICK, SINK, GATE)
LEARNED = {"val/ppl": 300.0, "val/baseline_ppl": 900.0}


@pytest.fixture(scope="module")
def plan():
    return Plan("quick", ROOT, tasks=("lm",))


def jitter(seed: int) -> float:
    return 0.01 * ((seed * 7) % 5 - 2)  # -0.02 .. +0.02, a different value per seed


def results_for(plan, values, seeds=range(1, 5)) -> Results:
    """Records of every arm x seed: values[arm] = {metric: mean}, each with a seed's jitter."""
    results = Results(plan.cards)
    for arm in ARMS:
        for seed in seeds:
            metrics = dict(LEARNED)
            for metric, mean in values[arm].items():
                scale = 0.01 if metric in (DROP, SINK_RATE) else 1.0  # shares and drops: a small spread
                metrics[metric] = mean + scale * jitter(seed + ARMS.index(arm))
            results.add(length.run(plan, "lm", (), arm, seed, outliers.RUN_EXTRA),
                        {"status": "ok", "metrics": metrics, "run_dir": "/nowhere"})
    return results


def values(sink_rates=(0.6, 0.1, 0.1, 0.2), kurtoses=(6.0, 3.2, 3.3, 6.0), drops=(-0.2, -0.05, -0.05, -0.2)):
    """By arm (UNAS, softpick, sink, gate): sink rate, kurtosis and w4a8 drop."""
    return {arm: {SINK_RATE: r, KURTOSIS: k, DROP: d}
            for arm, r, k, d in zip(ARMS, sink_rates, kurtoses, drops)}


def test_the_claims_are_registered_and_the_lm_runs_score_quantized(plan):
    known = claims(ROOT / "conf")
    for claim in (sinks_softpick, sinks_gate, lowbit_kurtosis):
        assert known[claim.NAME] is claim
        runs = claim.runs(plan)
        assert runs and all(r.task == "lm" and "quant=w4a8" in r.extra for r in runs)
        assert {r.seed for r in runs} == set(range(1, length.PILOT["quick"] + 1))
    # the three claims share their runs: the arms are trained once
    together = {r for c in (sinks_softpick, sinks_gate, lowbit_kurtosis) for r in c.runs(plan)}
    assert {(r.model, "model.gate=headwise" in r.extra) for r in together} == {
        ("unas", False), ("softpick", False), ("sink", False), ("unas", True)}


def test_no_sink_in_unas_is_premise_absent_with_the_measured_rate(plan, tmp_path):
    results = results_for(plan, values(sink_rates=(0.004, 0.0, 0.001, 0.002)))
    result = sinks_softpick.evaluate(plan, results, tmp_path)
    assert result.verdict == NOT_TESTED
    assert re.search(r"premise absent: UNAS's sink rate is 0\.00\d \(Gu et al.'s eps 0.3, mean over 3 seed", result.reason)
    assert "kurtosis" not in result.reason  # the kurtosis family held: it is not the reason
    gate = sinks_gate.evaluate(plan, results, tmp_path)
    assert gate.verdict == NOT_TESTED and "premise absent" in gate.reason


def test_with_a_sink_in_unas_the_sink_rate_and_kurtosis_are_judged(plan, tmp_path):
    result = sinks_softpick.evaluate(plan, results_for(plan, values()), tmp_path)
    assert result.verdict == HOLDS, result.reason
    assert re.search(r"softpick vs unas: diagnostics/sink_rate: 0\.\d+ vs 0\.\d+, -0\.[45]\d\d \[", result.ours)
    assert "Pre-registered" in result.details and "| **holds** |" in result.details
    assert "metric diagnostics/sink_rate (share of heads), lower is better" in result.details
    gate = sinks_gate.evaluate(plan, results_for(plan, values()), tmp_path)
    assert gate.verdict == HOLDS
    # the gate that leaves the sink where it was: equivalent within 5 % of the heads
    same = sinks_gate.evaluate(plan, results_for(plan, values(sink_rates=(0.6, 0.1, 0.1, 0.6))), tmp_path)
    assert same.verdict == CONTRADICTED and "equivalent within the margin" in same.reason


def test_a_higher_kurtosis_contradicts_the_softpick_claim(plan, tmp_path):
    result = sinks_softpick.evaluate(plan, results_for(plan, values(kurtoses=(3.2, 6.0, 3.3, 6.0))), tmp_path)
    assert result.verdict == CONTRADICTED
    assert result.reason.startswith("softpick vs unas: diagnostics/kurtosis: +")


def test_the_lower_kurtosis_has_the_smaller_drop(plan, tmp_path):
    result = lowbit_kurtosis.evaluate(plan, results_for(plan, values()), tmp_path)
    # softpick and sink: lower kurtosis and smaller drop (holds); the gate's kurtosis equals
    # UNAS's (equivalent): its drop pair has no premise
    assert result.verdict == NOT_TESTED, result.reason
    assert "premise absent: the kurtosis of unas, gate=headwise and unas does not differ" in result.reason
    assert re.search(r"softpick vs unas: test/loss@w4a8/drop: -0\.0\d+ vs -0\.2\d+, [^;]*\(holds\)", result.ours)
    assert "(a premise: not part of the verdict)" in result.details


def test_a_baseline_with_the_lower_kurtosis_flips_the_prediction(plan, tmp_path):
    # softpick's kurtosis above UNAS's: UNAS is predicted to lose less. Softpick losing more holds;
    # softpick losing less contradicts
    kurtoses = (3.2, 6.0, 3.3, 6.0)
    holds = lowbit_kurtosis.evaluate(plan, results_for(plan, values(kurtoses=kurtoses, drops=(-0.05, -0.2, -0.2, -0.2))), tmp_path)
    assert re.search(r"softpick vs unas: test/loss@w4a8/drop: -0\.2\d+ vs -0\.0\d+, [^;]*\(holds\)", holds.ours)
    assert "softpick vs unas" not in holds.reason
    against = lowbit_kurtosis.evaluate(plan, results_for(plan, values(kurtoses=kurtoses)), tmp_path)
    assert against.verdict == CONTRADICTED
    assert "the baseline has the lower kurtosis but not the smaller drop" in against.reason


def test_no_drop_to_reduce_is_premise_absent(plan, tmp_path):
    result = lowbit_kurtosis.evaluate(plan, results_for(plan, values(drops=(-0.002, -0.001, -0.001, -0.002))), tmp_path)
    assert result.verdict == NOT_TESTED
    assert "no drop to reduce" in result.reason and "below 0.01" in result.reason


def test_not_run_says_why(tmp_path):
    plan = Plan("quick", ROOT)  # --quick without --tasks lm: the lm runs are not trained
    result = sinks_gate.evaluate(plan, Results(plan.cards), tmp_path)
    assert result.verdict == NOT_TESTED and result.reason.startswith("lm: not run (--quick trains")
