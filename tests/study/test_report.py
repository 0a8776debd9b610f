"""The sweep report: grouping by configuration, rows labelled by what varies, the card's metrics
by default, mean ± standard error over seeds, the paired comparison with a baseline row, CSV,
failures."""

import csv
import json
import math

import pytest
from scipy import stats

from attnlab.study import report
from attnlab.study.stats import holm


def write_job(root, num, model, seed, acc, status="ok"):
    d = root / f"{num}_vqa_{model}_seed{seed}"
    d.mkdir(parents=True)
    record = {"status": status, "task": "vqa", "model": model, "seed": seed,
              "overrides": [f"model={model}", "task=vqa", f"seed={seed}"],
              "metrics": {"test/acc": acc, "val/acc": acc + 1} if status == "ok" else {}}
    if status != "ok":
        record["error"] = "boom"
    (d / "metrics.json").write_text(json.dumps(record))


def test_table_mean_and_standard_error(tmp_path, capsys):
    for i, (model, seed, acc) in enumerate([("unas", 1, 0.50), ("unas", 2, 0.60), ("unas", 3, 0.70),
                                            ("dnas", 1, 0.80), ("dnas", 2, 0.90)]):
        write_job(tmp_path, i, model, seed, acc)
    write_job(tmp_path, 9, "dnas", 3, None, status="failed")
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| model=")]
    assert len(lines) == 2
    unas = next(line for line in lines if "model=unas" in line)
    dnas = next(line for line in lines if "model=dnas" in line)
    # unas: mean 0.6, sd 0.1, se = 0.1/sqrt(3)
    assert "0.6000 ± 0.0577" in unas and "| 3 | 0 |" in unas
    # dnas: two ok seeds and one failed job
    assert "0.8500 ± 0.0500" in dnas and "| 2 | 1 |" in dnas
    assert "failed:" in out and "boom" in out
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    by_cfg = {r["configuration"]: r for r in rows}
    assert math.isclose(float(by_cfg["model=unas"]["test/acc mean"]), 0.6)
    assert math.isclose(float(by_cfg["model=unas"]["test/acc se"]), 0.1 / math.sqrt(3))
    assert "every job: task=vqa" in out  # what did not vary is said once, above the table


def test_single_seed_has_no_error_bar(tmp_path, capsys):
    write_job(tmp_path, 0, "hnas", 1, 0.4)
    assert report.main([str(tmp_path), "--metrics", "test/acc"]) == 0
    assert "| 0.4000 |" in capsys.readouterr().out


def test_missing_dir_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert report.main([str(tmp_path)]) == 2
    assert "no metrics.json" in capsys.readouterr().err


def test_killed_jobs_are_listed(tmp_path, capsys):
    import os
    import socket
    import subprocess
    import sys

    write_job(tmp_path, 0, "unas", 1, 0.5)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    running = tmp_path / "1_vqa_unas_seed2"
    running.mkdir()
    (running / "metrics.json").write_text(json.dumps({
        "status": "running", "pid": dead.pid, "host": socket.gethostname(), "overrides": ["model=unas", "task=vqa", "seed=2"]}))
    alive = tmp_path / "2_vqa_unas_seed3"  # still running (this very process)
    alive.mkdir()
    (alive / "metrics.json").write_text(json.dumps({
        "status": "running", "pid": os.getpid(), "host": socket.gethostname(), "overrides": ["model=unas", "task=vqa"]}))
    never = tmp_path / "3_vqa_unas_seed4" / ".hydra"  # died before the runner wrote anything
    never.mkdir(parents=True)
    (never / "overrides.yaml").write_text("- model=unas\n- task=vqa\n- seed=4\n")
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"killed: {running}" in out and f"running: {alive}" in out and f"killed: {never.parent}" in out
    assert "| model=unas task=vqa | 1 | 3 |" in out


# The sweep measured in issue 25: `train.py -m model=unas,dnas,hnas seed=1,2 trainer.max_epochs=1
# logger=csv` on vqa gave a 37-column table, rows labelled "logger=csv model=unas task=vqa
# trainer.max_epochs=1". Its jobs' records, with the metrics such a run logs.
SWEEP_ACC = {("unas", 1): 0.50, ("unas", 2): 0.54, ("dnas", 1): 0.58, ("dnas", 2): 0.60,
             ("hnas", 1): 0.51, ("hnas", 2): 0.53}


def write_sweep(root, acc=SWEEP_ACC):
    for num, ((model, seed), value) in enumerate(acc.items()):
        d = root / f"{num}_vqa_{model}_seed{seed}"
        d.mkdir(parents=True)
        metrics = {f"test/{name}": 0.1 for name in ("yes_no", "number", "other", "prior_acc")}
        metrics |= {f"test/explained_away_l{i}": 0.0 for i in range(30)}
        metrics |= {"val/acc": value + 0.01, "test/acc": value, "val/loss": 1.0, "train/loss": 1.2}
        (d / "metrics.json").write_text(json.dumps({
            "status": "ok", "task": "vqa", "model": model, "seed": seed, "optimized_metric": "val/acc",
            "overrides": [f"model={model}", f"seed={seed}", "trainer.max_epochs=1", "logger=csv"],
            "metrics": metrics}))


def table_lines(out):
    return [line for line in out.splitlines() if line.startswith("| ")]


def test_measured_sweep_shows_the_cards_metrics_and_labels_what_varies(tmp_path, capsys):
    write_sweep(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header, *rows = table_lines(out)
    # vqa's card: optimized_metric val/acc, metrics [test/acc]
    assert header == "| configuration | seeds | not finished | val/acc | test/acc |"
    assert [r.split(" | ")[0] for r in rows] == ["| model=dnas", "| model=hnas", "| model=unas"]
    assert "every job: logger=csv trainer.max_epochs=1" in out
    dnas = rows[0]
    assert "| 2 | 0 | 0.6000 ± 0.0100 | 0.5900 ± 0.0100 |" in dnas


def test_metrics_option_takes_names_and_patterns(tmp_path, capsys):
    write_sweep(tmp_path)
    assert report.main([str(tmp_path), "--metrics", "test/explained_away_l1*", "val/loss"]) == 0
    header = table_lines(capsys.readouterr().out)[0]
    names = [f"test/explained_away_l{i}" for i in [1, *range(10, 20)]]
    assert header == "| configuration | seeds | not finished | " + " | ".join(names) + " | val/loss |"
    # a name no job logged is a typo, not a column of dashes (tests/e2e/test_command_errors.py)
    assert report.main([str(tmp_path), "--metrics", "val/loss", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: --metrics nope: no job logged it")


def test_baseline_rows_are_paired_by_seed_against_scipy_and_holm(tmp_path, capsys):
    acc = {("unas", 1): 0.50, ("unas", 2): 0.54, ("unas", 3): 0.47, ("unas", 4): 0.52,
           ("dnas", 1): 0.58, ("dnas", 2): 0.61, ("dnas", 3): 0.55, ("dnas", 4): 0.60,
           ("hnas", 1): 0.49, ("hnas", 2): 0.56, ("hnas", 3): 0.46, ("hnas", 4): 0.51}
    write_sweep(tmp_path, acc)
    assert report.main([str(tmp_path), "--baseline", "model=unas"]) == 0
    out = capsys.readouterr().out
    assert "paired by seed on val/acc (higher is better" in out
    rows = {r.split(" | ")[0][2:]: r.split(" | ") for r in table_lines(out) if r.split(" | ")[1] == "model=unas"}
    assert set(rows) == {"model=dnas", "model=hnas"}  # the baseline is not compared with itself
    val = {k: v + 0.01 for k, v in acc.items()}  # val/acc of write_sweep
    p = {m: stats.ttest_rel([val[m, s] for s in range(1, 5)], [val["unas", s] for s in range(1, 5)]).pvalue
         for m in ("dnas", "hnas")}
    adjusted = dict(zip(p, holm(list(p.values()))))
    for m in ("dnas", "hnas"):
        cells = rows[f"model={m}"]
        assert cells[2] == "4"
        assert float(cells[5]) == pytest.approx(p[m], rel=5e-3)
        assert float(cells[6]) == pytest.approx(adjusted[m], rel=5e-3)
    assert rows["model=dnas"][3].startswith("+0.0775 [")
    assert rows["model=dnas"][8] == "**better** |" and rows["model=hnas"][8] == "inconclusive |"
    # the equivalence margin is the user's, and a bad one is one error
    assert report.main([str(tmp_path), "--baseline", "model=unas", "--margin", "0"]) == 2
    assert "--margin 0.0: the equivalence margin must be > 0" in capsys.readouterr().err


def test_two_identical_configurations_are_equivalent_never_better(tmp_path, capsys):
    # the same configuration twice under two names: identical numbers seed by seed
    acc = {("unas", s): v for s, v in zip(range(1, 4), (0.5, 0.6, 0.55))}
    acc |= {("unas_copy", s): v for s, v in zip(range(1, 4), (0.5, 0.6, 0.55))}
    write_sweep(tmp_path, acc)
    assert report.main([str(tmp_path), "--baseline", "model=unas"]) == 0
    row = next(r for r in table_lines(capsys.readouterr().out) if r.startswith("| model=unas_copy | model=unas"))
    assert row.endswith("| 1 | 1 | 0 | equivalent |")


def test_baseline_pairs_within_the_other_overrides(tmp_path, capsys):
    # model x fusion: dnas/concat is compared with unas/concat, not with unas/attention
    for num, (model, fusion, seed, value) in enumerate(
            [(m, f, s, 0.5 + 0.1 * (m == "dnas") + 0.2 * (f == "concat") + 0.01 * s)
             for m in ("unas", "dnas") for f in ("attention", "concat") for s in (1, 2, 3)]):
        d = tmp_path / str(num)
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({
            "status": "ok", "task": "vqa", "seed": seed, "optimized_metric": "val/acc",
            "overrides": [f"model={model}", f"task.fusion={fusion}", f"seed={seed}"],
            "metrics": {"val/acc": value, "test/acc": value}}))
    assert report.main([str(tmp_path), "--baseline", "model=unas"]) == 0
    rows = [r.split(" | ") for r in table_lines(capsys.readouterr().out)
            if r.split(" | ")[1].startswith("model=unas")]
    assert {(r[0][2:], r[1]) for r in rows} == {("model=dnas task.fusion=attention", "model=unas task.fusion=attention"),
                                                ("model=dnas task.fusion=concat", "model=unas task.fusion=concat")}
    assert all(r[3].startswith("+0.1000") for r in rows)  # a constant shift: exactly the 0.1 put in


def test_a_baseline_no_row_has_is_one_clear_error(tmp_path, capsys):
    write_sweep(tmp_path)
    assert report.main([str(tmp_path), "--baseline", "model=sinkhorn"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --baseline model=sinkhorn: no row") and "model=dnas; model=hnas" in err
    assert report.main([str(tmp_path), "--baseline", "unas"]) == 2
    assert "write overrides as key=value" in capsys.readouterr().err


def test_report_uses_the_one_mean_se():
    from attnlab.study import stats as study_stats

    assert report.mean_se is study_stats.mean_se
