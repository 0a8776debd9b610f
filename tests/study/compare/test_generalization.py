"""`python -m attnlab.compare --generalization` (attnlab.study.compare.generalization) on
synthetic run records: the points per test size (a grid's other options averaged within each run),
their intervals against attnlab.study.stats directly, the table, the report and its PNG, and the
command's runs and refusals without training."""

import math
from pathlib import Path

import numpy as np
import pytest

from attnlab.study import stats
from attnlab.study.compare import cli, generalization
from attnlab.study.compare.plan import ComparePlan
from attnlab.study.compare.probes import ProbeCard

GRID = {"length": (128, 256, 512), "depth": (0.0, 1.0)}
CARD = ProbeCard(name="needle", mechanism="long-range retrieval", family="exploratory", lr=3e-3,
                 schemes=("unas", "ssmax"), contrasts=(), min_effect=0.05, margin=0.03,
                 positive=None, negative=None, test_options=GRID)


def plan() -> ComparePlan:
    return ComparePlan(Path("."), "quick", {"needle": CARD}, ["ssmax", "unas", "sigmoid"])


def acc(scheme: str, seed: int, length: int, depth: float) -> float:
    """A made-up accuracy that falls with length and differs by seed, depth and scheme."""
    return (0.9 if scheme == "unas" else 0.8) * 128 / length + 0.01 * seed - 0.05 * depth


def records(failed: tuple = ()) -> dict:
    out = {}
    for scheme in ("unas", "ssmax"):
        for seed in (1, 2, 3):
            metrics = {"test/acc": 0.95 + 0.01 * seed, "test/target_mass": 0.5}
            for length in GRID["length"]:
                for depth in GRID["depth"]:
                    cell = f"length={length},depth={depth}"
                    metrics[f"test/acc@{cell}"] = acc(scheme, seed, length, depth)
                    metrics[f"test/target_mass@{cell}"] = 0.4 - 0.1 * depth + 0.001 * seed
            status = "failed" if (scheme, seed) in failed else "ok"
            out[generalization.run(plan(), CARD, scheme, seed)] = {"status": status,
                                                                   "metrics": metrics}
    return out


def test_each_point_is_the_seeds_mean_with_stats_t_interval():
    found = generalization.collect(plan(), records(failed=(("ssmax", 3),)), seeds=3)["needle"]
    by = {(p.scheme, p.metric, p.size): p for p in found}
    for scheme, seeds in (("unas", (1, 2, 3)), ("ssmax", (1, 2))):  # the failed run left out
        for length in GRID["length"]:
            per_seed = [np.mean([acc(scheme, s, length, d) for d in GRID["depth"]]) for s in seeds]
            point = by[(scheme, "acc", length)]
            assert point.values == pytest.approx(per_seed)
            assert point.mean == pytest.approx(np.mean(per_seed))
            assert point.interval == pytest.approx(stats.t_interval(per_seed))
        masses = by[(scheme, "target_mass", 512)].values
        assert masses == pytest.approx([0.35 + 0.001 * s for s in seeds])
        assert by[(scheme, "acc", "trained")].values == pytest.approx([0.95 + 0.01 * s for s in seeds])


def test_a_run_missing_a_cell_is_left_out_of_that_size_only():
    given = records()
    run = generalization.run(plan(), CARD, "unas", 2)
    del given[run]["metrics"]["test/acc@length=512,depth=1.0"]
    found = generalization.collect(plan(), given, seeds=3)["needle"]
    by = {(p.scheme, p.metric, p.size): p for p in found}
    assert len(by[("unas", "acc", 512)].values) == 2
    assert len(by[("unas", "acc", 256)].values) == 3


def test_the_table_shows_mean_and_interval_per_size():
    found = generalization.collect(plan(), records(), seeds=3)["needle"]
    lines = generalization.table(CARD, found)
    assert lines[0] == ("| scheme | metric | seeds | learned | trained | length=128 | "
                        "length=256 | length=512 |")
    row = next(line for line in lines if line.startswith("| ssmax | accuracy |"))
    per_seed = [np.mean([acc("ssmax", s, 256, d) for d in GRID["depth"]]) for s in (1, 2, 3)]
    low, high = stats.t_interval(per_seed)
    assert f"{np.mean(per_seed):.3f} [{low:.3f}, {high:.3f}]" in row.split(" | ")[6]
    assert row.split(" | ")[2] == "3" and row.split(" | ")[3] == ""  # no shortcut reported
    assert len([line for line in lines if line.startswith("| ")]) == 1 + 4  # head, 2 x 2 rows


def with_shortcut(given: dict, shortcut: float) -> dict:
    """The records with the probe's shortcut at `shortcut` on every cell and chance 1/16."""
    for record in given.values():
        metrics = record["metrics"]
        for key in [k for k in metrics if k.startswith("test/acc")]:
            metrics[key.replace("test/acc", "test/shortcut_acc")] = shortcut
        metrics["test/baseline_acc"] = 1 / 16
    return given


def test_a_scheme_at_its_shortcut_is_labelled_did_not_learn(tmp_path):
    """test/acc is 0.96-0.98: a shortcut of 0.97 is beaten by seed 3 alone; one of 0.99 by none,
    which labels the scheme in the table and the figure; the shortcut gets its own row."""
    found = generalization.collect(plan(), with_shortcut(records(), 0.97), seeds=3)["needle"]
    row = next(line for line in generalization.table(CARD, found)
               if line.startswith("| unas | accuracy |"))
    assert row.split(" | ")[3] == "1/3"
    found = generalization.collect(plan(), with_shortcut(records(), 0.99), seeds=3)["needle"]
    lines = generalization.table(CARD, found)
    row = next(line for line in lines if line.startswith("| unas | accuracy |"))
    assert row.split(" | ")[3] == "0/3 (did not learn)"
    shortcut = next(line for line in lines if line.startswith("| unas | shortcut accuracy |"))
    assert shortcut.split(" | ")[4] == "0.990 [0.990, 0.990]"
    assert generalization.did_not_learn(next(p for p in found if p.scheme == "unas"
                                             and p.metric == "acc" and p.size == "trained"))


def test_the_report_has_a_table_and_the_curves(tmp_path):
    found = generalization.collect(plan(), records(), seeds=3)
    meta = {"command": "python -m attnlab.compare --generalization", "mode": "quick",
            "commit": "abc", "machine": "test", "wall_s": 60.0, "trained": 6, "reused": 0}
    report = generalization.write_report(tmp_path, plan(), found, meta).read_text()
    assert "## needle" in report and "| unas | accuracy | 3 |" in report
    assert "![needle](generalization_needle.png)" in report
    assert (tmp_path / "generalization_needle.png").stat().st_size > 1000


def test_one_seed_gives_a_point_without_interval():
    point = generalization.Point("needle", "unas", "acc", 128, (0.7,))
    assert point.mean == 0.7 and all(math.isnan(x) for x in point.interval)
    assert generalization._cell(point) == "0.700"


@pytest.mark.slow  # ~4 s: composes the needle probe's config
def test_the_command_trains_one_run_per_scheme_and_seed(tmp_path, capsys):
    """--dry-run: the quick default is needle, its schemes, two seeds, at its own rate, two
    epochs and 128 test rows a cell."""
    assert cli.main(["--generalization", "--dry-run", "--jobs", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "train.py" in line]
    assert lines and all("probe=needle" in line and "seed=1,2" in line for line in lines)
    models = ",".join(line.split("model=")[1].split()[0] for line in lines).split(",")
    assert sorted(models) == ["sigmoid", "ssmax", "unas"]
    assert all("task.module.optimizer.lr=0.003" in line for line in lines)
    assert all("trainer.max_epochs=2 probe.n_test=128" in line for line in lines)
    # a variant asked for by name trains its own epochs (2 leave it at its shortcut)
    assert cli.main(["--generalization", "--probes", "needle_multikey", "--dry-run", "--jobs", "1",
                     "--out", str(tmp_path / "variant")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "train.py" in line]
    assert lines and all("probe.n_test=128" in line and "max_epochs" not in line for line in lines)


def test_a_probe_without_test_options_is_one_error_line(tmp_path, capsys):
    assert cli.main(["--generalization", "--probes", "listops", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --generalization: none of listops declares test_options")
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()
