"""Runs that did not beat their task's trivial baseline enter no verdict and are listed; a task
with a config group of its own name (the probes) enters its claims once per variant."""

import math
import textwrap
from pathlib import Path

from helpers.paths import ROOT

from attnlab.study.evidence import NOT_TESTED, Run
from attnlab.study.learned import DID_LEARN_MARGIN
from attnlab.study.reproduce import coda_diversity, explaining_away, head_diversity
from attnlab.study.reproduce.plan import Plan
from attnlab.study.reproduce.results import Results


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
    write_task(conf, "toy", "[coda_diversity]")
    write_task(conf, "lossy", "[coda_diversity]", monitor_mode="min")
    write_task(conf, "bare", "[coda_diversity]", baseline=None)
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
    assert table.splitlines()[:2] == ["| run | metric | value | trivial baseline | learned |",
                                      "|---|---|---|---|---|"]
    assert len(table.splitlines()) == 2 + len(results.records) - 1  # the failed run has no row
    # the texts the report prints: a value not logged is "missing"; no baseline, no comparison
    assert results.error(missing) == "did not learn: val/acc 0.5 vs baseline missing (val/baseline_acc)"
    assert results.learning(Run("bare", "unas", 1)).text() == "val/acc 0 (no baseline on the task's card)"
    results.add(Run("toy", "sinkhorn", 1), {"status": "ok", "run_dir": "/nowhere"})  # no metrics
    assert results.error(Run("toy", "sinkhorn", 1)) == (
        "did not learn: val/acc missing vs baseline missing (val/baseline_acc)")


def test_a_claim_draws_no_verdict_from_runs_that_did_not_learn_and_lists_them(tmp_path):
    conf = tmp_path / "conf"
    write_task(conf, "toy", "[coda_diversity]")
    plan = Plan("quick", tmp_path)
    results = Results(plan.cards)
    for model, value in {"unas": 0.1, "coda": 0.3}.items():
        results.add(plan.run("toy", model, 1), ok(0.20, 0.20, **{"test/avg_jsd": value}))
    result = coda_diversity.evaluate(plan, results, tmp_path)
    assert result.verdict == NOT_TESTED and "no task has a pair of runs that both learned" in result.reason
    assert "toy seed 1 / unas: did not learn" in result.details
    assert "toy seed 1 / coda: did not learn" in result.details


def test_a_task_with_a_config_group_of_its_name_enters_each_claim_once_per_variant(tmp_path):
    conf = tmp_path / "conf"
    write_task(conf, "probe", "[explaining_away, coda_diversity]")
    write_variant(conf, "probe", "anything")  # no claims of its own: every claim of the card
    write_variant(conf, "probe", "slots", "[coda_diversity]")
    write_task(conf, "plain", "[explaining_away]")
    plan = Plan("quick", tmp_path)
    assert plan.variants("plain") == [()]
    assert plan.claim_variants("explaining_away") == [("plain", ()), ("probe", ("probe=anything",))]
    assert plan.claim_variants("coda_diversity") == [("probe", ("probe=anything",)),
                                                     ("probe", ("probe=slots",))]
    assert plan.label("probe", ("probe=slots",)) == "probe:slots" and plan.label("plain", ()) == "plain"
    # the tasks' encoders are described with one seed; the probe is the claim's evidence (its
    # own conf/probe/unmatched_key.yaml, absent here: nothing to train for it)
    assert set(explaining_away.runs(plan)) == {plan.run("plain", m, 1) for m in ("unas", "dnas")}
    # head diversity: every variant, each seed of the probe task (5 in quick), UNAS and CODA
    runs = head_diversity.runs(plan, "coda_diversity", "coda")
    assert len(runs) == 2 * 5 * 2 and {r.model for r in runs} == {"unas", "coda"}
    assert {r.seed for r in runs} == {1, 2, 3, 4, 5}


def test_the_probe_task_enters_its_claims_through_its_probes():
    plan = Plan("quick", ROOT, tasks=("probe",))
    probes = {f"probe={p.stem}" for p in (ROOT / "conf" / "probe").glob("*.yaml")}
    runs = [r for r in head_diversity.runs(plan, "coda_diversity", "coda") if r.task == "probe"]
    entered = {e for r in runs for e in r.extra if e.startswith("probe=")}
    assert entered == {"probe=head_slots"} and entered <= probes
    assert all(r.extra[:len(plan.cards["probe"].multi_head)] == plan.cards["probe"].multi_head
               for r in runs)
    # explaining away is judged on unmatched_key: its main setting and both controls, 5 seeds
    probe_runs = [r for r in explaining_away.runs(plan) if r.task == "probe"]
    assert {e for r in probe_runs for e in r.extra if e.startswith("probe=")} == {"probe=unmatched_key"}
    assert {r.seed for r in probe_runs} == set(range(1, 6)) and {r.model for r in probe_runs} == {"unas", "dnas"}
    conditions = {tuple(e for e in r.extra if e.startswith("probe.options.")) for r in probe_runs}
    assert conditions == {(), ("probe.options.a_queries=false",), ("probe.options.disjoint=true",)}


def test_head_diversity_counts_each_learned_pair_once_and_says_what_it_left_out(tmp_path):
    """The sign test's k of n from the runs: a tie is not higher, a pair with a missing run or a
    missing metric is left out with a note (and the task's later seeds still count), an
    unselected task is listed as not run, the probe task takes its own seeds."""
    conf = tmp_path / "conf"
    for task in ("left", "other", "probe", "toy"):
        write_task(conf, task, "[coda_diversity]")
    with (conf / "task" / "toy.yaml").open("a") as f:  # the card's multi-head overrides
        f.write("    multi_head: [model.num_heads=2]\n")
    plan = Plan("full", tmp_path, tasks=("other", "probe", "toy"))  # seeds 1, 2, 3; probe 1-10
    results = Results(plan.cards)
    jsd = "test/avg_jsd"
    values = {("other", 3): (0.1, 0.2), ("toy", 1): (0.1, 0.2), ("toy", 2): (0.3, 0.5),
              ("toy", 3): (0.15, 0.15)}  # (UNAS, CODA); toy seed 3: a tie
    for (task, seed), (base, ours) in values.items():
        extra = plan.cards[task].multi_head
        results.add(plan.run(task, "unas", seed, extra), ok(0.3, 0.2, **{jsd: base}))
        results.add(plan.run(task, "coda", seed, extra), ok(0.3, 0.2, **{jsd: ours}))
    results.add(Run("other", "unas", 1), ok(0.3, 0.2, **{jsd: 0.1}))  # its CODA run is missing
    results.add(Run("other", "unas", 2), ok(0.3, 0.2, **{jsd: 0.1}))
    results.add(Run("other", "coda", 2), ok(0.3, 0.2))  # finished, but logged no head JSD
    claim = {"NAME": "coda_diversity", "TITLE": "the title", "PAPER": "the paper", "CLAIM": "it"}
    got = head_diversity.evaluate(plan, results, claim, "coda", jsd)
    assert (got.name, got.title, got.source, got.paper) == ("coda_diversity", "the title",
                                                             "the paper", "it")
    # 3 of 4 higher: P(X >= 3 | n 4, 1/2) = 5 / 16, underpowered
    assert got.verdict == NOT_TESTED
    assert got.reason == ("underpowered: higher in 3 of 4 measurements (sign test p 0.31; at least "
                          "5 of 5 in one direction are needed)")
    assert got.ours == f"coda's {jsd} above UNAS's in 3 of 4 paired measurements (sign test p 0.312)"
    assert got.setting == ("other: CPU defaults; probe: CPU defaults; "
                           "toy: CPU defaults model.num_heads=2")
    assert got.seeds == "other: 1, 2, 3; probe: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10; toy: 1, 2, 3"
    probe_missing = [f"- probe seed {s} / {m}: not run" for s in range(1, 11) for m in ("unas", "coda")]
    assert got.details == "\n".join([
        f"| task | seed | UNAS {jsd} | coda {jsd} | |", "|---|---|---|---|---|",
        "| other | 3 | 0.1 | 0.2 | higher |", "| toy | 1 | 0.1 | 0.2 | higher |",
        "| toy | 2 | 0.3 | 0.5 | higher |", "| toy | 3 | 0.15 | 0.15 | not higher |", "",
        "- left: not run (not selected with --tasks)", "- other seed 1 / coda: not run",
        f"- other seed 2: no {jsd}", *probe_missing])
    # with no pair at all: not tested, and the notes say why
    nothing = head_diversity.evaluate(plan, Results(plan.cards), claim, "coda", jsd)
    assert (nothing.name, nothing.title, nothing.source, nothing.paper) == (
        "coda_diversity", "the title", "the paper", "it")
    assert nothing.verdict == NOT_TESTED
    assert nothing.reason == "no task has a pair of runs that both learned"
    assert nothing.details.splitlines()[:2] == ["- left: not run (not selected with --tasks)",
                                                "- other seed 1 / unas: not run"]
    assert all(math.isnan(p) for p in head_diversity.sign_test(0, 0))
