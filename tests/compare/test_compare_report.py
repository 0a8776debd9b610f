"""attnlab.compare from finished runs to REPORT.md, without training: the cells' statistics
against scipy, "did not learn" kept out of the verdicts, the diagnostics, the heatmap, and the
command end to end on faked runs (resumed by a second invocation)."""

import json
from pathlib import Path

import pytest
from scipy import stats

from attnlab.cards import task_cards
from attnlab.compare import __main__ as compare_main
from attnlab.compare.cells import Keys, build_cells, keys_for
from attnlab.compare.plan import COMMON, Run
from attnlab.compare.writeup import HEATMAP, heatmap, write_report
from attnlab.comparison_stats import BETTER, NO_DIFFERENCE, WORSE, holm

KEYS = Keys("test/acc", "test/baseline_acc", True)
BASE = 0.25  # chance on the faked probes


def record(acc, baseline=BASE, status="ok", layers=2, u=None):
    metrics = {"test/acc": acc, "val/acc": acc, "test/baseline_acc": baseline, "val/baseline_acc": baseline,
               "test/avg_jsd": 0.3, "test/head_distance": 1.5}
    for layer in range(layers):
        metrics |= {f"explained_away/layer{layer}/min_col_sum_times_S": 0.5 + layer,
                    f"explained_away/layer{layer}/share_below_1e-08": 0.0,
                    f"explained_away/layer{layer}/entropy": 2.0 + layer}
    return {"status": status, "metrics": metrics if status == "ok" else {}, "hnas_u": u or {},
            "error": None if status == "ok" else "boom"}


# per (probe, scheme): the metric by seed 1..4
ACC = {
    ("recall", "unas"): [0.60, 0.64, 0.58, 0.62],
    ("recall", "dnas"): [0.70, 0.75, 0.69, 0.73],  # clearly better
    ("recall", "hnas"): [0.61, 0.63, 0.59, 0.64],  # indistinguishable
    ("recall", "sinkhorn"): [0.40, 0.42, 0.38, 0.41],  # clearly worse
    ("coverage", "unas"): [0.50, 0.55, 0.52, 0.51],
    ("coverage", "dnas"): [0.26, 0.25, 0.24, 0.25],  # did not learn: never a verdict
    ("coverage", "hnas"): [0.60, 0.25, 0.58, 0.59],  # one seed did not learn
    ("coverage", "sinkhorn"): [0.52, 0.57, 0.50, 0.55],
}


def fake_records(acc=ACC):
    return {Run(p, s, seed): record(v) for (p, s), values in acc.items() for seed, v in enumerate(values, 1)}


def test_cells_match_scipy_and_holm_and_skip_what_did_not_learn():
    cells = build_cells(fake_records(), KEYS)
    mean, se = cells["recall", "dnas"].mean_se
    assert mean == pytest.approx(0.7175) and se == pytest.approx(stats.sem(ACC["recall", "dnas"]))
    tested = [("recall", "dnas"), ("recall", "hnas"), ("recall", "sinkhorn"), ("coverage", "sinkhorn")]
    p = [stats.ttest_rel(ACC[c], ACC[c[0], "unas"]).pvalue for c in tested]
    for cell, p_value, adjusted in zip(tested, p, holm(p)):
        comparison = cells[cell].comparison
        assert comparison.p_value == pytest.approx(p_value) and comparison.p_adjusted == pytest.approx(adjusted)
    assert [cells[c].comparison.verdict for c in tested] == [BETTER, NO_DIFFERENCE, WORSE, NO_DIFFERENCE]
    # did not learn: no comparison, and why
    assert not cells["coverage", "dnas"].learned and cells["coverage", "dnas"].comparison is None
    assert cells["coverage", "dnas"].untested_reason == "did not learn"
    assert cells["coverage", "hnas"].learned_seeds == 3 and not cells["coverage", "hnas"].learned
    assert cells["recall", "unas"].untested_reason == "the reference"
    # diagnostics per layer, mean over runs
    diag = cells["recall", "dnas"].diagnostics
    assert diag["min col sum x S"] == [0.5, 1.5] and diag["entropy (nats)"] == [2.0, 3.0]
    assert diag["head JSD"] == [0.3] and diag["HNAS u"] == []


def test_when_unas_did_not_learn_nothing_is_compared_on_that_probe():
    acc = {("listops", "unas"): [0.25, 0.24, 0.26], ("listops", "dnas"): [0.5, 0.6, 0.55]}
    cells = build_cells(fake_records(acc), KEYS)
    assert cells["listops", "dnas"].comparison is None
    assert cells["listops", "dnas"].untested_reason == "UNAS did not learn"


def test_two_identical_configurations_are_no_difference_detected():
    same = [0.61, 0.66, 0.58]
    cells = build_cells(fake_records({("recall", "unas"): same, ("recall", "unas_again"): same}), KEYS)
    comparison = cells["recall", "unas_again"].comparison
    assert comparison.verdict == NO_DIFFERENCE and comparison.p_value == 1.0 and comparison.difference == 0.0


def test_failed_runs_are_listed_and_left_out():
    records = fake_records({("recall", "unas"): [0.6, 0.62], ("recall", "dnas"): [0.7, 0.72]})
    records[Run("recall", "dnas", 3)] = record(0.0, status="failed")
    cells = build_cells(records, KEYS)
    assert cells["recall", "dnas"].n == 2 and cells["recall", "dnas"].failed == ["boom"]


def test_keys_are_the_test_twins_of_the_cards_metric_and_baseline():
    card = task_cards()["probe"]
    assert keys_for(card, [record(0.5)]) == Keys("test/acc", "test/baseline_acc", True)
    only_val = {"status": "ok", "metrics": {"val/acc": 0.5, "val/baseline_acc": 0.25}}
    assert keys_for(card, [only_val]) == Keys(card.optimized_metric, card.baseline, True)


def test_report_and_heatmap(tmp_path):
    hnas_u = {"layers.0.self_attn": [0.2, 0.4], "layers.1.self_attn": [0.8, 0.6], "layers.10.self_attn": [1.0],
              "layers.2.self_attn": [0.5]}
    records = fake_records()
    for seed in range(1, 5):
        records[Run("recall", "hnas", seed)]["hnas_u"] = hnas_u
    cells = build_cells(records, KEYS)
    schemes, probes = ["unas", "dnas", "hnas", "sinkhorn"], ["recall", "coverage"]
    meta = {"command": "python -m attnlab.compare", "mode": "quick", "seeds": 4, "commit": "abc", "started": "now",
            "machine": "cpu", "load_before": "0.0", "load_after": "0.0", "jobs": 2, "trained": 32, "reused": 0,
            "wall_s": 60.0}
    text = write_report(tmp_path, cells, schemes, probes, KEYS, meta).read_text()
    lines = text.splitlines()
    table = lines[lines.index("| scheme | recall | coverage |"):]
    assert table[2] == "| *trivial baseline* | 0.250 | 0.250 |"
    assert table[4].startswith("| dnas | **0.717 ± ") and "⚠ did not learn (0/4)" in table[4]
    assert "⚠ did not learn (3/4)" in table[5]  # hnas on coverage
    assert table[6].endswith(f"| **{0.535:.3f} ± {stats.sem(ACC['coverage', 'sinkhorn']):.3f}** |")  # best learned
    verdicts = text[text.index("## Against unas"):]
    assert "| dnas | **better** (+0.107, p_Holm " in verdicts and "| — (did not learn) |" in verdicts
    assert "| sinkhorn | **worse** (" in verdicts and "no difference detected (" in verdicts
    assert (f"- coverage / dnas: test/acc 0.250 ± {stats.sem(ACC['coverage', 'dnas']):.3f} against the "
            "baseline 0.250; 0 of 4 run(s) beat it") in text
    # diagnostics; u per layer, in layer order
    assert "| hnas | 0.5 / 1.5 | 0 / 0 | 2 / 3 | 0.3 | 1.5 | 0.3 / 0.7 / 0.5 / 1 |" in text
    # a tie at the table's precision: both are the best
    tie = build_cells(fake_records({("recall", "unas"): [1.0, 1.0], ("recall", "dnas"): [1.0, 0.9999]}), KEYS)
    tie_table = "\n".join(write_report(tmp_path, tie, ["unas", "dnas"], ["recall"], KEYS, meta).read_text()
                          .splitlines())
    assert "| unas | **1.000 ± 0.000** |" in tie_table and "| dnas | **1.000 ± 0.000** |" in tie_table
    png = heatmap(cells, schemes, probes, KEYS, tmp_path / HEATMAP)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def fake_launcher(trained):
    """Stands in for the sweeps: writes each run's metrics.json where train.py would."""

    def run_missing(sweeps, plan, runs_dir, reused, jobs=2, show=True):
        out = {}
        for sweep in sweeps:
            for run in sweep.runs:
                trained.append(run)
                overrides = [*plan.overrides(run.probe), f"model={run.model}", f"seed={run.seed}"]
                d = runs_dir / sweep.slug / f"{run.model}_seed{run.seed}"
                d.mkdir(parents=True)
                rec = record(ACC.get((run.probe, run.model), [0.5] * 9)[run.seed - 1]) | {
                    "task": "probe", "model": run.model, "seed": run.seed, "overrides": overrides}
                (d / "metrics.json").write_text(json.dumps(rec))
                out[run] = rec
        return out

    return run_missing


def test_the_command_on_faked_runs_resumes_and_writes_its_report(tmp_path, monkeypatch, capsys):
    trained = []
    monkeypatch.setattr(compare_main, "run_missing", fake_launcher(trained))
    args = ["--schemes", "dnas,sinkhorn", "--probes", "recall,coverage", "--seeds", "4", "--out", str(tmp_path)]
    assert compare_main.main(args) == 0
    assert len(trained) == 3 * 2 * 4  # unas joins as the reference
    text = (tmp_path / "REPORT.md").read_text()
    assert "| sinkhorn | **worse** (" in text and (tmp_path / HEATMAP).is_file()
    assert "24 run(s) to train in 2 sweep(s), 0 reused" in capsys.readouterr().out
    # again with the same --out: nothing to train; one more seed: only the new seed's runs
    assert compare_main.main(args) == 0
    assert len(trained) == 24 and "0 run(s) to train in 0 sweep(s), 24 reused" in capsys.readouterr().out
    assert compare_main.main([*args[:-3], "4", "--out", str(tmp_path), "--override", "trainer.max_epochs=2"]) == 0
    assert len(trained) == 48  # other settings: trained again, into new attempt dirs
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["coverage-a1", "coverage-a2", "recall-a1",
                                                                      "recall-a2"]


def test_dry_run_and_bad_choices(tmp_path, capsys):
    args = ["--dry-run", "--schemes", "dnas", "--probes", "recall", "--seeds", "2", "--out", str(tmp_path)]
    assert compare_main.main([*args, "--jobs", "1"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.endswith(f"train.py -m task=probe probe=recall model=unas,dnas seed=1,2 {' '.join(COMMON)} "
                         f"hydra.sweep.dir={tmp_path / 'runs' / 'recall-a1'}")
    assert compare_main.main([*args, "--jobs", "2"]) == 0  # two side by side: one scheme each
    assert [line.split(" model=")[1].split()[0] for line in capsys.readouterr().out.splitlines()] == ["unas", "dnas"]
    assert compare_main.main(["--probes", "recal", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --probes recal: unknown ['recal']; choose from ") and "recall" in err
    assert compare_main.main(["--seeds", "0", "--jobs", "2", "--out", str(tmp_path)]) == 2
    assert "--seeds 0 --jobs 2: both take a number >= 1" in capsys.readouterr().err


def test_wandb_run_holds_the_table_the_heatmap_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    from attnlab.compare.writeup import log_to_wandb

    cells = build_cells(fake_records(), KEYS)
    heatmap(cells, ["unas", "dnas"], ["recall"], KEYS, tmp_path / HEATMAP)
    (tmp_path / "REPORT.md").write_text("# the report")
    run_dir = Path(log_to_wandb(tmp_path, cells, KEYS, {"mode": "quick", "command": "x"}))
    assert run_dir.name.startswith("offline-run-")
    files = run_dir / "files"
    assert (files / "REPORT.md").read_text() == "# the report"
    (table,) = (files / "media" / "table" / "compare").glob("cells_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"][:3] == ["probe", "scheme", "test/acc"] and len(data["data"]) == len(cells)
    row = next(r for r in data["data"] if r[:2] == ["recall", "dnas"])
    assert row[7] == "better" and row[3] == pytest.approx(cells["recall", "dnas"].mean_se[1])
    assert list((files / "media" / "images" / "compare").glob("heatmap_*.png"))
