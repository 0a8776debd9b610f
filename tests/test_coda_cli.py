"""model=coda and model=repulsive through the real CLI in every task (fast_dev_run, tiny data)."""

import pytest
from conftest import QUIET, TINY, metrics_files, run_cli

# VQA's fusion is single-head by default: two heads give the head analyses and SVGD something to do
MULTI_HEAD = {"vqa": ["task.module.fusion_heads=2"], "mlm": [], "headline": []}


@pytest.mark.parametrize("task", list(TINY))
def test_coda_and_repulsive_run_in_every_task(task, tmp_path, data_dir):
    proc = run_cli(["-m", f"task={task}", "model=coda,repulsive", "debug=fast", *TINY[task], *MULTI_HEAD[task],
                    *QUIET], tmp_path, data_dir)
    records = {r["model"]: r for r in metrics_files(tmp_path / "outputs" / "multirun")}
    assert sorted(records) == ["coda", "repulsive"]
    for r in records.values():
        assert r["status"] == "ok", r.get("error")
        m = r["metrics"]
        assert any(k.startswith("test/") for k in m), m
        # head analyses ran on the model's multi-head attention
        assert {"val/avg_jsd", "val/head_distance", "test/avg_jsd", "test/head_distance"} <= set(m), m
        assert "head_importance/max_drop" in m
        assert (r["_dir"] / "head_jsd.png").is_file() and (r["_dir"] / "head_importance.csv").is_file()
        if task == "vqa":  # a classification task: calibration
            assert {"val/ece", "test/oe"} <= set(m) and (r["_dir"] / "reliability_test.png").is_file()
    assert "repulsive attention (svgd)" in proc.stdout
