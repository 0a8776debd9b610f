"""REPORT.md, its figures and the W&B run (attnlab.study.compare.writeup) from synthetic records of
every stage of a --full comparison: nothing trains."""

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from compare_fakes import card, plan, record

from attnlab.study.compare.analysis import (
    build_cells,
    exploratory,
    negative_controls,
    primary_family,
    probe_checks,
)
from attnlab.study.compare.plan import MAX_NEEDED
from attnlab.study.compare.probes import MAIN, NEGATIVE, POSITIVE
from attnlab.study.compare.writeup import FOREST, contrast_rows, log_to_wandb, write_report
from attnlab.study.power import paired_power

_NOISE = (0.0, 0.02, -0.01, 0.015, 0.005, -0.005, 0.01, -0.02)


def noise(seed: int) -> float:
    return _NOISE[(seed - 1) % len(_NOISE)]


META = {"command": "python -m attnlab.compare --full", "mode": "full", "commit": "abc1234",
        "started": "2026-01-01_00-00-00", "machine": "a CPU, 2 cores", "load_before": "0.5",
        "load_after": "1.5", "jobs": 2, "trained": 99, "reused": 1, "wall_s": 90.0}
# accuracy by (probe, condition, scheme); a constant cell has a degenerate interval
LEVEL = {("p", MAIN, "unas"): 0.6, ("p", MAIN, "dnas"): 0.85, ("p", MAIN, "hnas"): 0.6,
         ("p", POSITIVE, "unas"): 0.5, ("p", POSITIVE, "dnas"): 0.35,
         ("p", POSITIVE, "hnas"): 0.4, ("p", NEGATIVE, "unas"): 0.9,
         ("p", NEGATIVE, "dnas"): 0.9, ("p", NEGATIVE, "hnas"): 0.9,
         ("e", MAIN, "unas"): 0.5, ("e", MAIN, "dnas"): 0.7, ("e", MAIN, "hnas"): 0.5}
CONSTANT = {("p", POSITIVE, "unas"), ("p", NEGATIVE, "unas"), ("p", NEGATIVE, "dnas"),
            ("p", NEGATIVE, "hnas")}


def accuracy(key, seed):
    if key[1].startswith("sweep"):  # falls with n
        n = int(key[1].split("=")[-1])
        return {"unas": 0.7, "dnas": 0.8, "hnas": 0.6}[key[2]] - n / 100 + noise(seed)
    return LEVEL[key] + (0 if key in CONSTANT else noise(seed))


def a_full_comparison():
    """The stages of cli.main on synthetic records: lr grid, pilot, the rest."""
    p = card("p", schemes=("unas", "dnas", "hnas"), sweep={"probe.options.n": (4, 8, 16)},
             main={"probe.options.n": 8})
    e = card("e", "exploratory", schemes=("unas", "dnas"), positive=None, negative=None)
    pl = plan(p, e, mode="full", registered=["unas", "dnas", "hnas"])
    found = {}
    for run in pl.lr_runs():  # dnas best at 3x, the others at the probe's rate
        lr = next(x for x in run.extra if x.startswith("task.module.optimizer.lr="))
        best = lr.endswith("=0.009") if run.model == "dnas" else lr.endswith("=0.003")
        found[run] = record(run, 0.9 if best else 0.5)
    lrs = pl.choose_lrs(found)

    def finish(runs):
        for run in runs:
            if run in found and run not in pl.lr_runs():
                continue
            key = pl.cell_of(run, lrs)
            if key is None:
                continue
            if key == ("p", MAIN, "hnas") and run.seed == 2:
                found[run] = {"status": "failed", "error": "CUDA out of memory", "metrics": {}}
            elif key == ("p", MAIN, "hnas") and run.seed == 3:
                found[run] = record(run, 0.126)  # did not learn
            else:
                found[run] = record(run, accuracy(key, run.seed))

    finish(pl.main_runs(lrs, pl.pilot_seeds()))
    seeds, power = pl.seeds_needed(found, lrs)
    finish(pl.final_runs(lrs, seeds))
    cells = build_cells(pl, found, lrs)
    primary = primary_family(cells, pl.probes())
    negatives = negative_controls(cells, pl.probes())
    checks = probe_checks(cells, pl, negatives)
    return Comparison(pl, cells, lrs, power, seeds, primary, negatives,
                      exploratory(cells, pl), checks)


class Comparison(NamedTuple):
    """write_report's arguments after out_dir, but the meta."""

    plan: object
    cells: dict
    lrs: dict
    power: list
    seeds: dict
    primary: list
    negatives: list
    explore: list
    checks: dict


class Written(NamedTuple):
    out: Path
    text: str
    parts: Comparison


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    parts = a_full_comparison()
    path = write_report(out, *parts, META)
    return Written(out, path.read_text(), parts)


def section(text: str, title: str) -> list[str]:
    start = text.index(f"\n{title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None].splitlines()


def test_the_report_opens_with_what_ran_and_the_primary_family(report):
    out, text, cells = report.out, report.text, report.parts.cells
    assert text.startswith("# attnlab compare: ")
    assert ("`python -m attnlab.compare --full`: mode **full**, commit abc1234, "
            "2026-01-01_00-00-00") in text
    assert "99 run(s) trained, 1 reused; wall time 1.5 min" in text
    lines = section(text, "## The primary family")
    head = next(x for x in lines if x.startswith("| probe |"))
    assert head.endswith("| pairs (unpaired) | p (Holm) | TOST p (Holm) | verdict | predicted | "
                         "as predicted |")
    rows = [x for x in lines if x.startswith("| p |")]
    assert [x.split(" | ")[1:3] for x in rows] == [["dnas vs unas", "accuracy"],
                                                   ["dnas vs unas", "AUC"],
                                                   ["hnas vs unas", "accuracy"],
                                                   ["hnas vs unas", "AUC"]]
    assert rows[0].endswith("| **better** | better | yes |")
    assert "| 0.856 [0.834, 0.878] |" in rows[0] and "| +0.250 [+0.250, +0.250] |" in rows[0]
    # paired by seed: unas ran the seeds hnas needs, dnas fewer; the unpaired seeds are counted
    primary = report.parts.primary
    for row, r in zip(rows, primary):
        n = f"| {r.result.n} ({r.result.dropped}) |" if r.result.dropped else f"| {r.result.n} |"
        assert n in row
    assert primary[0].result.dropped == cells[("p", MAIN, "unas")].n - cells[("p", MAIN, "dnas")].n > 0
    assert f"![primary contrasts]({FOREST})" in text
    png = (out / FOREST).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_the_mechanism_checks_and_the_negative_controls(report):
    text = report.text
    (row,) = [x for x in section(text, "## Does each probe test its mechanism?")
              if x.startswith("| p |")]
    assert row.startswith("| p | the mechanism of p | 0.300 | 0.85")
    assert "| query competition -> breaks: dnas 0.85" in row and "-> 0.35" in row
    assert row.endswith("| a plain lookup -> ties | yes |")
    (row,) = [x for x in section(text, "## Does each probe test its mechanism?")
              if x.startswith("| e |")]
    assert "| not defined |" in row and row.endswith("| no: the positive control not defined |")
    negatives = [x for x in section(text, "## Negative controls") if x.startswith("| p |")]
    assert len(negatives) == 2 and all(x.endswith("| equivalent | equivalent | yes |")
                                       for x in negatives)
    assert "| 0.900 [0.900, 0.900] | 0.900 [0.900, 0.900] | +0.000 [+0.000, +0.000] |" in (
        negatives[0])


def test_the_power_and_learning_rate_tables(report):
    text, power, seeds = report.text, report.parts.power, report.parts.seeds
    rows = [x for x in section(text, "## Seeds and power") if x.startswith("| p |")]
    assert len(rows) == len(power) == 2 * 2
    for row, p in zip(rows, power):
        assert row.startswith(f"| p | {p.contrast} | ")
        assert f"| {p.pilot_pairs} | {p.pilot_sd:.4f} | {p.sd_used:.4f} | 0.05 | " in row
        scheme, against = p.contrast.split(" vs ")
        ran = min(seeds[("p", MAIN, scheme)], seeds[("p", MAIN, against)])
        power = paired_power(ran, p.effect, p.sd_used, p.alpha)
        verdict = f"{power:.2f}" + (" (underpowered)" if power < 0.8 else "")
        need = f">= {p.seeds}" if p.seeds >= MAX_NEEDED else str(p.seeds)
        assert row.endswith(f"| {p.alpha:.2g} | {need} | {ran} | {verdict} |")
    rows = [x for x in section(text, "## Learning rates") if x.startswith("| p |")]
    assert "| p | dnas | 0.001: 0.500, 0.003: 0.500, **0.009: 0.900** | 0.400 |" in rows
    assert "| p | unas | 0.001: 0.500, **0.003: 0.900**, 0.009: 0.500 | 0.400 |" in rows


def test_the_probe_tables_show_the_baselines_and_who_learned(report):
    text, pl, cells = report.text, report.parts.plan, report.parts.cells
    lines = text[text.index("### p (primary)"):text.index("#### p: diagnostics")].splitlines()
    assert "Mechanism: the mechanism of p." in lines
    assert "| main | *trivial baseline* | 0.125 |  |  |  |" in lines
    assert "| main | *shortcut* | 0.300 |  |  |  |" in lines
    hnas = cells[("p", MAIN, "hnas")]
    assert hnas.n - hnas.learned_count == 1 and hnas.failed
    (row,) = [x for x in lines if x.startswith("| main | hnas |")]
    assert row.endswith(f"| {hnas.n - 1} of {hnas.n} ⚠ | 0.003 |")
    (row,) = [x for x in lines if x.startswith("| main | dnas |")]
    n = cells[("p", MAIN, "dnas")].n
    assert row.endswith(f"| {n} of {n} | 0.009 |") and "⚠" not in row
    assert ("| positive control | unas | 0.500 [0.500, 0.500] | 0.450 [0.450, 0.450] | "
            f"{pl.settings.control_seeds} of {pl.settings.control_seeds} | 0.003 |") in lines
    assert any(x.startswith("| sweep: n=16 | dnas | 0.6") for x in lines)
    assert "| negative control | *trivial baseline* | 0.125 |  |  |  |" in lines
    assert "- p / main / hnas: seed 2: CUDA out of memory" in section(
        text, "## Runs that did not finish")
    diag = text[text.index("#### p: diagnostics"):].splitlines()
    head = diag[2].strip("| ").split(" | ")
    row = dict(zip(head, next(x for x in diag if x.startswith("| dnas |")).strip("| ").split(" | ")))
    assert row == row | {"scheme": "dnas", "min col sum x S": "10", "share < 1e-8": "0",
                         "entropy (nats)": "2", "head JSD": "0.03", "head distance": "0.7",
                         "collision rate": "—"}
    assert "hnas_u" not in head  # no run reported a scheme parameter: no such column


def test_the_sweep_figure_and_the_exploratory_table(report):
    out, text = report.out, report.text
    assert "![p sweep](sweep_p.png)" in text and not (out / "sweep_e.png").exists()
    assert (out / "sweep_p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = section(text, "## Exploratory")
    assert ("| probe | contrast | outcome | scheme [95% CI] | against [95% CI] | difference "
            "[95% CI] | d_z | P(scheme > against) | pairs (unpaired) |") in lines
    rows = [x for x in lines if x.startswith("| e |")]
    assert [x.split(" | ")[1] for x in rows] == ["dnas vs unas", "hnas vs unas"]
    assert "| +0.200 [+0.200, +0.200] |" in rows[0] and "p (Holm)" not in "\n".join(lines)
    assert all(x.count(" | ") == 8 for x in rows)  # 9 columns: no p, no verdict
    assert "better" not in "\n".join(rows)  # no verdict for what was not pre-registered


def test_a_quick_report_has_no_sweeps_and_no_rates_without_a_grid(tmp_path):
    p = card("p", schemes=("unas", "dnas"), contrasts=(("dnas", "unas", "better"),),
             sweep={"probe.options.n": (4, 8)}, main={"probe.options.n": 8})
    pl = plan(p, lr_grid=False, seeds=2)
    lrs = pl.choose_lrs({})
    found = {}
    seeds, power = pl.seeds_needed({}, lrs)
    for run in pl.final_runs(lrs, seeds):
        found[run] = record(run, 0.5 + noise(run.seed))
    cells = build_cells(pl, found, lrs)
    text = write_report(tmp_path, pl, cells, lrs, power, seeds, primary_family(cells, [p]),
                        [], [], probe_checks(cells, pl, []), META).read_text()
    assert "## Learning rates" not in text and "## Seeds and power" not in text
    assert "sweep:" not in text and "sweep_" not in text and not list(tmp_path.glob("sweep_*"))
    assert "## Runs that did not finish" not in text and "## Negative controls" not in text
    empty = write_report(tmp_path, pl, {}, lrs, [], seeds, [], [], [], {}, META).read_text()
    assert "No primary contrast was run." in empty


def test_contrast_rows_escape_and_mark_missing_numbers(report):
    primary = report.parts.primary
    lines = contrast_rows(primary[:1], verdicts=False)
    assert len(lines) == 3 and lines[1] == "|" + "---|" * 9


def test_the_wandb_run_holds_the_table_the_figures_and_the_report(report, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out, primary = report.out, report.parts.primary
    for name in ("REPORT.md", FOREST, "sweep_p.png"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    run_dir = Path(log_to_wandb(tmp_path, primary, META))
    assert run_dir.name.startswith("offline-run-") and run_dir.parent.parent == tmp_path
    files = run_dir / "files"
    assert (files / "REPORT.md").read_text() == (out / "REPORT.md").read_text()
    (table,) = (files / "media" / "table" / "compare").glob("primary_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"][:4] == ["probe", "contrast", "outcome", "difference"]
    assert len(data["data"]) == len(primary) == 4
    row = next(r for r in data["data"] if r[1:3] == ["dnas vs unas", "test/acc"])
    assert row[3] == pytest.approx(primary[0].result.difference)
    assert row[-2:] == ["better", "better"]
    images = {p.name.split("_")[0] for p in (files / "media" / "images" / "compare").glob("*.png")}
    assert images == {"effects", "sweep"}


def test_the_sweeps_points_include_main_at_its_own_values():
    from attnlab.study.compare.writeup import sweep_points

    c = card(sweep={"probe.options.k": (2, 3, 4), "probe.options.f": (0.0, 0.5)},
             main={"probe.options.k": 3, "probe.options.f": 0.0},
             modes={"gpu": ("probe.options.k=8",)})
    points = sweep_points(c, plan(c, mode="full"))
    assert len(points) == 6 and points[-1] == (MAIN, {"probe.options.k": 3, "probe.options.f": 0.0})
    assert ("sweep: k=3, f=0.0", {"probe.options.k": "3", "probe.options.f": "0.0"}) not in points
    assert ("sweep: k=3, f=0.5", {"probe.options.k": "3", "probe.options.f": "0.5"}) in points
    gpu = sweep_points(c, plan(c, mode="gpu"))  # main is k=8: every grid point, and main
    assert len(gpu) == 7 and gpu[-1] == (MAIN, {"probe.options.k": 8, "probe.options.f": 0.0})
    assert sweep_points(c, plan(c)) == []  # quick: no sweep
