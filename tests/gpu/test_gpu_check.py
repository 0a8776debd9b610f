"""`make gpu-check` (bench/gpu_check.py): on a machine without CUDA it stops at once with one
line; its training matrix takes every scheme each task card accepts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from helpers.cards import CARDS
from helpers.paths import ROOT

from attnlab.attention import AttentionSpec, names

SCRIPT = ROOT / "bench" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
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
    assert "hardware=gpu" in script.RUN_OVERRIDES and "trainer.max_steps=30" in script.RUN_OVERRIDES
