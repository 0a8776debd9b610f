"""The sweep report: grouping by configuration, mean ± standard error over seeds, CSV, failures."""

import csv
import json
import math

from attnlab import report


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
    assert math.isclose(float(by_cfg["model=unas task=vqa"]["test/acc mean"]), 0.6)
    assert math.isclose(float(by_cfg["model=unas task=vqa"]["test/acc se"]), 0.1 / math.sqrt(3))


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
