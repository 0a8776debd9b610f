"""The length claims (reproduce/length*.py): the runs the plan asks for (arms x seeds, every run
tested at the lengths), the seeds from a pilot's spread, and each verdict on synthetic run records
whose answer is known: holds, contradicted (by the other direction and by equivalence), not tested
because the runs did not learn, because they are underpowered, or because a length is missing;
Holm within a family; the non-inferiority margin's direction."""

import math

import numpy as np
import pytest
from helpers.paths import ROOT
from scipy import stats as scipy_stats

from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED
from attnlab.study.power import paired_power
from attnlab.study.reproduce import (
    length,
    length_gate,
    length_report,
    length_ssmax,
    length_stickbreaking,
)
from attnlab.study.reproduce.length import Arm, Contrast, Registration
from attnlab.study.reproduce.plan import Plan
from attnlab.study.reproduce.results import Results

CLAIMS = (length_ssmax, length_stickbreaking, length_gate)
NONE, ROPE = length_ssmax.NONE, length_ssmax.ROPE
LEARNED = {"val/ppl": 300.0, "val/baseline_ppl": 900.0}  # the lm card's check: 300 < 900


@pytest.fixture(scope="module")
def plan():
    return Plan("quick", ROOT, tasks=("lm",))


@pytest.fixture(autouse=True)
def no_figures(request, monkeypatch):
    """Drawing the figure costs ~0.5 s a claim: one test draws it, the others skip it."""
    if not request.node.name.endswith("with_its_figure"):
        monkeypatch.setattr(length_report, "plot", lambda *args: args[-1])


def record(losses: dict[int, float], learned: bool = True) -> dict:
    metrics = dict(LEARNED) if learned else {"val/ppl": 905.0, "val/baseline_ppl": 900.0}
    metrics.update({f"test/loss@{m}": v for m, v in losses.items()})
    return {"status": "ok", "metrics": metrics, "run_dir": "/nowhere"}


def jitter(seed: int) -> float:
    return 0.004 * ((seed * 7) % 5 - 2)  # -0.008 .. +0.008, a different value per seed


def results_for(plan, claim, loss, seeds=range(1, 5), learned=lambda arm, seed: True,
                lengths=length.LENGTHS) -> Results:
    """Records of every arm x seed of `claim`: loss(arm, seed, m) at each of `lengths`."""
    results = Results(plan.cards)
    for arm in claim.REGISTRATION.arms:
        for seed in seeds:
            results.add(length.run(plan, "lm", (), arm, seed),
                        record({m: loss(arm, seed, m) for m in lengths}, learned(arm, seed)))
    return results


def ssmax_loss(gap: dict[tuple[str, int], float]):
    """SSMax's loss minus UNAS's by (positions, m) (absent: -0.3), UNAS at 5.9 + m/10."""
    def loss(arm, seed, m):
        base = 5.9 + m / 10 + jitter(seed)
        if arm.model != "ssmax":
            return base
        return base + gap.get((arm.overrides[0].split("=")[1], m), -0.3) + jitter(seed + 1) / 4
    return loss


# ---------------------------------------------------------------------- the runs
def test_the_plan_asks_for_every_arm_x_pilot_seed_tested_at_the_lengths(plan):
    wanted = [r for c in CLAIMS for r in c.runs(plan)]
    runs = list(dict.fromkeys(wanted))
    arms = {(r.model, tuple(e for e in r.extra if e.startswith(("task.module.net.positions=", "model.gate"))))
            for r in runs}
    assert arms == {("ssmax", (NONE,)), ("unas", (NONE,)), ("ssmax", (ROPE,)), ("unas", (ROPE,)),
                    ("stickbreaking", (NONE,)), ("unas", (ROPE, "model.gate=headwise"))}
    # unas with RoPE is shared by the three claims: trained once per seed
    assert len(runs) == 6 * length.PILOT["quick"] < len(wanted)
    assert {r.seed for r in runs} == {1, 2, 3} and {r.task for r in runs} == {"lm"}
    for r in runs:
        assert "task.eval_lengths=[1,4,8]" in r.extra
        assert list(r.extra[:len(plan.task_overrides("lm"))]) == plan.task_overrides("lm")
    # the card's quick size: trained at block_size 64, so tested at 64, 256 and 512 tokens
    assert "task.data.block_size=64" in plan.task_overrides("lm")
    # not trained: no runs asked of a task --quick does not train, and the claim says why
    skipped = Plan("quick", ROOT)
    assert not [r for c in CLAIMS for r in c.more_runs(skipped, Results(skipped.cards))]
    result = length_ssmax.evaluate(skipped, Results(skipped.cards), "/nowhere")
    assert result.verdict == NOT_TESTED and "lm: not run" in result.reason and "--tasks" in result.reason


def test_seeds_come_from_the_pilot_for_80_percent_power_capped(plan):
    reg = length_ssmax.REGISTRATION
    alpha = length.ALPHA / 4  # the family's Bonferroni level: 4 contrasts
    for sd in (0.01, 0.03, 0.05, 0.2):
        d = list(np.array([-1.0, 0.0, 1.0]) * sd - 0.1)  # pilot differences with s.d. `sd`
        p = length.plan_seeds(d, reg, "quick")
        assert p.pairs == 3 and p.sd == pytest.approx(sd)
        n = p.needed  # the smallest n with power >= 0.8 at min_effect
        assert paired_power(n, reg.min_effect, sd, alpha) >= 0.8 > (
            paired_power(n - 1, reg.min_effect, sd, alpha) if n > 2 else 0)
        assert p.seeds == max(length.PILOT["quick"], min(n, length.CAP["quick"]))
    # a pilot that does not vary: its s.d. is floored (sd 0 would plan 2 seeds for any effect)
    floored = length.plan_seeds([0.1, 0.1, 0.1], reg, "quick").needed
    assert paired_power(floored, reg.min_effect, length.SD_FLOOR, alpha) >= 0.8 > paired_power(
        floored - 1, reg.min_effect, length.SD_FLOOR, alpha) and floored == 3
    one = length.plan_seeds([0.1], reg, "quick")  # nothing to plan on: the pilot's seeds, no more
    assert (one.pairs, one.needed, one.seeds) == (1, 0, 3) and math.isnan(one.sd)
    # non-inferiority: one-sided, so powered at twice the level, the margin away
    ni = length_stickbreaking.REGISTRATION
    p = length.plan_seeds([0.0, 0.03, 0.06], ni, "full")
    assert paired_power(p.needed, ni.margin, 0.03, 2 * length.ALPHA) >= 0.8
    # a noisy pilot tops up only the arms of the contrasts that need it, to the cap
    noisy = results_for(plan, length_ssmax, lambda arm, seed, m: 6.0 + (
        0.3 * (-1) ** seed if arm.model == "ssmax" and NONE in arm.overrides else 0.0), seeds=(1, 2, 3))
    more = length_ssmax.more_runs(plan, noisy)
    assert {(r.model, r.extra[-4], r.seed) for r in more} == {
        ("ssmax", NONE, 4), ("unas", NONE, 4)}
    clean = results_for(plan, length_ssmax, ssmax_loss({}), seeds=(1, 2, 3))
    assert length_ssmax.more_runs(plan, clean) == []


# ---------------------------------------------------------------------- verdicts on records
def test_ssmax_holds_when_it_is_lower_in_every_contrast_with_its_figure(plan, tmp_path):
    result = length_ssmax.evaluate(plan, results_for(plan, length_ssmax, ssmax_loss({}), seeds=(1, 2, 3)),
                                   tmp_path)
    assert result.verdict == HOLDS and result.reason == ""
    assert "ssmax, positions=none vs unas, positions=none at 8x: -0.299 [" in result.ours
    assert "Pre-registered" in result.details and "margin 0.05" in result.details
    assert (tmp_path / result.figures[0]).is_file()


@pytest.mark.parametrize("gap, why", [(0.3, "higher"), (0.001, "equivalent within the margin")])
def test_one_contrast_the_other_way_or_equivalent_contradicts_the_claim(plan, tmp_path, gap, why):
    results = results_for(plan, length_ssmax, ssmax_loss({("rope", 8): gap}))
    result = length_ssmax.evaluate(plan, results, tmp_path)
    assert result.verdict == CONTRADICTED
    assert result.reason.startswith("ssmax, positions=rope vs unas, positions=rope at 8x: +")
    assert "holds for ssmax, positions=none vs unas, positions=none at 4x" in result.reason
    if why == "equivalent within the margin":
        assert why in result.reason


def test_runs_that_did_not_learn_enter_no_verdict(plan, tmp_path):
    results = results_for(plan, length_ssmax, ssmax_loss({}),
                          learned=lambda arm, seed: not (arm.model == "unas" and NONE in arm.overrides))
    result = length_ssmax.evaluate(plan, results, tmp_path)
    assert result.verdict == NOT_TESTED and "the runs did not learn" in result.reason
    assert "unas, positions=none seed 1: did not learn" in result.reason
    # the RoPE half still has its evidence: it holds there, and says so in the details
    assert result.reason.count("did not learn (") == 2  # 4x and 8x at positions=none


def test_an_inconclusive_family_is_underpowered_with_the_seeds_it_needs(plan, tmp_path):
    noisy = ssmax_loss({})

    def loss(arm, seed, m):
        if arm.model == "ssmax":
            return noisy(Arm("unas"), seed, m) + (0.2 if seed % 2 else -0.25)
        return noisy(arm, seed, m)

    result = length_ssmax.evaluate(plan, results_for(plan, length_ssmax, loss), tmp_path)
    assert result.verdict == NOT_TESTED and result.reason.startswith("underpowered: ")
    assert "over 4 seeds" in result.reason and "power needs" in result.reason
    assert "the quick cap is 4" in result.reason and "[95%: " in result.reason


def test_a_length_the_runs_do_not_report_is_not_tested(plan, tmp_path):
    results = results_for(plan, length_ssmax, ssmax_loss({}), lengths=(1, 4))
    result = length_ssmax.evaluate(plan, results, tmp_path)
    assert result.verdict == NOT_TESTED and "no test/loss@8" in result.reason
    assert "missing lengths" in result.reason and "at 4x" not in result.reason


# ---------------------------------------------------------------------- Holm and the margin
def test_holm_applies_across_the_family(plan):
    """A contrast significant alone (p ~0.02) is not once three contrasts without an effect share
    its family: Holm multiplies the smallest p by 4 (checked against scipy's paired t-test)."""
    a = {s: 6.0 + d for s, d in zip(range(1, 6), (-0.10, -0.05, -0.12, -0.02, -0.08))}
    b = {s: 6.0 for s in range(1, 6)}
    null_a = {s: 6.0 + d for s, d in zip(range(1, 6), (0.3, -0.2, 0.1, -0.3, 0.2))}
    raw = scipy_stats.ttest_rel(list(a.values()), list(b.values())).pvalue
    assert 0.0125 < raw < 0.05
    alone = Registration("p", length.SUPERIORITY, (Contrast(Arm("ssmax"), Arm("unas"), 4),), 0.01, 0.05, "w")
    [j] = length.judge(alone, {"x": (a, b, [])})
    assert j.verdict == HOLDS and j.result.p_adjusted == pytest.approx(raw)
    family = length_ssmax.REGISTRATION
    names = [c.name for c in family.contrasts]
    pairs = {names[0]: (a, b, []), **{n: (null_a, b, []) for n in names[1:]}}
    judged = length.judge(family, pairs)
    assert judged[0].result.p_adjusted == pytest.approx(min(1.0, 4 * raw))
    assert judged[0].verdict == NOT_TESTED and "underpowered" in judged[0].reason


@pytest.mark.parametrize("gap, verdict", [
    (-0.20, HOLDS),  # better: non-inferior too
    (0.02, HOLDS),  # worse, but by less than the 0.05 margin: still non-inferior
    (0.12, CONTRADICTED),  # worse by more than the margin
    (0.05, NOT_TESTED),  # at the margin: neither test rejects
])
def test_the_noninferiority_margin_allows_a_loss_up_to_it_and_no_more(plan, tmp_path, gap, verdict):
    def loss(arm, seed, m):
        return 6.0 + jitter(seed) + (gap + jitter(seed + 2) / 2 if arm.model == "stickbreaking" else 0.0)

    result = length_stickbreaking.evaluate(plan, results_for(plan, length_stickbreaking, loss), tmp_path)
    assert result.verdict == verdict
    if verdict == NOT_TESTED:
        assert result.reason.startswith("underpowered") and "[90%: " in result.reason


def test_noninferiority_p_values_are_scipys_one_sided_t_tests():
    d = np.array([0.01, 0.04, -0.02, 0.03, 0.00])
    for margin in (0.02, 0.05, 0.1):
        low, high = length.noninferiority_p(d, margin)
        assert low == pytest.approx(scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue)
        assert high == pytest.approx(scipy_stats.ttest_1samp(d, margin, alternative="greater").pvalue)
    assert length.noninferiority_p(np.array([0.01, 0.01]), 0.05) == (0.0, 1.0)
    assert length.noninferiority_p(np.array([0.2, 0.2]), 0.05) == (1.0, 0.0)
    assert all(math.isnan(p) for p in length.noninferiority_p(np.array([0.01]), 0.05))


def test_the_gate_claim_and_the_declarations():
    reg = length_gate.REGISTRATION
    [c] = reg.contrasts
    assert c.scheme == Arm("unas", (ROPE, "model.gate=headwise")) and c.against == Arm("unas", (ROPE,))
    assert c.length == 4 and c.metric == "test/loss@4" and reg.test == length.SUPERIORITY
    assert [(c.scheme.model, c.against.model, c.length) for c in length_ssmax.REGISTRATION.contrasts] == [
        ("ssmax", "unas", 4), ("ssmax", "unas", 8)] * 2
    with pytest.raises(ValueError, match="at a length not tested"):
        Registration("p", length.SUPERIORITY, (Contrast(Arm("a"), Arm("b"), 16),), 0.05, 0.05, "w")


def test_reproduce_trains_the_pilot_then_the_seeds_its_power_needs(tmp_path, monkeypatch):
    """`python -m attnlab.reproduce`: the pilot first, then (second stage) the seeds its spread
    asks for, and the report; training replaced by records whose answer is known."""
    from attnlab.study.reproduce import cli

    def loss(r, m):
        if r.model != "ssmax":
            return 6.0 + m / 10
        noisy = NONE in r.extra  # SSMax without positions: a pilot too noisy for 3 seeds
        return 6.0 + m / 10 + (0.3 * (-1) ** r.seed if noisy else -0.3 + jitter(r.seed) / 4)

    stages = []

    def train(runs, root, runs_dir, common, jobs, label):
        stages.append(list(runs))
        return {r: record({m: loss(r, m) for m in length.LENGTHS}) for r in stages[-1]}, len(stages[-1])

    monkeypatch.setattr(cli, "train", train)
    # the claim alone (finding every claim imports the tasks' own: tens of seconds on a busy machine)
    monkeypatch.setattr(cli, "all_claims", lambda conf: {length_ssmax.NAME: length_ssmax})
    assert cli.main(["--quick", "--tasks", "lm", "--claims", "length_ssmax", "--out", str(tmp_path)]) == 0
    assert len(stages) == 2 and {r.seed for r in stages[0]} == {1, 2, 3} and len(stages[0]) == 12
    assert {(r.model, NONE in r.extra, r.seed) for r in stages[1]} == {("ssmax", True, 4), ("unas", True, 4)}
    report = (tmp_path / "REPORT.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith(f"| {length_ssmax.TITLE} ("))
    assert "**not tested**: underpowered" in row and "1-4 (pilot 3, cap 4)" in row
