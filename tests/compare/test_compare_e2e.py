"""`python -m attnlab.compare` for real: 2 schemes x 1 probe x 2 seeds of tiny training runs
through train.py, the report written, and a second invocation that trains nothing."""

import json
import subprocess
import sys

import pytest
from helpers.cards import TINY
from helpers.cli import cli_env
from helpers.paths import ROOT


@pytest.mark.slow
def test_compare_trains_reports_and_resumes(tmp_path, data_dir):
    out = tmp_path / "cmp"
    args = [sys.executable, "-m", "attnlab.compare", "--schemes", "unas,dnas", "--probes", "recall",
            "--seeds", "2", "--jobs", "2", "--out", str(out), *(f"--override={o}" for o in TINY["probe"])]
    env = cli_env(tmp_path, data_dir)
    first = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "4 run(s) to train in 2 sweep(s), 0 reused" in first.stdout  # side by side
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").rglob("metrics.json"))]
    assert sorted((r["model"], r["seed"], r["status"]) for r in records) == [
        ("dnas", 1, "ok"), ("dnas", 2, "ok"), ("unas", 1, "ok"), ("unas", 2, "ok")]
    assert all("probe=recall" in r["overrides"] and "logger=csv" in r["overrides"] for r in records)
    report = (out / "REPORT.md").read_text()
    table = report[report.index("| scheme | recall |"):].splitlines()
    assert table[2].startswith("| *trivial baseline* | 0.") and table[3].startswith("| unas | ")
    assert "| dnas | " in report[report.index("## Against unas"):]  # a verdict or why there is none
    assert "### recall" in report and (out / "heatmap.png").stat().st_size > 5000
    second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert second.returncode == 0 and "0 run(s) to train in 0 sweep(s), 4 reused" in second.stdout
