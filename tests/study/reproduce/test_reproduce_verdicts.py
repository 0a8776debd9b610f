"""Each claim's verdict logic: holds, contradicted, or not tested with its reason, on synthetic
evidence whose answer is known; a claim whose logic is inverted fails here."""

import math

import pytest
from helpers.paths import ROOT

from attnlab.study import stats
from attnlab.study.compare.analysis import ProbeCheck
from attnlab.study.compare.probes import ContrastSpec
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED, ClaimResult
from attnlab.study.reproduce import (
    explaining_away,
    head_diversity,
    hnas_u,
    mode_collapse,
    probe_evidence,
)
from attnlab.study.reproduce.plan import Plan
from attnlab.study.reproduce.results import Results

SPEC = ContrastSpec("dnas", "unas", "better")


def check(tests: bool) -> ProbeCheck:
    return ProbeCheck("p", 0.4, 1.0, False, "breaks" if tests else "does not break", "", "ties", tests)


def evidence(scheme: list[float], against: list[float], tests: bool = True) -> probe_evidence.Evidence:
    family = stats.contrast_family({SPEC.name: (scheme, against, 0.03)})
    return probe_evidence.Evidence("p", {}, family, check(tests), [], len(scheme))


@pytest.mark.parametrize("scheme, against, tests, verdict, reason", [
    ([0.99, 1.0, 0.98, 1.0], [0.40, 0.38, 0.39, 0.41], True, HOLDS, ""),
    ([0.40, 0.38, 0.39, 0.41], [0.99, 1.0, 0.98, 1.0], True, CONTRADICTED, ""),
    ([0.70, 0.71, 0.70, 0.69], [0.70, 0.70, 0.71, 0.70], True, CONTRADICTED, ""),  # equivalent
    ([0.9, 0.5, 0.8, 0.4], [0.6, 0.7, 0.5, 0.6], True, NOT_TESTED, "underpowered"),
    ([0.99, 1.0, 0.98, 1.0], [0.40, 0.38, 0.39, 0.41], False, NOT_TESTED, "mechanism not engaged"),
    ([0.9, 0.5, 0.8, 0.4], [0.6, 0.7, 0.5, 0.6], False, NOT_TESTED, "mechanism not engaged"),
])
def test_a_probe_contrast_is_judged_by_its_direction_power_and_mechanism(scheme, against, tests,
                                                                        verdict, reason):
    got, why = evidence(scheme, against, tests).verdict(SPEC)
    assert got == verdict and reason in why
    if got == NOT_TESTED and c_inconclusive(scheme, against):
        assert "underpowered" in why and "[" in why and "4 seeds" in why  # interval and seeds


def test_an_opposite_result_on_a_probe_the_shortcut_solves_is_not_tested():
    shortcut = ProbeCheck("p", 0.99, 0.99, True, "breaks", "", "ties", False)
    family = stats.contrast_family({SPEC.name: ([0.40, 0.38, 0.39, 0.41], [0.99, 1.0, 0.98, 1.0], 0.03)})
    got, why = probe_evidence.Evidence("p", {}, family, shortcut, [], 4).verdict(SPEC)
    assert got == NOT_TESTED and "the shortcut (0.990) reaches" in why


def test_a_contrast_predicted_worse_and_a_single_seed_are_judged_too():
    worse = ContrastSpec("dnas", "unas", "worse")
    high, low = [0.99, 1.0, 0.98, 1.0], [0.40, 0.38, 0.39, 0.41]
    for scheme, against, verdict in ((low, high, HOLDS), (high, low, CONTRADICTED)):
        family = stats.contrast_family({worse.name: (scheme, against, 0.03)})
        assert probe_evidence.Evidence("p", {}, family, check(True), [], 4).verdict(worse) == (verdict, "")
    # one finished pair has no test: underpowered over 1 seed, not "no finished pair"
    got, why = evidence([0.9], [0.5]).verdict(SPEC)
    assert got == NOT_TESTED and why.startswith("underpowered: ") and why.endswith("over 1 seeds")


def c_inconclusive(scheme, against) -> bool:
    return stats.contrast(scheme, against, 0.03).verdict == stats.INCONCLUSIVE


def test_no_pair_of_runs_is_not_tested():
    got, why = probe_evidence.Evidence("p", {}, {}, check(True), [], 0).verdict(SPEC)
    assert got == NOT_TESTED and "no finished pair" in why


# ---------------------------------------------------------------------- on records, end to end
def record(acc: float, shortcut: float, baseline: float = 0.125) -> dict:
    metrics = {"test/acc": acc, "val/acc_auc": acc - 0.05, "test/answers": 1024.0,
               "test/baseline_acc": baseline, "test/shortcut_acc": shortcut}
    return {"status": "ok", "metrics": metrics, "optimized_value": acc, "run_dir": "/nowhere"}


def probe_results(plan: Plan, probe: str, accuracy) -> Results:
    """Records for every run the claim asks of `probe`: accuracy(model, condition, seed)."""
    results = Results(plan.cards)
    for run in probe_evidence.runs(plan, probe, ("unas", "dnas")):
        condition = ("positive" if "probe.options.a_queries=false" in run.extra else
                     "negative" if "probe.options.disjoint=true" in run.extra else "main")
        results.add(run, record(accuracy(run.model, condition, run.seed), shortcut=0.39))
    return results


def jitter(seed: int) -> float:
    return 0.002 * ((seed * 7) % 5)


@pytest.mark.parametrize("case, verdict", [("theory", HOLDS), ("inverted", CONTRADICTED),
                                           ("no break", NOT_TESTED)])
def test_explaining_away_is_judged_on_the_unmatched_key_probe(tmp_path, case, verdict):
    plan = Plan("quick", ROOT, tasks=("probe",))

    def accuracy(model, condition, seed):
        if condition == "negative":
            return 1.0 - jitter(seed)
        solves = (model == "dnas") != (case == "inverted")
        if condition == "positive" and case != "no break":
            solves = False  # no query competition: nobody solves it
        return (0.99 if solves else 0.39) - jitter(seed)

    result = explaining_away.evaluate(plan, probe_results(plan, "unmatched_key", accuracy), tmp_path)
    assert isinstance(result, ClaimResult) and result.verdict == verdict
    if case == "no break":
        assert "mechanism not engaged on unmatched_key" in result.reason
        assert "positive control does not break" in result.reason
    assert "| main | dnas |" in result.details and "negative control" in result.details


def test_mode_collapse_rests_on_the_trained_clusters_probe(tmp_path, monkeypatch):
    # a small toy (the verdict does not rest on it), and a probe without a positive control
    monkeypatch.setattr(mode_collapse, "SETTINGS", {"imbalanced": (40, 8), "balanced": (20, 20)})
    monkeypatch.setattr(mode_collapse, "SIM_N0", (10, 20))
    plan = Plan("quick", ROOT, tasks=("probe",))
    results = Results(plan.cards)
    for run in probe_evidence.runs(plan, "clusters", ("unas", "dnas")):
        results.add(run, record(0.9 if run.model == "dnas" else 0.7, shortcut=0.5))
    result = mode_collapse.evaluate(plan, results, tmp_path)
    # DNAS better, but the clusters probe has no positive control: nothing shows the mechanism
    assert result.verdict == NOT_TESTED and "positive control not defined" in result.reason
    assert "toy (untrained, not evidence)" in result.details
    untrained = mode_collapse.evaluate(Plan("quick", ROOT, tasks=("vqa",)), Results(), tmp_path)
    assert untrained.verdict == NOT_TESTED and "clusters probe was not trained" in untrained.reason


# ---------------------------------------------------------------------- HNAS u
def u_runs(moved: bool, spread: bool, tasks=("vqa", "mlm")) -> dict:
    init = 0.5
    layers = [[0.8, 0.8], [0.55, 0.55]] if spread else [[0.8, 0.8], [0.8, 0.8]]
    if not moved:
        layers = [[0.51, 0.51], [0.52, 0.52]]
    means = [sum(u) / len(u) for u in layers]
    return {t: (layers, init, moved, max(means) - min(means)) for t in tasks}


def at_spread(spread: float, tasks=("vqa", "mlm")) -> dict:
    """Runs whose u moved, with the layers' spread given exactly (SPREAD itself: not spread)."""
    return {t: ([[0.8, 0.8], [0.8, 0.8]], 0.5, True, spread) for t in tasks}


MIXED = {"vqa": u_runs(True, True)["vqa"], "mlm": u_runs(True, False)["mlm"]}


@pytest.mark.parametrize("rates, verdict, reason", [
    ({"null": u_runs(True, True), "0.05": u_runs(True, True)}, HOLDS, ""),
    ({"null": u_runs(True, False), "0.05": u_runs(True, False)}, CONTRADICTED, ""),
    ({"null": u_runs(False, False), "0.05": u_runs(True, True)}, NOT_TESTED,
     "mechanism not engaged: u stayed within 0.05 of its start in some task at u learning rate null"),
    ({"null": u_runs(True, False), "0.05": u_runs(True, True)}, NOT_TESTED,
     ("u's learning rate decides it: the layers spread by > 0.05 in every task at u lr 0.05 and "
      "not at null")),
    ({"null": MIXED, "0.05": MIXED}, NOT_TESTED,
     ("u's learning rate decides it: the layers spread by > 0.05 in every task at u lr none and "
      "not at null, 0.05")),
    ({"null": u_runs(False, False), "0.05": u_runs(False, True)}, NOT_TESTED,
     ("mechanism not engaged: u stayed within 0.05 of its start in some task at u learning rate "
      "null, 0.05")),
    ({"null": u_runs(True, True), "0.05": u_runs(True, True), "0.5": u_runs(True, False)},
     NOT_TESTED, ("u's learning rate decides it: the layers spread by > 0.05 in every task at u "
                  "lr null, 0.05 and not at 0.5")),
    # a spread of exactly SPREAD is not one: flat at both rates
    ({"null": at_spread(hnas_u.SPREAD), "0.05": at_spread(hnas_u.SPREAD)}, CONTRADICTED, ""),
    ({"null": {}, "0.05": {}}, NOT_TESTED, "no HNAS run finished and learned"),
    ({"null": u_runs(True, True, ("vqa",)), "0.05": u_runs(True, True, ("mlm",))}, NOT_TESTED,
     "no task has a learned HNAS run at both u learning rates"),
], ids=["holds", "contradicted", "not-engaged", "lr-decides", "none-spread", "not-engaged-2",
        "lr-decides-3", "at-SPREAD", "no-run", "no-common-task"])
def test_hnas_u_verdicts(rates, verdict, reason):
    """The verdict and its reason, word for word (the report prints it)."""
    assert hnas_u.judge(rates) == (verdict, reason)


# ---------------------------------------------------------------------- head diversity
@pytest.mark.parametrize("higher, n, verdict", [
    (5, 5, HOLDS), (0, 5, CONTRADICTED), (4, 4, NOT_TESTED), (3, 5, NOT_TESTED), (8, 9, HOLDS),
    (1, 9, CONTRADICTED), (0, 0, NOT_TESTED)])
def test_head_diversity_is_a_sign_test_across_measurements(higher, n, verdict):
    got, why = head_diversity.judge(higher, n)
    assert got == verdict
    up, down = head_diversity.sign_test(higher, n)
    if n:
        assert up == pytest.approx(sum(math.comb(n, k) for k in range(higher, n + 1)) / 2**n)
        assert down == pytest.approx(sum(math.comb(n, k) for k in range(higher + 1)) / 2**n)
    if verdict == NOT_TESTED and n:
        assert f"higher in {higher} of {n}" in why
    if verdict != NOT_TESTED:
        assert why == ""
