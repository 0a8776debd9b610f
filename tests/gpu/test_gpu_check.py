"""`make gpu-check` (bench/gpu_check.py), on the CPU: without CUDA it stops at once with one
line; its plan (default within 10 minutes, --full the long version) and the dry run that prints
it; its training matrix takes every scheme each task card accepts; the step runner (fake steps)
kills a step past its timeout with its process group and rewrites report.md around every step."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cards import CARDS, TINY
from helpers.paths import ROOT

from attnlab.attention import AttentionSpec, names

SCRIPT = ROOT / "bench" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_stops_at_once_with_one_line(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine that has one
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "report")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [load_script().NEEDS_CUDA]
    assert "needs a CUDA GPU" in done.stderr
    assert not (tmp_path / "report").exists()  # nothing was started


def test_make_targets_run_the_script_and_the_gpu_tests_without_the_interpreter():
    dry = subprocess.run(["make", "-s", "-n", "-o", ".venv/.installed", "gpu-check", "test-gpu"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    gpu_check, test_gpu = dry.strip().splitlines()
    assert "bench/gpu_check.py" in gpu_check
    assert test_gpu.startswith("env -u TRITON_INTERPRET") and "-m gpu" in test_gpu


def test_the_matrix_takes_every_scheme_a_task_accepts():
    script = load_script()
    for card in CARDS.values():
        specs = {n: AttentionSpec.from_config(n) for n in names()}  # causal-only: stickbreaking, selective
        refused = {n for n, s in specs.items() if (s.normalizes_over_queries if card.causal else s.causal_only)}
        assert script.schemes_for(card) == [n for n in names() if n not in refused]
        assert not card.causal or refused  # a causal task refuses DNAS at least
        assert card.causal or "stickbreaking" in refused  # the others stick-breaking
    assert "hardware=gpu" in script.RUN_OVERRIDES


def plan(*argv, out=Path("out")):
    script = load_script()
    return script, script.plan(script.parse_args(list(argv)), out)


def test_the_default_plan_fits_ten_minutes_in_bf16_on_tiny_data():
    script, steps = plan()
    assert sum(s.timeout for s in steps) <= 600
    tests = [s for s in steps if s.name.startswith("tests:")]
    bench = [s for s in steps if s.name.startswith("CUDA bench")]
    train = {s.cmd[s.cmd.index("-m") + 1].removeprefix("task="): s for s in steps
             if "train.py" in s.cmd}
    assert len(tests) == 4 and len(bench) == 1 and set(train) == set(CARDS)
    assert len(steps) == len(tests) + 1 + len(CARDS)
    for step in tests:  # every group deselects the fp16 / fp32 cases, not the interpreter's
        assert step.cmd[step.cmd.index("-k") + 1].endswith("(not fp16 and not fp32)")
        assert step.cmd[step.cmd.index("-m", 3) + 1] == "gpu"
    cmd = bench[0].cmd
    assert cmd[cmd.index("--dtypes") + 1:cmd.index("--seq")] == ["bf16"]
    assert cmd[cmd.index("--seq") + 1:cmd.index("--repeats")] == ["1024", "4096"]
    for name, step in train.items():
        models = step.cmd[step.cmd.index("-m") + 2].removeprefix("model=").split(",")
        assert models == script.schemes_for(CARDS[name])
        assert set(TINY[name]) <= set(step.cmd) and "trainer.max_steps=5" in step.cmd
        assert "hardware=gpu" in step.cmd and f"hydra.sweep.dir={Path('out/runs') / name}" in step.cmd
    assert all(s.env == {"ATTNLAB_TRITON_AUTOTUNE": "0"} for s in steps)  # one tile per kernel


def test_full_autotunes_and_runs_fp32_long_sequences_and_real_data():
    _, default = plan()
    _, steps = plan("--full")
    assert len(steps) == len(default) and sum(s.timeout for s in steps) > 3600
    assert all(s.env == {} for s in steps)
    tests = [s for s in steps if s.name.startswith("tests:")]
    assert all("fp32" not in " ".join(s.cmd) for s in tests)
    bench = next(s for s in steps if s.name.startswith("CUDA bench"))
    assert "--seq" not in bench.cmd and "--dtypes" not in bench.cmd  # bf16 + fp32, 1k ... 16k
    for step in (s for s in steps if "train.py" in s.cmd):
        name = step.cmd[step.cmd.index("-m") + 1].removeprefix("task=")
        assert "trainer.max_steps=30" in step.cmd and not set(TINY[name]) & set(step.cmd)
    _, tiny = plan("--full", "--tiny", "--tasks", "vqa")
    assert set(TINY["vqa"]) <= set(tiny[-1].cmd)


def test_narrowing_flags_keep_working():
    _, steps = plan("--skip-tests", "--skip-bench", "--tasks", "vqa", "mlm")
    assert [s.cmd[s.cmd.index("-m") + 1] for s in steps] == ["task=mlm", "task=vqa"]
    assert sum(s.timeout for s in steps) == load_script().TRAIN[1]  # the matrix's share, split
    _, steps = plan("--skip-train", "--skip-bench")
    assert all(s.name.startswith("tests:") for s in steps)
    with pytest.raises(SystemExit, match="--tasks: unknown nope; task cards: "):
        plan("--tasks", "nope")


def test_the_dry_run_prints_the_plan_and_its_budget_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["make", "-s", "-o", ".venv/.installed", "gpu-check",
                           f"GPU_CHECK_ARGS=--dry-run --skip-train --out {tmp_path}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    lines = done.stdout.splitlines()
    script, steps = plan("--skip-train", out=tmp_path)
    total = sum(s.timeout for s in steps)
    assert lines[0] == (f"make gpu-check: {len(steps)} steps, each under its own timeout; at "
                        f"most {total} s ({total / 60:.1f} min) in all")
    for i, step in enumerate(steps, 1):
        assert f"{i:3d}. [{step.timeout:5d} s] {step.name}" in lines
        assert f"       {script.shown(step)}" in lines
    assert "ATTNLAB_TRITON_AUTOTUNE=0 .venv/bin/python bench/attention.py --device cuda" in done.stdout


READ_HEADINGS = ("import sys; print(*('> ' + line for line in open(sys.argv[1]) "
                 "if line.startswith('#')), sep='')")
CHILD_THEN_SLEEP = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
                    "'import time; time.sleep(120)']); print(child.pid); time.sleep(120)")  # no flush: still logged


def test_report_is_rewritten_around_every_step_and_names_a_timeout_and_a_crash(tmp_path):
    script, python = load_script(), sys.executable
    report = tmp_path / "report.md"
    steps = [script.Step("quick", [python, "-c", "print('hello')"], 60),
             script.Step("hangs", [python, "-c", CHILD_THEN_SLEEP], 2),
             script.Step("crashes", [python, "-c", "import sys; print('boom'); sys.exit(3)"], 60),
             script.Step("reads the report", [python, "-c", READ_HEADINGS, str(report)], 60)]
    assert script.run_steps(steps, tmp_path, "# header\n") == ["hangs", "crashes"]
    text = report.read_text()
    for heading in ("## 1. quick: passed (", "## 2. hangs: timeout after 2 s",
                    "## 3. crashes: FAILED (exit 3, ", "## 4. reads the report: passed (",
                    "## Result: FAILED: hangs; crashes"):
        assert heading in text
    assert "boom" in text and "RUNNING" not in "".join(l for l in text.splitlines() if l[:1] == "#")
    # what the report said while step 4 ran: every result before it, and step 4 as running
    seen = [line for line in (tmp_path / "04-reads-the-report.log").read_text().splitlines() if line]
    assert seen[0] == "> # header" and seen[1].startswith("> ## 1. quick: passed (")
    assert seen[2] == "> ## 2. hangs: timeout after 2 s" and seen[3].startswith("> ## 3. crashes: FAILED (exit 3")
    assert seen[4].startswith("> ## 4. reads the report: RUNNING since") and len(seen) == 5
    # the hung step's own child went with its process group (SIGKILL lands within moments)
    stat = Path(f"/proc/{int((tmp_path / '02-hangs.log').read_text().split()[0])}/stat")
    for _ in range(50):
        if not stat.exists() or stat.read_text().split(")")[1].split()[0] in "ZX":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the hung step's child is alive: {stat.read_text()}")


def test_the_matrix_table_says_which_runs_finished_before_a_timeout(tmp_path):
    """Runs go in order: after a kill, the finished ones from their metrics.json, the first
    missing one as the one running at the kill, the others not reached."""
    import json

    for i, (model, status) in enumerate([("unas", "ok"), ("dnas", "failed")]):
        run = tmp_path / f"{i}_vqa_{model}"
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps(
            {"status": status, "model": model, "wall_s": 1.5, "optimized_metric": "val/acc",
             "optimized_value": 0.25, "error": "RuntimeError: CUDA error\n  a | b"}))
    summarize = load_script().matrix_summary("vqa", ["unas", "dnas", "hnas", "coda"], tmp_path)
    ok, table = summarize(None, "")
    rows = table.splitlines()[2:]
    assert not ok and rows[0].startswith("| vqa | unas | ok | 1.5 | val/acc = 0.25 |")
    assert rows[1].startswith("| vqa | dnas | failed |") and rows[1].endswith("| a / b |")
    assert rows[2] == "| vqa | hnas | killed at the timeout |  |  |  |"
    assert rows[3] == "| vqa | coda | not reached |  |  |  |"
    assert summarize(1, "...\nHydraException: boom")[1].splitlines()[4].endswith(
        "| missing |  |  | exit 1: HydraException: boom |")
