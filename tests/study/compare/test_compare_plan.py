"""What a comparison trains, stage by stage (attnlab.study.compare.plan), on synthetic cards and
records: the learning-rate grid and the rate each scheme keeps, the pilot's seeds for power, the
final runs, and every run back to its cell."""

import dataclasses
import math

import numpy as np
import pytest
from compare_fakes import card, condition, plan, record, records
from helpers.paths import ROOT

from attnlab.study.compare.plan import (
    ALPHA,
    COMMON,
    LR_FACTORS,
    MAX_NEEDED,
    OUTCOMES,
    POWER,
    SD_FLOOR,
    SETTINGS,
    TASK,
    discover,
    lr_text,
)
from attnlab.study.compare.probes import MAIN, NEGATIVE, POSITIVE, Condition, Control
from attnlab.study.evidence import Run
from attnlab.study.power import seeds_for_power

LR = 3e-3


def lr_of(run: Run) -> str:
    (text,) = [e.split("=", 1)[1] for e in run.extra if e.startswith("task.module.optimizer.lr=")]
    return text


def test_schemes_and_probes_are_the_config_files(tmp_path):
    (tmp_path / "probe").mkdir()
    for name in ("zeta", "alpha"):
        (tmp_path / "probe" / f"{name}.yaml").write_text(f"probe:\n  name: {name}\n")
    (tmp_path / "probe" / "notes.txt").write_text("not a probe")
    assert discover(tmp_path, "probe") == ["alpha", "zeta"]
    assert discover(tmp_path, "model") == []
    assert COMMON[0] == "logger=csv" and TASK == "probe" and OUTCOMES == ("test/acc", "val/acc_auc")


def test_schemes_for_puts_unas_first_and_keeps_what_schemes_keeps():
    c = card(schemes=("dnas", "unas", "hnas"))
    bare = card("bare", schemes=())
    assert plan(c).schemes_for(c) == ["unas", "dnas", "hnas"]
    assert plan(card(schemes=("dnas",))).schemes_for(card(schemes=("dnas",))) == ["unas", "dnas"]
    assert plan(bare).schemes_for(bare) == ["unas", "dnas", "hnas", "sinkhorn"]  # every scheme
    assert plan(c, mode="full").schemes_for(c) == ["unas", "dnas", "hnas", "sinkhorn"]
    # --schemes keeps its schemes of the card's; UNAS stays, even when not asked for
    assert plan(c, schemes=["hnas", "sinkhorn"]).schemes_for(c) == ["unas", "hnas"]
    assert plan(c, schemes=["hnas"], mode="full").schemes_for(c) == ["unas", "hnas"]
    assert plan(c, schemes=["unas"]).schemes_for(c) == ["unas"]
    # the probes' attention is not causal: a causal-only scheme is never planned on them
    everything = ["unas", "dnas", "sink", "stickbreaking", "mar"]
    assert plan(bare, registered=everything).schemes_for(bare) == ["unas", "dnas", "sink", "mar"]
    # a contrast whose schemes do not both run is left out, of the family's size too
    assert [s.name for s in plan(c, schemes=["hnas"]).contrasts(c)] == ["hnas vs unas"]
    assert plan(c).family_size() == 2 * 2 and plan(c, schemes=["hnas"]).family_size() == 1 * 2
    assert plan(c, card("e", "exploratory")).family_size() == 4  # exploratory: not in it


def test_quick_runs_the_primary_probes_full_every_probe():
    p, e = card("p"), card("e", "exploratory")
    assert [c.name for c in plan(p, e).probes()] == ["p"]
    assert [c.name for c in plan(p, e, mode="full").probes()] == ["p", "e"]
    assert SETTINGS["quick"].sweep_seeds == 0 < SETTINGS["full"].sweep_seeds


def test_a_run_carries_the_probe_the_mode_the_condition_the_rate_and_the_overrides():
    c = card(modes={"full": ("probe.options.n=64",), "gpu": ("probe.n_train=65536",)})
    positive = Condition(POSITIVE, ("probe.options.a_queries=false",))
    quick = plan(c, extra=("trainer.max_epochs=1",)).run(c, positive, "dnas", 2, LR / 3)
    assert quick == Run("probe", "dnas", 2, ("probe=p", "probe.options.a_queries=false",
                                              "task.module.optimizer.lr=0.001",
                                              "trainer.max_epochs=1"))
    assert plan(c, mode="full").run(c, Condition(MAIN), "unas", 1, LR).extra == (
        "probe=p", "probe.options.n=64", "task.module.optimizer.lr=0.003")
    assert plan(c, mode="gpu").run(c, Condition(MAIN), "unas", 1, LR).extra == (
        "probe=p", "hardware=gpu", "probe.n_train=65536", "task.module.optimizer.lr=0.003")


def test_lr_runs_are_three_rates_around_the_probes_own_times_lr_seeds():
    p, q = card("p"), card("q", lr=1e-2, schemes=("unas", "dnas"))
    quick = plan(p, q).lr_runs()
    assert len(quick) == (3 + 2) * 3 * SETTINGS["quick"].lr_seeds
    assert {lr_of(r) for r in quick if "probe=p" in r.extra} == {"0.001", "0.003", "0.009"}
    assert {lr_of(r) for r in quick if "probe=q" in r.extra} == {"0.00333", "0.01", "0.03"}
    assert {r.seed for r in quick} == {1} and {r.model for r in quick} == {"unas", "dnas", "hnas"}
    assert all(r.extra[1:-1] == () for r in quick)  # the main setting: no condition overrides
    full = plan(p, mode="full").lr_runs()
    assert len(full) == 4 * 3 * 2 and {r.seed for r in full} == {1, 2}
    assert len(set(full)) == len(full)
    assert plan(p, lr_grid=False).lr_runs() == []
    assert LR_FACTORS == (1 / 3, 1.0, 3.0) and lr_text(LR / 3) == "0.001"


def grid_records(p, values: dict, status: str = "ok") -> dict:
    """{(scheme, lr factor): [optimized value of seed 1, 2, ...]} as the lr stage's records."""
    c = next(iter(p.cards.values()))
    out = {}
    for (scheme, factor), accs in values.items():
        for seed, acc in enumerate(accs, 1):
            run = p.run(c, Condition(MAIN), scheme, seed, c.lr * factor)
            out[run] = record(run, acc) | {"status": status}
    return out


def test_choose_lrs_keeps_the_best_mean_validation_accuracy():
    c = card(schemes=("unas", "dnas", "hnas"))
    p = plan(c, mode="full")  # two seeds per rate
    found = grid_records(p, {
        # unas: 3x is best on mean (0.6 > 0.5), not on its best seed (0.9 at 1/3)
        ("unas", 1 / 3): [0.9, 0.1], ("unas", 1.0): [0.4], ("unas", 3.0): [0.6, 0.6],
        # dnas: a tie of 1/3 and the probe's own rate: the probe's own
        ("dnas", 1 / 3): [0.7, 0.7], ("dnas", 1.0): [0.7, 0.7], ("dnas", 3.0): [0.2, 0.2],
        # hnas: nothing finished at the probe's rate
        ("hnas", 1 / 3): [0.3, 0.3], ("hnas", 3.0): [0.5, 0.4]})
    # failed runs are ignored, even with a value; so is a run without one
    found |= grid_records(p, {("hnas", 1.0): [0.99, 0.99]}, "failed")
    run = p.run(c, Condition(MAIN), "unas", 2, LR)
    found[run] = record(run, 0.99) | {"status": "failed"}
    run = p.run(c, Condition(MAIN), "dnas", 1, LR / 3)
    found[run] = found[run] | {"optimized_value": None}
    lrs = p.choose_lrs(found)
    assert lrs[("p", "unas")].lr == pytest.approx(3 * LR)
    assert lrs[("p", "unas")].means == pytest.approx({LR / 3: 0.5, LR: 0.4, 3 * LR: 0.6})
    assert lrs[("p", "dnas")].lr == LR and lrs[("p", "dnas")].means[LR / 3] == 0.7  # seed 2 only
    assert lrs[("p", "hnas")].lr == pytest.approx(3 * LR)
    assert math.isnan(lrs[("p", "hnas")].means[LR])
    # nothing finished at all: the probe's rate
    assert {k: v.lr for k, v in p.choose_lrs({}).items()} == {  # --full: every scheme
        ("p", "unas"): LR, ("p", "dnas"): LR, ("p", "hnas"): LR, ("p", "sinkhorn"): LR}
    # no grid: the probe's rate, whatever the records say
    assert plan(c, lr_grid=False).choose_lrs(found)[("p", "unas")].lr == LR


def pilot(values: dict, **kw):
    """A quick plan of one primary probe (dnas, hnas, sinkhorn against unas) and its pilot's
    records: {scheme: [(acc, auc) of seed 1, 2, 3]}."""
    c = card(schemes=("unas", "dnas", "hnas", "sinkhorn"),
             contrasts=(("sinkhorn", "unas", "better"), ("dnas", "unas", "better"),
                        ("hnas", "unas", "equivalent")), **kw)
    p = plan(c)
    # a cap of 10 whatever quick's is: the numbers below are chosen against it
    p.settings = dataclasses.replace(p.settings, max_seeds=10)
    lrs = p.choose_lrs({})
    return p, lrs, records(p, lrs, {("p", MAIN, s): v for s, v in values.items()})


UNAS = [(0.60, 0.50), (0.62, 0.52), (0.64, 0.50)]
PILOT = {
    "unas": UNAS,
    # accuracy differences 0.10, 0.13, 0.07 (s.d. 0.03); AUC differences 0.1 each (s.d. 0)
    "dnas": [(0.70, 0.60), (0.75, 0.62), (0.71, 0.60)],
    # identical differences (0.02): a spread of (nearly) 0, floored
    "hnas": [(a + 0.02, b + 0.02) for a, b in UNAS],
    # a wide spread: more than the cap needs
    "sinkhorn": [(0.30, 0.50), (0.90, 0.52), (0.50, 0.50)],
}


def test_seeds_for_power_from_the_pilots_paired_differences():
    p, lrs, found = pilot(PILOT)
    settings = p.settings
    cells, rows = p.seeds_needed(found, lrs)
    alpha = ALPHA / (3 * 2)  # Bonferroni over the family: 3 contrasts x 2 outcomes
    assert len(rows) == 3 * 2 and [r.alpha for r in rows] == pytest.approx([alpha] * 6)
    by = {(r.contrast, r.outcome): r for r in rows}
    for (contrast, outcome), row in by.items():
        scheme = contrast.split(" vs ")[0]
        i = OUTCOMES.index(outcome)
        d = [a[i] - b[i] for a, b in zip(PILOT[scheme], UNAS)]
        assert row.pilot_pairs == 3 and row.pilot_sd == pytest.approx(np.std(d, ddof=1))
        assert row.sd_used == pytest.approx(max(np.std(d, ddof=1), SD_FLOOR))
        assert row.effect == 0.05 and row.probe == "p"
        assert row.seeds == seeds_for_power(0.05, row.sd_used, alpha, POWER, minimum=2,
                                            maximum=MAX_NEEDED)  # what is needed, not the cap
    # the floor: a spread of ~0 counts as 0.01 (the seeds 0 would give: 2)
    assert by[("hnas vs unas", "test/acc")].sd_used == SD_FLOOR
    floored = by[("hnas vs unas", "test/acc")].seeds
    assert floored == seeds_for_power(0.05, SD_FLOOR, alpha, POWER, minimum=2, maximum=10)
    assert floored > seeds_for_power(0.05, 0.0, alpha, POWER, minimum=2) == 2
    # more than the cap: reported as needed, run at the cap
    assert by[("sinkhorn vs unas", "test/acc")].seeds > settings.max_seeds
    # a cell: the most any of its contrasts needs, never fewer than the pilot's seeds
    need = {s: max(by[(f"{s} vs unas", o)].seeds for o in OUTCOMES) for s in ("dnas", "hnas")}
    assert 3 < need["dnas"] < settings.max_seeds  # neither the pilot's nor the cap
    assert cells == {("p", MAIN, "dnas"): need["dnas"], ("p", MAIN, "hnas"): max(3, need["hnas"]),
                     ("p", MAIN, "sinkhorn"): settings.max_seeds,
                     ("p", MAIN, "unas"): settings.max_seeds}


def test_the_family_size_is_what_runs():
    """--schemes dnas: one contrast x 2 outcomes is the family (alpha 0.025, not 0.05 / 6)."""
    c = card(schemes=("unas", "dnas", "hnas", "sinkhorn"),
             contrasts=(("dnas", "unas", "better"), ("hnas", "unas", "equivalent"),
                        ("sinkhorn", "unas", "better")))
    p = plan(c, schemes=["dnas"])
    lrs = p.choose_lrs({})
    found = records(p, lrs, {("p", MAIN, s): PILOT[s] for s in ("unas", "dnas")})
    cells, rows = p.seeds_needed(found, lrs)
    assert {r.contrast for r in rows} == {"dnas vs unas"} and [r.alpha for r in rows] == pytest.approx([0.025] * 2)
    assert set(cells) == {("p", MAIN, "unas"), ("p", MAIN, "dnas")}


def test_a_cell_never_runs_fewer_seeds_than_the_pilot():
    """A large minimum effect needs 2 seeds; the cells keep the pilot's 3."""
    c = card(schemes=("unas", "dnas"), contrasts=(("dnas", "unas", "better"),), min_effect=0.3)
    p = plan(c)
    lrs = p.choose_lrs({})
    found = records(p, lrs, {("p", MAIN, "unas"): PILOT["unas"], ("p", MAIN, "dnas"): PILOT["hnas"]})
    cells, rows = p.seeds_needed(found, lrs)
    assert {r.seeds for r in rows} == {2} and set(cells.values()) == {3}


def test_failed_pilot_runs_leave_their_pair_out():
    values = dict(PILOT)
    values["dnas"] = [PILOT["dnas"][0], None, PILOT["dnas"][2]]  # seed 2 failed
    values["hnas"] = [PILOT["hnas"][0], None, None]  # one pair: no spread
    p, lrs, found = pilot(values)
    cells, rows = p.seeds_needed(found, lrs)
    by = {(r.contrast, r.outcome): r for r in rows}
    assert by[("dnas vs unas", "test/acc")].pilot_pairs == 2
    assert by[("dnas vs unas", "test/acc")].pilot_sd == pytest.approx(np.std([0.10, 0.07], ddof=1))
    row = by[("hnas vs unas", "test/acc")]
    assert row.pilot_pairs == 1 and math.isnan(row.pilot_sd) and math.isnan(row.sd_used)
    assert row.seeds == MAX_NEEDED  # unknown spread: as many as reported at most
    assert cells[("p", MAIN, "hnas")] == p.settings.max_seeds  # run: the cap


def test_fixed_seeds_and_exploratory_probes_skip_the_power_computation():
    p, lrs, found = pilot(PILOT)
    fixed = plan(*p.cards.values(), seeds=4)
    cells, rows = fixed.seeds_needed(found, lrs)
    assert rows == [] and set(cells.values()) == {4} and len(cells) == 4
    assert fixed.pilot_seeds() == 4 and p.pilot_seeds() == SETTINGS["quick"].pilot_seeds
    e = card("e", "exploratory")
    cells, rows = plan(e, mode="full").seeds_needed({}, plan(e, mode="full").choose_lrs({}))
    assert rows == [] and set(cells.values()) == {SETTINGS["full"].pilot_seeds}


def test_final_runs_top_up_main_and_add_the_controls_and_the_sweeps():
    c = card(sweep={"probe.options.n": (4, 8)}, main={"probe.options.n": 4})
    quick = plan(c)
    lrs = quick.choose_lrs({})
    seeds = {("p", MAIN, "unas"): 7, ("p", MAIN, "dnas"): 7, ("p", MAIN, "hnas"): 3}

    def count(p, runs, name, scheme):
        extra = p.run(c, condition(p, "p", name), scheme, 1, LR).extra
        return sorted(r.seed for r in runs if r.model == scheme and r.extra == extra)

    runs = quick.final_runs(lrs, seeds)
    controls = quick.settings.control_seeds
    assert len(runs) == len(set(runs)) == 7 + 7 + 3 + 3 * controls * 2  # no sweep in quick
    assert count(quick, runs, MAIN, "unas") == list(range(1, 8))
    assert count(quick, runs, MAIN, "hnas") == [1, 2, 3]
    assert count(quick, runs, POSITIVE, "dnas") == count(quick, runs, NEGATIVE, "hnas") == list(
        range(1, controls + 1))
    # the pilot's runs are among them, the same runs (trained once)
    assert set(quick.main_runs(lrs, quick.pilot_seeds())) <= set(runs)
    full = plan(c, mode="full")
    lrs = full.choose_lrs({})
    sweep = full.settings.sweep_seeds
    runs = full.final_runs(lrs, {k: 3 for k in seeds} | {("p", MAIN, "sinkhorn"): 3})
    assert len(runs) == 4 * (3 + 2 * full.settings.control_seeds + sweep)  # n=4 is main
    assert count(full, runs, "sweep: n=8", "sinkhorn") == list(range(1, sweep + 1))
    assert count(full, runs, NEGATIVE, "sinkhorn") == list(range(1, full.settings.control_seeds + 1))
    # --seeds: every cell
    fixed = plan(c, mode="full", seeds=2)
    runs = fixed.final_runs(lrs, fixed.seeds_needed({}, lrs)[0])
    assert len(runs) == 4 * 4 * 2 and {r.seed for r in runs} == {1, 2}


def test_every_run_maps_back_to_its_cell():
    c = card(sweep={"probe.options.n": (1, 4, 8)}, main={"probe.options.n": 8},
             negative=Control(("probe.options.n=1",), "one item"))
    p = plan(c, mode="full")
    grid = {run: record(run, 0.5) for run in p.lr_runs()}
    lrs = p.choose_lrs(grid | {r: record(r, 0.9) for r in grid if lr_of(r) == "0.009"})
    assert [v.lr for v in lrs.values()] == pytest.approx([3 * LR] * 4)
    seeds = {("p", MAIN, s): 3 for s in p.schemes_for(c)}
    for run in p.final_runs(lrs, seeds):
        cells = p.cells_of(run, lrs)
        probe, name, scheme = cells[0]
        assert p.cell_of(run, lrs) == cells[0] and (probe, scheme) == ("p", run.model)
        assert run == p.run(c, condition(p, "p", name), scheme, run.seed, 3 * LR)
    # the lr stage's runs: at the chosen rate they are main's, at another rate no cell's
    for run in grid:
        expected = ("p", MAIN, run.model) if lr_of(run) == "0.009" else None
        assert p.cell_of(run, lrs) == expected
    assert p.cell_of(Run("probe", "dnas", 1, ("probe=other",)), lrs) is None
    # the negative control is also the sweep's point n=1: one run, both cells
    run = p.run(c, condition(p, "p", NEGATIVE), "dnas", 2, 3 * LR)
    assert p.cells_of(run, lrs) == [("p", NEGATIVE, "dnas"), ("p", "sweep: n=1", "dnas")]


def test_the_main_setting_follows_the_mode():
    c = card(sweep={"probe.options.n": (4, 8, 16)}, main={"probe.options.n": 8},
             modes={"gpu": ("probe.options.n=64", "probe.n_train=100")})
    assert plan(c, mode="full").main_setting(c) == {"probe.options.n": 8}
    assert plan(c, mode="gpu").main_setting(c) == {"probe.options.n": 64}
    assert [x.name for x in plan(c, mode="full").conditions(c)][3:] == ["sweep: n=4",
                                                                        "sweep: n=16"]
    assert [x.name for x in plan(c, mode="gpu").conditions(c)][3:] == [
        "sweep: n=4", "sweep: n=8", "sweep: n=16"]
    assert [x.name for x in plan(c).conditions(c)] == [MAIN, POSITIVE, NEGATIVE]


def test_docs_state_the_seed_caps_the_code_uses():
    """docs/compare.md's caps are SETTINGS' (a held-out review found 10 and 4 there, 8 and 3 here)."""
    text = " ".join((ROOT / "docs" / "compare.md").read_text().split())
    quick, full = SETTINGS["quick"], SETTINGS["full"]
    assert f"up to the mode's cap (quick {quick.max_seeds}, full {full.max_seeds}:" in text
    assert f"each control at {quick.control_seeds} seeds (full {full.control_seeds})" in text
