"""`python -m attnlab.reproduce`: claims and their tasks found from the task cards, runs grouped
into train.py sweeps, the explained-away reader, and the command end to end on one claim with real
(tiny) training runs."""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
from helpers.paths import CONF, ROOT

from attnlab.errors import ConfigError
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED
from attnlab.study.launch import group_sweeps
from attnlab.study.reproduce.cli import main as reproduce_main
from attnlab.study.reproduce.plan import GENERIC_QUICK, Plan
from attnlab.study.reproduce.registry import claims
from attnlab.study.reproduce.results import Results, explained_away

CLAIMS = claims(CONF)


def write_card(conf: Path, name: str, claims_entry: str, in_quick: bool = False) -> None:
    (conf / "task").mkdir(parents=True, exist_ok=True)
    (conf / "task" / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        # @package _global_
        task:
          name: {name}
          optimized_metric: val/acc
          card:
            reproduce:
              claims: {claims_entry}
              in_quick: {str(in_quick).lower()}
        """))


def test_claims_and_their_tasks_come_from_the_task_cards(tmp_path):
    # VQA's own claim is named by its card and reported where the card lists it
    assert list(CLAIMS) == ["mode_collapse", "explaining_away", "multiview_vqa",
                            "pretrained_explaining_away", "hnas_u", "coda_diversity",
                            "repulsive_diversity", "length_ssmax", "length_stickbreaking",
                            "length_gate", "sinks_softpick", "sinks_gate", "lowbit_kurtosis"]
    assert CLAIMS["multiview_vqa"].__name__ == "tasks.vqa.claim"
    plan = Plan("quick", ROOT)
    for name in ("explaining_away", "hnas_u", "coda_diversity", "repulsive_diversity"):
        assert plan.claim_tasks(name) == [t for t, card in plan.cards.items() if name in card.claims]
        assert {r.task for r in CLAIMS[name].runs(plan)} == set(plan.claim_tasks(name)), name
    # settings per mode: the card's quick overrides (none at all: `quick: []`) and paper preset
    for task, card in plan.cards.items():
        assert plan.task_overrides(task) == list(GENERIC_QUICK if card.quick is None else card.quick)
        if card.preset:
            assert Plan("gpu", ROOT).task_overrides(task) == [f"experiment={card.preset}", "hardware=gpu"]
    assert plan.task_overrides("probe") == []
    assert plan.quick_tasks == [t for t, card in plan.cards.items() if card.in_quick]
    # a new task enters a claim with its card alone, and its own claim module is found by name
    conf = tmp_path / "conf"
    write_card(conf, "aaa", "[coda_diversity, repulsive_diversity]", in_quick=True)
    write_card(conf, "classify", "[explaining_away, tasks.classify.pretrained_claim, coda_diversity]")
    write_card(conf, "zzz", "[explaining_away, tasks.vqa.claim, coda_diversity]")
    assert list(claims(conf)) == list(CLAIMS)
    write_card(conf, "aaa", "[coda_diversty]")
    with pytest.raises(ConfigError, match="names 'coda_diversty', no claim; use one of") as err:
        claims(conf)
    assert "\n" not in str(err.value)
    write_card(conf, "aaa", "[tasks.aaa.claim]")
    with pytest.raises(ConfigError, match="cannot be imported"):
        claims(conf)


def test_the_library_never_imports_the_tasks():
    """src/ -> tasks/ is never an import: the tasks hand the library what it needs (cards, names)."""
    for path in sorted((ROOT / "src" / "attnlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            assert not any(n == "tasks" or n.startswith("tasks.") for n in names), (path, node.lineno)
        assert "sys.path" not in path.read_text(), path


def test_runs_of_several_claims_share_sweeps_and_untrained_tasks_are_left_out(tmp_path):
    plan = Plan("quick", ROOT)
    wanted = [r for c in CLAIMS.values() for r in c.runs(plan)]
    runs = [r for r in dict.fromkeys(wanted) if not plan.skip_reason(r.task)]
    trained = [r for s in group_sweeps(runs) for r in s.runs]
    assert len(trained) == len(set(trained)) == len(runs)
    # explaining_away's vqa runs are multiview_vqa's default-benchmark runs: trained once
    vqa_unas = plan.run("vqa", "unas", 1)
    assert vqa_unas in CLAIMS["explaining_away"].runs(plan) and vqa_unas in CLAIMS["multiview_vqa"].runs(plan)
    assert trained.count(vqa_unas) == 1
    # --quick: the doubly-normalized attention paper's tasks; the others on request (--tasks)
    skipped = {r.task for r in wanted if plan.skip_reason(r.task)}
    assert skipped == {"mt", "classify", "lm"} == {r.task for r in wanted} - set(plan.quick_tasks)
    assert "add it with --tasks" in plan.skip_reason("mt")
    mt = Plan("quick", ROOT, tasks=("mt",))
    mt_runs = [r for c in CLAIMS.values() for r in c.runs(mt) if not mt.skip_reason(r.task)]
    assert {r.task for r in mt_runs} == {"mt"} and {r.model for r in mt_runs} == {
        "unas", "dnas", "coda", "repulsive"}
    vqa = next(s for s in group_sweeps(runs) if s.task == "vqa" and s.extra == vqa_unas.extra)
    overrides = vqa.overrides(plan.common)
    assert overrides[0] == "task=vqa" and overrides[2] == "seed=1"
    assert set(overrides[1][len("model="):].split(",")) == {"unas", "dnas", "hnas"}  # CODA: multi_head
    assert "logger=csv" in overrides and "trainer.max_epochs=2" in overrides
    # --tasks restricts, --override reaches every run, --full uses the CPU defaults and 3 seeds
    plan = Plan("full", ROOT, tasks=("mlm",), overrides=("trainer.max_epochs=1",))
    assert plan.common[-1] == "trainer.max_epochs=1" and plan.seeds == (1, 2, 3)
    assert plan.task_overrides("mlm") == [] and plan.skip_reason("vqa") == "not selected with --tasks"


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = sorted({k for r in rows for k in r})
    path.parent.mkdir(parents=True)
    path.write_text(",".join(keys) + "\n" + "\n".join(",".join(str(r.get(k, "")) for k in keys) for r in rows) + "\n")


def test_explained_away_reads_metrics_json_or_else_the_last_csv_values(tmp_path):
    in_json = {"metrics": {"explained_away/layer1/share_below_1e-08": 0.25, "explained_away/layer1/min_col_sum": 0.1,
                           "explained_away/layer0/bound_1_over_S": 0.02, "val/acc": 0.5}}
    assert explained_away(in_json) == {0: {"bound_1_over_S": 0.02}, 1: {"share_below": 0.25, "min_col_sum": 0.1}}
    write_csv(tmp_path / "csv" / "metrics.csv", [
        {"epoch": 0, "explained_away/layer0/share_below_1e-08": 0.5, "explained_away/layer0/min_col_sum_times_S": 0.3},
        {"epoch": 0, "val/acc": 0.1},
        {"epoch": 1, "explained_away/layer0/share_below_1e-08": 0.0, "explained_away/layer0/log_col_sum/q50": -2.0},
    ])
    record = {"metrics": {"val/acc": 0.5}, "run_dir": str(tmp_path)}
    assert explained_away(record) == {0: {"share_below": 0.0, "min_col_sum_times_S": 0.3, "log_col_sum/q50": -2.0}}
    assert explained_away({"metrics": {}, "run_dir": str(tmp_path / "nowhere")}) == {}
    # a run written before the rename: its `sink_mass` is read as `unassigned_mass`
    old = {"metrics": {"explained_away/layer0/sink_mass": 0.2, "explained_away/layer0/entropy": 1.5}}
    assert explained_away(old) == {0: {"unassigned_mass": 0.2, "entropy": 1.5}}


def test_claims_without_runs_say_not_tested_and_why(tmp_path):
    plan = Plan("quick", ROOT, tasks=("nothing",))
    # (mode_collapse computes its toy first: tests/study/reproduce/test_reproduce_verdicts.py)
    for name in ("explaining_away", "multiview_vqa", "hnas_u", "coda_diversity", "repulsive_diversity"):
        result = CLAIMS[name].evaluate(plan, Results(), tmp_path)
        assert result.verdict == NOT_TESTED and result.reason, name


def test_reproduce_end_to_end_on_tiny_vqa_runs(tmp_path, capsys):
    """Explaining away on VQA: a real UNAS and DNAS train.py sweep (tiny data), report and PNGs."""
    out = tmp_path / "report"
    tiny = ["task.synthetic.n_train_images=40", "task.synthetic.n_val_images=16", "task.synthetic.n_test_images=16",
            "task.synthetic.questions_per_image=4", "trainer.max_epochs=1", f"paths.data_dir={tmp_path / 'data'}"]
    cmd = [sys.executable, "-m", "attnlab.reproduce", "--claims", "explaining_away,mode_collapse", "--tasks", "vqa",
           "--jobs", "1", "--out", str(out)] + [a for o in tiny for a in ("--override", o)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (out / "REPORT.md").read_text()
    assert "## Explaining away" in report and "## Mode collapse" in report
    for name in re.findall(r"!\[[^]]*\]\(([^)]+)\)", report):
        assert (out / name).stat().st_size > 1000, name
    assert {"mode_collapse_steps.png", "mode_collapse_1d.png"} <= set(re.findall(r"\]\(([^)]+)\)", report))
    records = [json.loads(p.read_text()) for p in (out / "runs").rglob("metrics.json")]
    assert sorted(r["model"] for r in records) == ["dnas", "unas"]
    assert all(r["status"] == "ok" and r["seed"] == 1 for r in records)
    # every run against its trivial baseline; the explaining-away row: a measured verdict from
    # runs that learned, none (and why) from runs that did not, the not-run tasks listed
    runs = [line for line in report.split("## Did the runs learn?")[1].splitlines() if line.startswith("| vqa/")]
    assert sorted(line.split(" ")[1] for line in runs) == ["vqa/dnas", "vqa/unas"]
    assert all("`val/acc`" in line and "(`val/baseline_acc`)" in line for line in runs)
    # the verdicts rest on the probes, not trained here (--tasks vqa): not tested, and why
    for title in ("| Explaining away", "| Mode collapse"):
        row = next(line for line in report.splitlines() if line.startswith(title))
        assert f"**{NOT_TESTED}**: the " in row and "probe was not trained: not selected with --tasks" in row
    if all(line.endswith("| yes |") for line in runs):  # the tasks' encoders described
        assert "| vqa | 0 |" in report and "| vqa | 1 |" in report
        assert "](explained_away_vqa_unas.png)" in report and "](explained_away_vqa_dnas.png)" in report
    else:  # 2 steps on 160 questions: the tiny runs may stay at the majority answer
        assert "vqa/unas: did not learn: val/acc" in report or "vqa/dnas: did not learn: val/acc" in report
    assert "mlm: not run (not selected with --tasks)" in report
    # started again with the same --out, the finished runs are reused, not trained again (the
    # command's entry in this process: nothing is launched)
    capsys.readouterr()
    with mock.patch.dict(os.environ, {"WANDB_MODE": "offline"}):
        assert reproduce_main([cmd[3], "explaining_away", *cmd[5:]]) == 0
    again = capsys.readouterr().out
    assert "0 to train in 0 sweep(s), 2 reused" in again, again[-2000:]


@pytest.mark.slow
def test_reproduce_quick_writes_every_claim(tmp_path):
    """The whole --quick reproduction (minutes on 2 quiet cores): every claim gets a row
    with a verdict, and every figure it names is beside the report."""
    out = tmp_path / "report"
    env = {**os.environ, "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "-m", "attnlab.reproduce", "--quick", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3 * 3600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (out / "REPORT.md").read_text()
    for claim in CLAIMS.values():
        row = next(line for line in report.splitlines() if line.startswith(f"| {claim.TITLE} ("))
        assert any(f"**{v}**" in row for v in (HOLDS, CONTRADICTED, NOT_TESTED)), row
    for name in re.findall(r"!\[[^]]*\]\(([^)]+)\)", report):
        assert (out / name).is_file(), name
