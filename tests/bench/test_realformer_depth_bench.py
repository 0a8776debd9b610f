"""bench/realformer_depth.py: its worker runs a deep RealFormer layer both ways (the stacked
queries and keys, the materialized logits) and reports a time and a peak."""

from __future__ import annotations

import importlib.util

import pytest
from helpers.paths import ROOT


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("realformer_depth", ROOT / "bench" / "realformer_depth.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("variant", ["unas", "stacked", "materialized"])
def test_the_worker_runs_a_third_layer_each_way(bench, variant, monkeypatch):
    monkeypatch.setattr(bench, "H", 2)
    monkeypatch.setattr(bench, "D", 8)
    result = bench.worker(variant, 32, 3, 1, 1)
    assert result["cpu_s"] > 0 and result["peak_gib"] >= 0
