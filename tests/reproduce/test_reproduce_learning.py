"""Runs that did not beat their task's trivial baseline enter no verdict; a task with a config group
of its own name (the probes) enters its claims once per variant."""

import math
import textwrap
from pathlib import Path

from helpers.paths import ROOT

from attnlab.comparison_stats import DID_LEARN_MARGIN
from attnlab.reproduce import explaining_away, head_diversity, learned_evidence, mode_collapse
from attnlab.reproduce.plan import Plan, Run
from attnlab.reproduce.results import NOT_RUN, Results


def write_task(conf: Path, name: str, claims: str, baseline: str | None = "val/baseline_acc",
               monitor_mode: str = "max") -> None:
    (conf / "task").mkdir(parents=True, exist_ok=True)
    card_baseline = f"baseline: {baseline}" if baseline else ""
    (conf / "task" / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        # @package _global_
        task:
          name: {name}
          optimized_metric: val/acc
          monitor_mode: {monitor_mode}
          card:
            {card_baseline}
            reproduce:
              claims: {claims}
              in_quick: true
        """))


def write_variant(conf: Path, task: str, name: str, claims: str | None = None) -> None:
    (conf / task).mkdir(parents=True, exist_ok=True)
    line = f"  claims: {claims}\n" if claims else ""
    (conf / task / f"{name}.yaml").write_text(f"# @package _global_\n{task}:\n  name: {name}\n{line}")


def ok(acc: float, baseline: float | None, **metrics) -> dict:
    values = {"val/acc": acc, **metrics}
    if baseline is not None:
        values["val/baseline_acc"] = baseline
    return {"status": "ok", "metrics": values, "run_dir": "/nowhere"}


def test_a_run_that_does_not_beat_its_baseline_is_handed_out_as_failed(tmp_path):
    conf = tmp_path / "conf"
    write_task(conf, "toy", "[head_diversity]")
    write_task(conf, "lossy", "[head_diversity]", monitor_mode="min")
    write_task(conf, "bare", "[head_diversity]", baseline=None)
    plan = Plan("quick", tmp_path)
    results = Results(plan.cards)
    learned, plateau, missing = Run("toy", "unas", 1), Run("toy", "dnas", 1), Run("toy", "coda", 1)
    results.add(learned, ok(0.30, 0.20))
    results.add(plateau, ok(0.20 + DID_LEARN_MARGIN / 2, 0.20))  # within the margin: noise
    results.add(missing, ok(0.50, None))  # the card names a baseline the run did not log
    assert results.get(learned) is not None and results.error(learned) is None
    for run in (plateau, missing):
        assert results.get(run) is None
        assert results.error(run).startswith("did not learn: val/acc")
        assert math.isnan(results.metric(run, "val/acc"))  # claims read nothing from it
    assert "vs baseline 0.2 (val/baseline_acc)" in results.error(plateau)
    # lower is better (perplexity): learning means going below the baseline
    results.add(Run("lossy", "unas", 1), ok(90.0, 100.0))
    results.add(Run("lossy", "dnas", 1), ok(110.0, 100.0))
    assert results.get(Run("lossy", "unas", 1)) and not results.get(Run("lossy", "dnas", 1))
    # a task whose card names no baseline cannot be judged: its runs count
    results.add(Run("bare", "unas", 1), ok(0.0, None))
    assert results.get(Run("bare", "unas", 1)) is not None
    # failures keep their own error; without cards (old callers) nothing is judged
    results.add(Run("toy", "repulsive", 1), {"status": "failed", "error": "boom"})
    assert results.error(Run("toy", "repulsive", 1)) == "boom"
    bare = Results()
    bare.add(plateau, ok(0.0, 0.5))
    assert bare.get(plateau) is not None
    table = results.runs_table()
    assert "| toy/unas seed 1 | `val/acc` | 0.3 | 0.2 (`val/baseline_acc`) | yes |" in table
    assert "| toy/dnas seed 1 | `val/acc` | 0.205 | 0.2 (`val/baseline_acc`) | **did not learn** |" in table
    assert "| bare/unas seed 1 | `val/acc` | 0 | — | not judged |" in table


def test_a_claim_draws_no_verdict_from_runs_that_did_not_learn(tmp_path):
    conf = tmp_path / "conf"
    write_task(conf, "toy", "[head_diversity]")
    plan = Plan("quick", tmp_path)
    results = Results(plan.cards)
    jsd = {"unas": 0.1, "coda": 0.3, "repulsive": 0.1}
    for model, value in jsd.items():
        results.add(Run("toy", model, 1), ok(0.20, 0.20, **{"test/avg_jsd": value, "test/head_distance": 1.0}))
    result = head_diversity.evaluate(plan, results, tmp_path)
    assert result.verdict == NOT_RUN and "toy/unas: did not learn" in result.ours


def test_a_task_with_a_config_group_of_its_name_enters_each_claim_once_per_variant(tmp_path):
    conf = tmp_path / "conf"
    write_task(conf, "probe", "[explaining_away, mode_collapse]")
    write_variant(conf, "probe", "coverage")  # no claims of its own: every claim of the card
    write_variant(conf, "probe", "clusters", "[mode_collapse]")
    write_task(conf, "plain", "[explaining_away]")
    plan = Plan("quick", tmp_path)
    assert plan.variants("plain") == [()]
    assert plan.claim_variants("explaining_away") == [("plain", ()), ("probe", ("probe=coverage",))]
    assert plan.claim_variants("mode_collapse") == [("probe", ("probe=clusters",)), ("probe", ("probe=coverage",))]
    assert plan.label("probe", ("probe=clusters",)) == "probe:clusters" and plan.label("plain", ()) == "plain"
    assert set(explaining_away.runs(plan)) == {Run(t, m, 1, e) for t, e in plan.claim_variants("explaining_away")
                                                 for m in ("unas", "dnas")}
    # mode collapse: the toy trains nothing, the clusters variant trains UNAS and DNAS
    results = Results(plan.cards)
    results.add(Run("probe", "unas", 1, ("probe=clusters",)), ok(0.40, 0.25))
    results.add(Run("probe", "dnas", 1, ("probe=clusters",)), ok(0.55, 0.25))
    results.add(Run("probe", "unas", 1, ("probe=coverage",)), ok(0.25, 0.25))
    table, sentences = learned_evidence.compare(plan, results, mode_collapse.NAME, mode_collapse.SCHEMES)
    assert "| probe:clusters | `val/acc` | 0.400 | 0.550 | 0.250 |" in table
    assert sentences == ["probe:clusters: UNAS 0.400, DNAS 0.550 (baseline 0.250; best DNAS, one seed)"]
    coverage = next(line for line in table if line.startswith("| probe:coverage"))
    assert "0.250 (did not learn)" in coverage and "failed: not run" in coverage


def test_the_probe_task_enters_its_claims_once_per_probe():
    plan = Plan("quick", ROOT, tasks=("probe",))
    if not plan.task_exists("probe"):
        return  # the probe task is not in this checkout
    probes = {f"probe={p.stem}" for p in (ROOT / "conf" / "probe").glob("*.yaml")}
    runs = [r for r in head_diversity.runs(plan) if r.task == "probe"]
    entered = {r.extra[-1] for r in runs}
    assert entered and entered <= probes
    for extra in entered:  # each probe: UNAS, CODA, repulsive, with the card's multi-head overrides
        assert sorted(r.model for r in runs if r.extra[-1] == extra) == sorted(head_diversity.MODELS)
    assert all(r.extra[:-1] == plan.cards["probe"].multi_head for r in runs)
