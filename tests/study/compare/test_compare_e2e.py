"""`python -m attnlab.compare` for real, on the smallest case that has every stage's machinery:
one probe (unmatched_key) x unas and dnas x 2 seeds, its main setting and both controls, tiny
runs trained through train.py by the shared launcher, REPORT.md written; a second invocation with
the same --out trains nothing. About 35 s on 2 shared cores (one thread per run)."""

import json
import subprocess
import sys

import pytest
from helpers.cards import TINY
from helpers.cli import cli_env
from helpers.paths import ROOT

from attnlab.study.compare.plan import COMMON


def hydra_recorded(overrides):
    """A job's overrides as Hydra records them (a value written back from its parsed form)."""
    return [o + "=null" if o.startswith("~") else o.replace("=false", "=False")
            .replace("=true", "=True") for o in overrides]


# slow (`make test-slow`, ~60 s): the default suite runs the same launcher with real train.py runs
# in tests/study/reproduce/test_reproduce.py, and compare's plan, cells and report on records in
# test_compare_cli.py, test_compare_analysis.py and test_compare_probes.py
@pytest.mark.slow
def test_compare_trains_through_train_py_reports_and_resumes(tmp_path, data_dir):
    out = tmp_path / "cmp"
    args = [sys.executable, "-m", "attnlab.compare", "--probes", "unmatched_key", "--schemes",
            "dnas", "--seeds", "2", "--no-lr-grid", "--jobs", "1", "--out", str(out),
            *(f"--override={o}" for o in TINY["probe"])]
    # tiny tensors: one thread is faster, above all on shared cores
    env = cli_env(tmp_path, data_dir) | {"OMP_NUM_THREADS": "1"}
    first = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                           check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "[pilot] 4 run(s): 4 to train in 1 sweep(s), 0 reused" in first.stdout
    # the controls: a sweep each; the pilot's runs are main's
    assert "[main and controls] 12 run(s): 8 to train in 2 sweep(s), 4 reused" in first.stdout

    # every run trained through train.py, with the overrides its cell asks for
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").rglob("metrics.json"))]
    assert len(records) == 12 and {r["status"] for r in records} == {"ok"}
    conditions = {(): "main", ("probe.options.a_queries=false",): "positive",
                  ("probe.options.disjoint=true",): "negative"}
    expected = {(m, s, name): hydra_recorded([
        "task=probe", f"model={m}", f"seed={s}", "probe=unmatched_key", *overrides,
        "task.module.optimizer.lr=0.003", *TINY["probe"], *COMMON])
        for m in ("unas", "dnas") for s in (1, 2) for overrides, name in conditions.items()}
    found = {}
    for r in records:
        name = ("positive" if "probe.options.a_queries=False" in r["overrides"] else
                "negative" if "probe.options.disjoint=True" in r["overrides"] else "main")
        found[(r["model"], r["seed"], name)] = r["overrides"]
        assert r["task"] == "probe" and r["run_dir"].startswith(str(out / "runs"))
        assert {"test/acc", "test/answers", "val/acc_auc", "test/baseline_acc",
                "test/shortcut_acc"} <= set(r["metrics"])
    assert found == expected

    report = (out / "REPORT.md").read_text()
    primary = report[report.index("## The primary family"):report.index("## Does each probe")]
    assert "| unmatched_key | dnas vs unas | accuracy | " in primary
    assert "| unmatched_key | dnas vs unas | AUC | " in primary
    assert "hnas" not in primary and "sinkhorn" not in primary  # --schemes dnas
    checks = report[report.index("## Does each probe"):]
    assert "| unmatched_key | explaining away" in checks
    assert "query competition" in checks and "A and B disjoint" in checks
    negative = report[report.index("## Negative controls"):report.index("## The probes")]
    assert "| unmatched_key | dnas vs unas | accuracy | " in negative
    table = report[report.index("### unmatched_key (primary)"):]
    for condition in ("main", "positive control", "negative control"):
        assert f"| {condition} | *trivial baseline* | 0.125 |" in table
        for scheme in ("unas", "dnas"):
            assert f"| {condition} | {scheme} | " in table
    assert "12 run(s) trained, 0 reused" in report and (out / "effects.png").is_file()

    # again with the same --out: nothing trains, the report is rewritten from the records
    dirs = sorted(p.name for p in (out / "runs").iterdir())
    second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                            check=False)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "[pilot] 4 run(s): 0 to train in 0 sweep(s), 4 reused" in second.stdout
    assert "[main and controls] 12 run(s): 0 to train in 0 sweep(s), 12 reused" in second.stdout
    assert sorted(p.name for p in (out / "runs").iterdir()) == dirs
    assert "0 run(s) trained, 12 reused" in (out / "REPORT.md").read_text()
