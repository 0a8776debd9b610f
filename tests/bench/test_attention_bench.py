"""bench/attention.py, the CPU attention bench: its workers time what they name, and the table
carries the work-per-score note and the ratios to SDPA of the same run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.paths import ROOT

BENCH = str(ROOT / "bench" / "attention.py")
TINY = ["--batch", "2", "--heads", "2", "--head-dim", "8", "--repeats", "2", "--threads", "1"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True,
                          check=True, timeout=1200)


def test_padded_unas_worker_reports_its_times_and_memory():
    """The padded methods build their masks (item b: its last b S / 32 positions padded)."""
    result = json.loads(run("--worker", "unas_padded_attend", "--seq", "64", *TINY).stdout
                        .strip().splitlines()[-1])
    for key in ("fwd", "fwd_cpu", "fwdbwd", "fwdbwd_cpu"):
        assert len(result[key]) == 2 and all(t > 0 for t in result[key])
    assert result["peak_gib"] > 0


@pytest.mark.slow
def test_table_has_the_work_per_score_and_min_ratios(tmp_path):
    proc = run("--seq", "32", "--methods", "unas_sdpa", "dnas_efficient", "unas_padded_sdpa",
               "--rounds", "1", "--stat", "min", "--out-dir", str(tmp_path), *TINY)
    table = proc.stdout
    assert "min of 1 interleaved rounds x 2 runs" in table
    assert "| HNAS fused | 4 mm + 2 exp | 5 mm + 1 exp | 9 mm + 3 exp | 1.29x |" in table
    rows = [line for line in table.splitlines() if line.startswith("| 32 |")]
    assert len(rows) == 3 and "(1.00x)" in rows[0]
    assert len(list(tmp_path.glob("attention-*.md"))) == 1
