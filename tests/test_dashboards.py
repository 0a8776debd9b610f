"""W&B dashboards: the spec is built without a server, stays the same from one build to the next,
follows the tasks' metrics, and saving sends exactly that spec (to a stand-in W&B server)."""

import json
import os
import re
from pathlib import Path

import pytest
from helpers.wandb_server import ENTITY, FakeWandb

from attnlab import dashboards

SNAPSHOT = Path(__file__).parent / "snapshots" / "dashboard_spec.json"
GROUP = "2026-01-02_03-04-05_000006"
# fixed, so that the snapshot does not change when a task is added (test_metric_sections_come_from_the_tasks)
TASKS = {"vqa": "val/acc", "mlm": "val/acc", "headline": "val/rougeL"}
TABLE = "| configuration | seeds | test/acc |\n|---|---|---|\n| model=hnas task=vqa | 3 | 0.6770 ± 0.0030 |"


def build_spec() -> dict:
    return dashboards.spec(ENTITY, "attnlab", TASKS, GROUP, TABLE)


def test_spec_matches_the_snapshot():
    """The JSON a save would send (`--spec-only`): built offline, byte-for-byte stable.
    After a deliberate change: ATTNLAB_UPDATE_SNAPSHOTS=1 pytest tests/test_dashboards.py"""
    spec = build_spec()
    assert spec == build_spec()  # no random panel or run-set ids
    text = json.dumps(spec, indent=1, sort_keys=True) + "\n"
    if os.environ.get("ATTNLAB_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), "dashboard spec changed: review, then ATTNLAB_UPDATE_SNAPSHOTS=1"
    # what the sections promise: grouped by model with mean and standard error, x = Lightning's step
    sections = spec["workspace"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"].split(":")[0] for s in sections] == [
        "Metrics", "Scheme parameters per layer and head (HNAS u, a sink's b, ...)", "Explained away",
        "Head interaction", "Training stability", "Sinks and outliers (end of test)", "Calibration"]
    # the scheme-parameter panels take SchemeParameters' keys of any scheme, and nothing else
    layer, head = (re.compile(p.regex) for p in dashboards.sections(TASKS)[1].panels)
    assert all(layer.match(k) for k in ("hnas/u/layer0", "sink/b/layer11", "ssmax/c/layer2"))
    assert head.match("sink/b/layer1/head3") and not layer.match("sink/b/layer1/head3")
    assert not any(p.match(k) for p in (layer, head)
                   for k in ("explained_away/layer0/min_col_sum", "val/acc", "train/loss",
                             "train/max_attn_logit/layer0", "train/attn_entropy/layer0/head1"))
    run_set = spec["workspace"]["section"]["runSets"][0]
    assert run_set["grouping"] == [{"section": "config", "name": "model.value.name"}]
    assert run_set["filters"]["filters"][0]["value"] == GROUP
    metric_panels = sections[0]["panels"]
    assert {p["config"]["chartTitle"].split(" ")[0] for p in metric_panels} >= {"val/acc", "test/acc", "val/rougeL"}
    for p in metric_panels:
        assert (p["config"]["groupBy"], p["config"]["groupAgg"], p["config"]["groupArea"]) == (
            "model.value.name", "mean", "stderr")
    assert {"type": "markdown-block", "content": TABLE, "children": [{"text": ""}]} in spec["report"]["blocks"]


def test_metric_sections_come_from_the_tasks(tmp_path):
    """A new task brings its optimized_metric to the dashboard with no dashboard code."""
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "mt.yaml").write_text("# @package _global_\ntask:\n  name: mt\n  optimized_metric: val/bleu\n")
    tasks = dashboards.task_metrics(tmp_path)
    assert tasks == {"mt": "val/bleu"}
    metrics = dashboards.sections(tasks)[0]
    assert {(p.kind, p.keys) for p in metrics.panels} == {
        ("line", ("val/bleu",)), ("bar", ("test/bleu",)), ("line", ("train/loss",))}
    assert dashboards.task_metrics()["vqa"] == "val/acc"  # the project's own conf/task/*.yaml


@pytest.fixture
def fake_wandb(monkeypatch):
    fake = FakeWandb()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    yield fake
    fake.close()


def test_save_sends_the_spec(fake_wandb):
    urls = dashboards.save(ENTITY, "attnlab", TASKS, GROUP, TABLE)
    assert urls[0].startswith(f"{fake_wandb.url}/{ENTITY}/attnlab?nw=")
    assert urls[1].startswith(f"{fake_wandb.url}/{ENTITY}/attnlab/reports/")
    views = [r["variables"] for r in fake_wandb.requests if "upsertView" in r.get("query", "")]
    assert [v["type"] for v in views] == ["project-view", "runs"]
    expected = build_spec()
    assert json.loads(views[0]["spec"]) == expected["workspace"]
    assert (views[0]["entityName"], views[0]["projectName"]) == (ENTITY, "attnlab")
    # the saved report is the offline one plus the project of its run sets, looked up on the server
    report = json.loads(views[1]["spec"])
    run_sets = [rs for b in report["blocks"] if b["type"] == "panel-grid" for rs in b["metadata"]["runSets"]]
    assert run_sets and all(rs.pop("project")["entityName"] == ENTITY for rs in run_sets)
    assert report == expected["report"]


def test_spec_only_from_a_sweep_dir_needs_no_server(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: any request would fail
    job = tmp_path / GROUP / "0_headline_hnas_seed1"
    job.mkdir(parents=True)
    (job / "metrics.json").write_text(json.dumps({
        "status": "ok", "task": "headline", "model": "hnas", "seed": 1, "optimized_metric": "val/rougeL",
        "overrides": ["task=headline", "model=hnas", "seed=1"], "metrics": {"test/rougeL": 0.25}}))
    out = tmp_path / "spec.json"
    assert dashboards.main(["--entity", ENTITY, "--sweep-dir", str(tmp_path / GROUP), "--spec-only", str(out)]) == 0
    spec = json.loads(out.read_text())
    titles = [p["config"].get("chartTitle") for p in spec["workspace"]["section"]["panelBankConfig"]
              ["sections"][0]["panels"]]
    assert titles == ["val/rougeL (headline)", "test/rougeL (headline)", "train/loss"]
    tables = [b["content"] for b in spec["report"]["blocks"] if b["type"] == "markdown-block"]
    assert len(tables) == 1 and "| model=hnas task=headline | 1 | 0 | 0.2500 |" in tables[0]  # attnlab.study.report
    assert dashboards.main(["--entity", ENTITY, "--tasks", "nope", "--spec-only", str(out)]) == 2
