"""From the runs' records to what a comparison concludes (attnlab.study.compare.analysis), on
synthetic metrics.json records: the cells (failures and runs that did not learn kept), the
primary family under Holm, the negative controls, whether each probe tests its mechanism, and
the exploratory contrasts."""

import math
import warnings

import pytest
from compare_fakes import card, metrics, plan, record, records
from scipy import stats as scipy_stats

from attnlab.study import stats
from attnlab.study.compare.analysis import (
    Cell,
    build_cells,
    diagnostics,
    exploratory,
    negative_controls,
    primary_family,
    probe_checks,
    run_learned,
)
from attnlab.study.compare.probes import MAIN, NEGATIVE, POSITIVE, Condition, Control
from attnlab.study.evidence import Run

NOISE = (0.0, 0.02, -0.01, 0.015)  # per seed, shared by every scheme (paired)


def accs(level: float, n: int = 4) -> list[float]:
    return [round(level + e, 4) for e in NOISE[:n]]


# ----------------------------------------------------------------------------- cells
def test_run_learned_is_the_exact_binomial_test_against_the_baseline():
    # 20 of 100 right against chance 0.1: p = 0.002 < 0.01; 16 of 100: p = 0.04, not learned
    assert scipy_stats.binomtest(20, 100, 0.1, alternative="greater").pvalue < 0.01
    assert scipy_stats.binomtest(16, 100, 0.1, alternative="greater").pvalue > 0.01
    assert run_learned(metrics(0.20, answers=100, baseline=0.1))
    assert not run_learned(metrics(0.16, answers=100, baseline=0.1))
    # the same accuracy on more answers is evidence enough
    assert run_learned(metrics(0.16, answers=1000, baseline=0.1))
    assert not run_learned(metrics(0.125, answers=10_000, baseline=0.125))
    m = metrics(0.9)
    for key in ("test/answers", "test/baseline_acc", "test/acc"):
        assert not run_learned({k: v for k, v in m.items() if k != key})


def test_cells_hold_each_outcome_by_seed_and_keep_failures_and_runs_that_did_not_learn():
    c = card(schemes=("unas", "dnas", "hnas"))
    p = plan(c)
    lrs = p.choose_lrs({})
    found = records(p, lrs, {("p", MAIN, "unas"): [(0.6, 0.5), (0.62, 0.52), (0.64, 0.53)],
                             ("p", MAIN, "dnas"): [0.8, None, 0.126],  # failed; did not learn
                             ("p", POSITIVE, "dnas"): [0.4, 0.45]})
    run = p.run(c, Condition(MAIN), "hnas", 1, lrs[("p", "hnas")].lr)
    found[run] = record(run, 0.7) | {"metrics": {"val/acc": 0.7}}  # ok, without test/acc
    # the lr stage's run at a rate not chosen: in no cell
    other = p.run(c, Condition(MAIN), "unas", 1, c.lr * 3)
    found[other] = record(other, 0.99)
    cells = build_cells(p, found, lrs)
    assert set(cells) == {("p", MAIN, "unas"), ("p", MAIN, "dnas"), ("p", POSITIVE, "dnas"),
                          ("p", MAIN, "hnas")}
    unas = cells[("p", MAIN, "unas")]
    assert unas.values == {"test/acc": {1: 0.6, 2: 0.62, 3: 0.64},
                           "val/acc_auc": {1: 0.5, 2: 0.52, 3: 0.53}}
    assert unas.n == 3 and unas.mean() == pytest.approx(0.62) and unas.lr == c.lr
    assert unas.mean("val/acc_auc") == pytest.approx(0.5166667)
    assert unas.interval() == pytest.approx(stats.t_interval([0.6, 0.62, 0.64]))
    assert unas.baseline == 0.125 and unas.shortcut == 0.3 and unas.learned_count == 3
    dnas = cells[("p", MAIN, "dnas")]
    assert dnas.failed == ["seed 2: boom"] and dnas.values["test/acc"] == {1: 0.8, 3: 0.126}
    assert dnas.learned == {1: True, 3: False} and dnas.learned_count == 1 and dnas.n == 2
    assert dnas.mean() == pytest.approx(0.463)  # the run that did not learn counts
    hnas = cells[("p", MAIN, "hnas")]
    assert hnas.n == 0 and hnas.failed == ["seed 1: no test/acc in its metrics.json"]
    assert math.isnan(hnas.mean()) and math.isnan(hnas.baseline)
    assert cells[("p", POSITIVE, "dnas")].values["test/acc"] == {1: 0.4, 2: 0.45}


def test_a_run_in_two_cells_counts_in_both():
    c = card(sweep={"probe.options.n": (1, 8)}, main={"probe.options.n": 8},
             negative=Control(("probe.options.n=1",), "one item"))
    p = plan(c, mode="full")
    lrs = p.choose_lrs({})
    cells = build_cells(p, records(p, lrs, {("p", NEGATIVE, "dnas"): [0.5, 0.6]}), lrs)
    assert cells[("p", NEGATIVE, "dnas")].values == cells[("p", "sweep: n=1", "dnas")].values
    assert cells[("p", "sweep: n=1", "dnas")].n == 2


def test_a_failure_in_two_cells_is_listed_in_both_and_named_by_its_status_without_an_error():
    c = card(sweep={"probe.options.n": (1, 8)}, main={"probe.options.n": 8},
             negative=Control(("probe.options.n=1",), "one item"))
    p = plan(c, mode="full")
    lrs = p.choose_lrs({})
    found = records(p, lrs, {("p", NEGATIVE, "dnas"): [0.5, 0.6, 0.7, 0.8]})
    runs = list(found)
    found[runs[0]] = {"status": "timeout"}  # killed by the runner: a status, no error
    found[runs[1]] = {"status": "ok"}  # finished without writing its metrics
    found[runs[2]]["metrics"]["test/avg_jsd"] = 0.5  # the two finished runs: 0.5 and 0.03
    cells = build_cells(p, found, lrs)
    for name in (NEGATIVE, "sweep: n=1"):
        cell = cells[("p", name, "dnas")]
        assert cell.failed == ["seed 1: timeout", "seed 2: no test/acc in its metrics.json"]
        assert cell.values["test/acc"] == {3: 0.7, 4: 0.8}
        # each cell's diagnostics come from its own finished runs
        assert cell.diagnostics["head JSD"] == pytest.approx([0.265])
        assert cell.diagnostics["min col sum x S"] == [10.0]


def test_a_cell_without_an_outcome_has_no_mean_and_no_interval_and_warns_nothing():
    empty = Cell("p", MAIN, "dnas", lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN by definition, not numpy's "mean of empty slice"
        assert math.isnan(empty.mean()) and math.isnan(empty.mean("val/acc_auc"))
        assert all(math.isnan(x) for x in empty.interval())
        assert all(math.isnan(x) for x in empty.interval("val/acc_auc"))


def test_diagnostics_are_per_layer_means_over_the_runs():
    u = {"net.layers.0.attn": [0.2, 0.4], "net.layers.10.attn": [1.0],
         "net.layers.2.attn": [0.5], "net.layers.1.attn": [0.8, 0.6]}
    runs = [Run("probe", "hnas", s) for s in (1, 2)]
    found = [record(runs[0], 0.5, layers=(10.0, 20.0), jsd=0.1, scheme_params={"hnas_u": u}),
             record(runs[1], 0.5, layers=(12.0, 30.0), jsd=0.3, scheme_params={"hnas_u": u})]
    found[1]["metrics"]["test/collision_rate"] = 0.25
    d = diagnostics(found)
    assert d["min col sum x S"] == pytest.approx([11.0, 25.0])
    assert d["entropy (nats)"] == [2.0, 3.0] and d["share < 1e-8"] == [0.0, 0.0]
    assert d["head JSD"] == pytest.approx([0.2]) and d["head distance"] == pytest.approx([0.7])
    assert d["collision rate"] == [0.25]
    assert d["hnas_u"] == pytest.approx([0.3, 0.7, 0.5, 1.0])  # in layer order: 0, 1, 2, 10
    assert diagnostics([{"metrics": {}}]) == {k: [] for k in d if k != "hnas_u"}
    assert diagnostics([{}]) == {k: [] for k in d if k != "hnas_u"}  # a record without metrics
    # a run-level diagnostic logged on validation only is read from there (test/ first)
    assert diagnostics([{"metrics": {"val/avg_jsd": 0.4}}])["head JSD"] == [0.4]
    # a record written before `scheme_params` held HNAS's u alone, as `hnas_u`
    old = [{**r, "hnas_u": u} for r in found]
    for r in old:
        del r["scheme_params"]
    assert diagnostics(old)["hnas_u"] == d["hnas_u"]


# ----------------------------------------------------------------------------- the family
DNAS = [0.80, 0.84, 0.78, 0.83]  # against accs(0.6): +0.2, +0.22, +0.19, +0.215


def family_setup():
    p = card("p", schemes=("unas", "dnas", "hnas"))  # dnas better, hnas equivalent
    q = card("q", schemes=("unas", "sinkhorn"), contrasts=(("sinkhorn", "unas", "worse"),))
    e = card("e", "exploratory", schemes=("unas", "dnas"))  # contrasts, but not in the family
    pl = plan(p, q, e, mode="full", registered=["unas", "dnas", "hnas", "sinkhorn"])
    lrs = pl.choose_lrs({})
    same = accs(0.6)
    values = {("p", MAIN, "unas"): same, ("p", MAIN, "dnas"): DNAS,
              ("p", MAIN, "hnas"): same,  # the same configuration twice: identical results
              ("p", MAIN, "sinkhorn"): accs(0.55),
              ("q", MAIN, "unas"): accs(0.7), ("q", MAIN, "sinkhorn"): accs(0.7),
              ("q", MAIN, "dnas"): accs(0.72), ("q", MAIN, "hnas"): accs(0.6),
              ("e", MAIN, "unas"): accs(0.5), ("e", MAIN, "dnas"): accs(0.9),
              ("e", MAIN, "hnas"): accs(0.5), ("e", MAIN, "sinkhorn"): accs(0.5)}
    cells = build_cells(pl, records(pl, lrs, values), lrs)
    return pl, cells


def test_the_primary_family_is_holm_across_contrasts_and_outcomes():
    pl, cells = family_setup()
    results = primary_family(cells, pl.probes())
    names = [(r.probe, r.spec.name, r.outcome) for r in results]
    assert sorted(names) == sorted((probe, contrast, o) for probe, contrast in
                                   [("p", "dnas vs unas"), ("p", "hnas vs unas"),
                                    ("q", "sinkhorn vs unas")]
                                   for o in ("test/acc", "val/acc_auc"))
    assert {r.condition for r in results} == {MAIN}
    single = [stats.contrast(cells[(r.probe, MAIN, r.spec.scheme)].values[r.outcome],
                             cells[(r.probe, MAIN, r.spec.against)].values[r.outcome], 0.03)
              for r in results]
    assert [r.result.p_value for r in results] == pytest.approx([s.p_value for s in single])
    # one family of six: Holm over all of them, for the differences and for TOST
    assert [r.result.p_adjusted for r in results] == pytest.approx(
        stats.holm([s.p_value for s in single]))
    assert [r.result.tost_adjusted for r in results] == pytest.approx(
        stats.holm([s.tost_p for s in single]))
    dnas = next(r for r in results if r.spec.name == "dnas vs unas" and r.outcome == "test/acc")
    d = [a - b for a, b in zip(DNAS, accs(0.6))]
    assert dnas.result.p_value == pytest.approx(scipy_stats.ttest_rel(DNAS, accs(0.6)).pvalue)
    assert dnas.result.difference == pytest.approx(sum(d) / 4) and dnas.result.n == 4
    assert dnas.result.verdict == "better" and dnas.as_predicted == "yes"
    # identical configurations: equivalent, never better
    for r in results:
        if r.spec.scheme in ("hnas", "sinkhorn"):
            assert r.result.verdict == "equivalent" and r.result.p_adjusted == 1.0
            assert r.result.difference == 0.0
    worse = [r for r in results if r.probe == "q"]
    assert {r.as_predicted for r in worse} == {"no"}  # predicted worse, found equivalent


def test_a_contrast_needs_both_cells_and_an_outcome_missing_from_a_cell_pairs_nothing():
    p = card("p", schemes=("unas", "dnas", "hnas"),
             contrasts=(("dnas", "unas", "better"), ("unas", "dnas", "worse"),
                        ("hnas", "unas", "equivalent")))
    pl = plan(p)
    lrs = pl.choose_lrs({})
    found = records(pl, lrs, {("p", MAIN, "unas"): accs(0.6), ("p", MAIN, "dnas"): DNAS})
    for run, rec in found.items():
        if run.model == "dnas":  # dnas's runs logged no learning curve
            del rec["metrics"]["val/acc_auc"]
    results = primary_family(build_cells(pl, found, lrs), pl.probes())
    # hnas never ran: its contrast is left out of the family
    assert [(r.spec.name, r.outcome) for r in results] == [
        ("dnas vs unas", "test/acc"), ("dnas vs unas", "val/acc_auc"),
        ("unas vs dnas", "test/acc"), ("unas vs dnas", "val/acc_auc")]
    for auc in (results[1].result, results[3].result):  # dnas on either side: no pair
        assert auc.n == 0 and auc.dropped == 4 and auc.verdict == "inconclusive"
    assert results[0].result.verdict == "better" and results[0].result.n == 4
    assert results[2].result.verdict == "worse" and results[2].result.n == 4


def test_an_inconclusive_contrast_is_no_prediction():
    p = card("p", schemes=("unas", "dnas"), contrasts=(("dnas", "unas", "better"),))
    pl = plan(p)
    lrs = pl.choose_lrs({})
    cells = build_cells(pl, records(pl, lrs, {("p", MAIN, "unas"): [0.5, 0.7],
                                              ("p", MAIN, "dnas"): [0.7, 0.5]}), lrs)
    (r, _) = primary_family(cells, pl.probes())
    assert r.result.verdict == "inconclusive" and r.as_predicted == "—"


def test_negative_controls_predict_equivalence():
    p = card("p", schemes=("unas", "dnas", "hnas"))
    q = card("q", schemes=("unas", "dnas"), contrasts=(("dnas", "unas", "better"),))
    pl = plan(p, q)
    lrs = pl.choose_lrs({})
    cells = build_cells(pl, records(pl, lrs, {
        ("p", NEGATIVE, "unas"): accs(0.9), ("p", NEGATIVE, "dnas"): accs(0.9),
        ("p", NEGATIVE, "hnas"): accs(0.7),  # one of p's two contrasts does not tie
        ("q", NEGATIVE, "unas"): accs(0.5), ("q", NEGATIVE, "dnas"): accs(0.5)}), lrs)
    results = negative_controls(cells, pl.probes())
    assert {(r.probe, r.spec.name) for r in results} == {("p", "dnas vs unas"),
                                                        ("p", "hnas vs unas"),
                                                        ("q", "dnas vs unas")}
    assert {r.outcome for r in results} == {"test/acc"} and {r.condition for r in results} == {
        NEGATIVE}
    assert {r.spec.predicts for r in results} == {"equivalent"}
    by = {(r.probe, r.spec.name): r for r in results}
    assert by[("p", "dnas vs unas")].result.verdict == "equivalent"
    assert by[("p", "dnas vs unas")].as_predicted == "yes"
    assert by[("p", "hnas vs unas")].result.verdict == "worse"
    assert by[("p", "hnas vs unas")].as_predicted == "no"
    assert by[("q", "dnas vs unas")].result.verdict == "equivalent"
    # Holm within these three only
    single = [stats.contrast(cells[(k[0], NEGATIVE, k[1].split(" vs ")[0])].values["test/acc"],
                             cells[(k[0], NEGATIVE, "unas")].values["test/acc"], 0.03).p_value
              for k in by]
    assert [r.result.p_adjusted for r in by.values()] == pytest.approx(stats.holm(single))
    checks = probe_checks(cells | main_cells(pl, lrs), pl, results)
    assert checks["p"].negative == "does not tie" and checks["q"].negative == "ties"
    assert checks_for(card(), MAIN_90).negative == "not run"
    assert checks_for(card(negative=None), MAIN_90).negative == "not defined"


def test_negative_controls_are_the_primary_probes_only_and_not_all_equivalent_is_inconclusive():
    p = card("p", schemes=("unas", "dnas", "hnas"))
    e = card("e", "exploratory", schemes=("unas", "dnas"),
             contrasts=(("dnas", "unas", "better"),))  # a negative control, but not primary
    pl = plan(p, e, mode="full", registered=["unas", "dnas", "hnas"])
    lrs = pl.choose_lrs({})
    noise = (0.1, -0.1, 0.05, -0.04)  # mean +0.0025, sd 0.09: neither test decides
    cells = build_cells(pl, records(pl, lrs, {
        ("p", NEGATIVE, "unas"): accs(0.9), ("p", NEGATIVE, "dnas"): accs(0.9),
        ("p", NEGATIVE, "hnas"): [round(a + d, 4) for a, d in zip(accs(0.9), noise)],
        ("e", NEGATIVE, "unas"): accs(0.5), ("e", NEGATIVE, "dnas"): accs(0.5)}), lrs)
    results = negative_controls(cells, pl.probes())
    assert {(r.probe, r.spec.name) for r in results} == {("p", "dnas vs unas"),
                                                        ("p", "hnas vs unas")}
    assert {r.spec.name: r.result.verdict for r in results} == {"dnas vs unas": "equivalent",
                                                                "hnas vs unas": "inconclusive"}
    checks = probe_checks(cells | main_cells(pl, lrs), pl, results)
    assert checks["p"].probe == "p"
    assert checks["p"].negative == "inconclusive (not every contrast shown equivalent)"


def main_cells(pl, lrs, level=0.9):
    values = {(c.name, MAIN, s): accs(level) for c in pl.probes() for s in pl.schemes_for(c)}
    return build_cells(pl, records(pl, lrs, values), lrs)


# ----------------------------------------------------------------------------- checks
def checks_for(c, values: dict, shortcut: float = 0.3):
    """probe_checks of one probe from {(condition, scheme): level of accuracy}."""
    pl = plan(c)
    lrs = pl.choose_lrs({})
    found = records(pl, lrs, {(c.name, cond, s): accs(v) for (cond, s), v in values.items()},
                    shortcut=shortcut)
    return probe_checks(build_cells(pl, found, lrs), pl, [])[c.name]


FALL = card(schemes=("unas", "dnas", "hnas"),
            positive=Control(("probe.options.a_queries=false",), "competition", "fall",
                             ("dnas", "hnas")))
MAIN_90 = {(MAIN, "unas"): 0.6, (MAIN, "dnas"): 0.9, (MAIN, "hnas"): 0.9}


def test_the_shortcut_reaching_the_best_scheme_means_the_probe_does_not_test_it():
    falls = {(POSITIVE, "dnas"): 0.5, (POSITIVE, "hnas"): 0.5}
    check = checks_for(FALL, MAIN_90 | falls, shortcut=0.88)  # 0.9 <= 0.88 + margin
    assert check.shortcut == pytest.approx(0.88) and check.best == pytest.approx(0.90625)
    assert check.shortcut_reached and not check.tests_mechanism
    assert check.summary == "no: the shortcut (0.880) reaches the best scheme (0.906)"
    check = checks_for(FALL, MAIN_90 | falls, shortcut=0.85)  # beaten by more than the margin
    assert not check.shortcut_reached and check.positive == "breaks" and check.tests_mechanism
    assert check.summary == "yes"
    # no shortcut logged (a probe without one): nothing reaches
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no shortcut is no number, not numpy's "mean of empty slice"
        check = checks_for(FALL, MAIN_90 | falls, shortcut=None)
    assert math.isnan(check.shortcut) and not check.shortcut_reached


def test_a_probe_without_runs_on_its_main_setting_gets_no_check_and_the_next_one_does():
    a, b = card("a"), card("b")
    pl = plan(a, b)
    lrs = pl.choose_lrs({})
    found = records(pl, lrs, {("a", MAIN, "unas"): [None, None], ("a", POSITIVE, "dnas"): [0.5],
                              ("b", MAIN, "unas"): accs(0.6), ("b", MAIN, "dnas"): accs(0.9)})
    checks = probe_checks(build_cells(pl, found, lrs), pl, [])
    assert list(checks) == ["b"] and checks["b"].probe == "b"
    assert checks["b"].best == pytest.approx(0.90625)


def test_expect_fall_breaks_only_when_every_listed_scheme_falls_halfway_to_the_shortcut():
    # main 0.9 (+ noise: 0.906), shortcut 0.3: halfway is 0.603
    check = checks_for(FALL, MAIN_90 | {(POSITIVE, "dnas"): 0.4, (POSITIVE, "hnas"): 0.59,
                                        (POSITIVE, "unas"): 0.6})  # unas: not listed
    assert check.positive == "breaks" and check.tests_mechanism
    assert check.positive_detail == ("dnas 0.906 -> 0.406 (shortcut 0.300); "
                                     "hnas 0.906 -> 0.596 (shortcut 0.300)")  # unas not listed
    check = checks_for(FALL, MAIN_90 | {(POSITIVE, "dnas"): 0.4, (POSITIVE, "hnas"): 0.62})
    assert check.positive == "does not break" and not check.tests_mechanism
    assert check.summary == "no: the positive control does not break"
    check = checks_for(FALL, MAIN_90 | {(POSITIVE, "dnas"): 0.85, (POSITIVE, "hnas"): 0.85})
    assert check.positive == "does not break"
    # a listed scheme not run in the control (--schemes): judged on the others
    check = checks_for(FALL, MAIN_90 | {(POSITIVE, "dnas"): 0.4})
    assert check.positive == "breaks"
    not_run, not_defined = checks_for(FALL, MAIN_90), checks_for(card(positive=None), MAIN_90)
    assert (not_run.positive, not_run.positive_detail) == ("not run", "")
    assert (not_defined.positive, not_defined.positive_detail) == ("not defined", "")


def test_expect_fall_judges_only_schemes_that_beat_the_shortcut():
    weak = dict(MAIN_90) | {(MAIN, "hnas"): 0.31}  # hnas never beat the shortcut: cannot fall
    check = checks_for(FALL, weak | {(POSITIVE, "dnas"): 0.4, (POSITIVE, "hnas"): 0.31})
    assert check.positive == "breaks"
    check = checks_for(FALL, weak | {(MAIN, "dnas"): 0.31, (POSITIVE, "dnas"): 0.3,
                                     (POSITIVE, "hnas"): 0.3})
    assert check.positive == ("cannot tell (the schemes it ablates do not beat the shortcut on "
                              "the main setting)") and not check.tests_mechanism
    assert check.positive_detail == ("dnas 0.316 -> 0.306 (shortcut 0.300); "
                                     "hnas 0.316 -> 0.306 (shortcut 0.300)")


def test_expect_fall_skips_a_listed_scheme_without_runs_on_either_setting():
    # dnas (listed first) not run in the control: judged on hnas, which does not fall
    check = checks_for(FALL, MAIN_90 | {(POSITIVE, "hnas"): 0.8})
    assert check.positive == "does not break"
    assert check.positive_detail == "hnas 0.906 -> 0.806 (shortcut 0.300)"
    # every main run of dnas failed: no mean to fall from, judged on hnas
    pl = plan(FALL)
    lrs = pl.choose_lrs({})
    levels = MAIN_90 | {(POSITIVE, "dnas"): 0.4, (POSITIVE, "hnas"): 0.4}
    found = records(pl, lrs, {("p", c, s): accs(v) for (c, s), v in levels.items()}
                    | {("p", MAIN, "dnas"): [None, None]})
    check = probe_checks(build_cells(pl, found, lrs), pl, [])["p"]
    assert check.positive == "breaks" and check.positive_detail == (
        "hnas 0.906 -> 0.406 (shortcut 0.300)")
    # the same with every control run of dnas failed
    found = records(pl, lrs, {("p", c, s): accs(v) for (c, s), v in (
        MAIN_90 | {(POSITIVE, "hnas"): 0.4}).items()} | {("p", POSITIVE, "dnas"): [None]})
    check = probe_checks(build_cells(pl, found, lrs), pl, [])["p"]
    assert check.positive == "breaks" and check.positive_detail == (
        "hnas 0.906 -> 0.406 (shortcut 0.300)")


def exact_checks(c, values: dict, shortcut: float | None = 0.5):
    """probe_checks of one probe from {(condition, scheme): accuracies by seed}, exactly (binary
    fractions, no noise): for the boundaries."""
    pl = plan(c)
    lrs = pl.choose_lrs({})
    found = records(pl, lrs, {(c.name, cond, s): v for (cond, s), v in values.items()},
                    shortcut=shortcut)
    return probe_checks(build_cells(pl, found, lrs), pl, [])[c.name]


def test_the_boundaries_of_the_shortcut_and_of_falling_halfway():
    """docs/compare.md: a probe tests its mechanism when its best scheme beats the shortcut by
    MORE than the margin; a scheme that beat it falls AT LEAST halfway back."""
    fall = card(schemes=("unas", "dnas"), margin=0.25)
    at = exact_checks(fall, {(MAIN, "unas"): [0.75, 0.75], (MAIN, "dnas"): [0.75, 0.75],
                             (POSITIVE, "dnas"): [0.5, 0.5]})
    assert at.best == 0.75 and at.shortcut_reached  # 0.75 = shortcut 0.5 + margin 0.25
    # nor did dnas beat the shortcut by more than the margin: it cannot fall
    assert at.positive.startswith("cannot tell")
    half = exact_checks(card(schemes=("unas", "dnas"), margin=0.125),
                        {(MAIN, "unas"): [0.75, 0.75], (MAIN, "dnas"): [0.75, 0.75],
                         (POSITIVE, "dnas"): [0.625, 0.625]})  # 0.625: exactly halfway
    assert not half.shortcut_reached and half.positive == "breaks" and half.tests_mechanism


VANISH = card(schemes=("unas", "dnas", "hnas"),
              contrasts=(("dnas", "unas", "better"), ("hnas", "unas", "worse")),
              positive="vanish")


def test_expect_vanish_breaks_only_when_every_contrast_with_an_effect_at_least_halves():
    main = {(MAIN, "unas"): 0.6, (MAIN, "dnas"): 0.8, (MAIN, "hnas"): 0.4}  # +0.2, -0.2
    halved = {(POSITIVE, "unas"): 0.6, (POSITIVE, "dnas"): 0.68, (POSITIVE, "hnas"): 0.52}
    check = checks_for(VANISH, main | halved, shortcut=0.1)
    assert check.positive == "breaks" and check.tests_mechanism
    assert check.positive_detail == "dnas vs unas +0.200 -> +0.080; hnas vs unas -0.200 -> -0.080"
    check = checks_for(VANISH, main | halved | {(POSITIVE, "hnas"): 0.45}, shortcut=0.1)
    assert check.positive == "does not break"  # hnas: -0.2 -> -0.15
    check = checks_for(VANISH, main | halved | {(POSITIVE, "dnas"): 0.85}, shortcut=0.1)
    assert check.positive == "does not break"  # dnas grew
    # a reversal breaks the advantage too: dnas +0.2 -> -0.15
    check = checks_for(VANISH, main | halved | {(POSITIVE, "dnas"): 0.45}, shortcut=0.1)
    assert check.positive == "breaks" and "dnas vs unas +0.200 -> -0.150" in check.positive_detail
    # a contrast without the minimum effect on main is not judged, whatever it does
    small = main | {(MAIN, "hnas"): 0.62}
    check = checks_for(VANISH, small | halved | {(POSITIVE, "hnas"): 0.95}, shortcut=0.1)
    assert check.positive == "breaks" and "hnas" not in check.positive_detail
    check = checks_for(VANISH, {(MAIN, s): 0.6 for s in ("unas", "dnas", "hnas")} | halved,
                       shortcut=0.1)
    assert check.positive == ("cannot tell (no contrast differs by the minimum effect on the main "
                              "setting)") and not check.tests_mechanism
    assert check.positive_detail == ""


def test_expect_vanish_judges_each_contrast_that_can_be_judged():
    main = {(MAIN, "unas"): 0.6, (MAIN, "dnas"): 0.8, (MAIN, "hnas"): 0.4}  # +0.2, -0.2
    halved = {(POSITIVE, "unas"): 0.6, (POSITIVE, "dnas"): 0.68, (POSITIVE, "hnas"): 0.52}
    # dnas vs unas (the first contrast) without a control run of dnas: hnas judged alone
    no_dnas = {k: v for k, v in (main | halved).items() if k != (POSITIVE, "dnas")}
    check = checks_for(VANISH, no_dnas, shortcut=0.1)
    assert check.positive == "breaks" and check.positive_detail == "hnas vs unas -0.200 -> -0.080"
    # the same where every control run of dnas failed (no difference to compare)
    pl = plan(VANISH)
    lrs = pl.choose_lrs({})
    found = records(pl, lrs, {("p", c, s): accs(v) for (c, s), v in no_dnas.items()}
                    | {("p", POSITIVE, "dnas"): [None, None]}, shortcut=0.1)
    check = probe_checks(build_cells(pl, found, lrs), pl, [])["p"]
    assert check.positive == "breaks" and check.positive_detail == "hnas vs unas -0.200 -> -0.080"
    # the first contrast without an effect on main: the second still judged
    check = checks_for(VANISH, main | halved | {(MAIN, "dnas"): 0.6}, shortcut=0.1)
    assert check.positive == "breaks" and check.positive_detail == "hnas vs unas -0.200 -> -0.080"


def test_expect_vanish_boundaries_an_effect_of_exactly_min_effect_exactly_halved():
    """docs/compare.md: every contrast that differed by AT LEAST min_effect AT LEAST halves."""
    vanish = card(schemes=("unas", "dnas"), contrasts=(("dnas", "unas", "better"),),
                  min_effect=0.25, positive="vanish")
    check = exact_checks(vanish, {(MAIN, "unas"): [0.5, 0.5], (MAIN, "dnas"): [0.75, 0.75],
                                  (POSITIVE, "unas"): [0.5, 0.5],
                                  (POSITIVE, "dnas"): [0.625, 0.625]}, shortcut=0.125)
    assert check.positive == "breaks" and check.positive_detail == "dnas vs unas +0.250 -> +0.125"


def test_exploratory_sets_every_other_scheme_against_unas_without_a_verdict():
    pl, cells = family_setup()
    results = exploratory(cells, pl)
    assert [(r.probe, r.spec.name) for r in results] == [
        ("p", "sinkhorn vs unas"),  # p's primary contrasts are not repeated
        ("q", "dnas vs unas"), ("q", "hnas vs unas"),
        ("e", "dnas vs unas"), ("e", "hnas vs unas"), ("e", "sinkhorn vs unas")]
    assert {r.outcome for r in results} == {"test/acc"} and {r.spec.predicts for r in results} == {
        ""}
    for r in results:  # uncorrected: each alone
        assert r.result.p_adjusted == r.result.p_value and r.result.tost_adjusted == r.result.tost_p
    e = results[3].result
    assert e.difference == pytest.approx(0.4) and e.n == 4
    assert {r.condition for r in results} == {MAIN}


def test_exploratory_in_quick_mode_takes_each_probes_own_schemes():
    p = card("p", schemes=("unas", "dnas", "hnas"), contrasts=(("dnas", "unas", "better"),))
    pl = plan(p)  # quick: p's schemes, not every registered one
    lrs = pl.choose_lrs({})
    cells = build_cells(pl, records(pl, lrs, {("p", MAIN, s): accs(v) for s, v in
                                              (("unas", 0.6), ("dnas", 0.8), ("hnas", 0.7))}), lrs)
    (r,) = exploratory(cells, pl)
    assert (r.probe, r.condition, r.spec.name, r.outcome) == ("p", MAIN, "hnas vs unas", "test/acc")
    assert r.result.difference == pytest.approx(0.1)
