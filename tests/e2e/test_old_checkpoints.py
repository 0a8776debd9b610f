"""Checkpoints written before the task cards (commit a62c79e) still evaluate, with the same numbers
(with `trust_checkpoint=true`: they hold pickled objects).

Each `tests/fixtures/checkpoints/<task>/` is a tiny run of that code in its real format: the run's
`config.yaml` (paths replaced by @FIXTURES@, @DATA@, @RUN_DIR@, ...) and `checkpoints/last.ckpt`
(optimizer states stripped: eval does not read them). `expected.json` holds what `eval.py` gave on
them with that code.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from helpers.cards import TINY
from helpers.cli import run_here
from helpers.paths import FIXTURES, ROOT

CHECKPOINTS = FIXTURES / "checkpoints"


def unpack(task: str, tmp_path: Path, data_dir: Path) -> Path:
    """The fixture run dir under tmp_path, its config pointing at this checkout; its checkpoint."""
    run = tmp_path / "run"
    shutil.copytree(CHECKPOINTS / task, run)
    text = (run / "config.yaml").read_text()
    for mark, value in {"@FIXTURES@": FIXTURES, "@DATA@": data_dir, "@RUN_DIR@": run,
                        "@OUTPUTS@": tmp_path / "outputs", "@ROOT@": ROOT}.items():
        text = text.replace(mark, str(value))
    (run / "config.yaml").write_text(text)
    return run / "checkpoints" / "last.ckpt"


def evaluate(task: str, tmp_path: Path, data_dir: Path) -> dict[str, float]:
    ckpt = unpack(task, tmp_path, data_dir)
    # the opt-in: these checkpoints hold pickled objects (refused without it: test_checkpoints.py)
    run_here([f"ckpt_path={ckpt}", "logger=csv", "trust_checkpoint=true"], tmp_path, data_dir,
             script="eval.py")
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "outputs").rglob("eval_metrics.json")]
    return record["metrics"]


@pytest.mark.parametrize("task", sorted(p.name for p in CHECKPOINTS.iterdir()))
def test_a_checkpoint_of_the_old_layout_evaluates_to_its_old_numbers(task, tmp_path, data_dir):
    assert task in TINY  # a task that still exists
    expected = json.loads((CHECKPOINTS / task / "expected.json").read_text())
    got = evaluate(task, tmp_path, data_dir)
    for key, value in expected.items():
        assert key in got, f"{task}: eval no longer reports {key}"
        assert math.isclose(got[key], value, rel_tol=1e-4, abs_tol=1e-5), (task, key, got[key], value)
