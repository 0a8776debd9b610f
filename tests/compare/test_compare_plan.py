"""attnlab.compare's plan: schemes and probes discovered from conf/, the sweeps that train the
missing runs, and which earlier runs a second invocation reuses (by their metrics.json)."""

import json
import sys

from helpers.paths import CONF, ROOT

from attnlab.compare.plan import (
    COMMON,
    ComparePlan,
    Run,
    discover,
    finished_runs,
    probe_mode_overrides,
    sweeps_for,
)
from attnlab.reproduce.launch import command


def test_schemes_and_probes_are_the_config_files(tmp_path):
    assert discover(CONF, "model") == sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
    assert "unas" in discover(CONF, "model") and "dnas" in discover(CONF, "model")
    assert discover(CONF, "probe") == sorted(p.stem for p in (CONF / "probe").glob("*.yaml"))
    # a new probe is one YAML: nothing else lists them
    (tmp_path / "probe").mkdir()
    for name in ("zeta", "alpha"):
        (tmp_path / "probe" / f"{name}.yaml").write_text(f"probe:\n  name: {name}\n")
    assert discover(tmp_path, "probe") == ["alpha", "zeta"]


def test_mode_overrides_come_from_the_probe_config(tmp_path):
    (tmp_path / "conf" / "probe").mkdir(parents=True)
    (tmp_path / "conf" / "probe" / "p.yaml").write_text(
        "probe:\n  name: p\n  compare:\n    full: [probe.options.seq_len=64]\n    gpu: [probe.n_train=100000]\n")
    (tmp_path / "conf" / "probe" / "q.yaml").write_text("probe:\n  name: q\n")
    assert probe_mode_overrides(tmp_path / "conf", "p", "full") == ["probe.options.seq_len=64"]
    assert probe_mode_overrides(tmp_path / "conf", "q", "full") == []
    quick = ComparePlan(tmp_path, "quick", ["unas"], ["p"], [1])
    assert quick.overrides("p") == ["task=probe", "probe=p", *COMMON]
    assert ComparePlan(tmp_path, "full").overrides("p") == [
        "task=probe", "probe=p", "probe.options.seq_len=64", *COMMON]
    assert ComparePlan(tmp_path, "gpu", extra=("trainer.max_epochs=9",)).overrides("p") == [
        "task=probe", "probe=p", "hardware=gpu", "probe.n_train=100000", *COMMON, "trainer.max_epochs=9"]


def test_missing_runs_become_one_sweep_per_probe_and_seed_set(tmp_path):
    plan = ComparePlan(ROOT, "quick", ["unas", "dnas", "hnas"], ["recall", "coverage"], [1, 2, 3])
    assert len(plan.runs) == 18
    # everything missing but dnas seed 2 on coverage, which finished earlier
    missing = [r for r in plan.runs if r != Run("coverage", "dnas", 2)]
    sweeps = sweeps_for(missing, tmp_path)
    shapes = {(s.slug, tuple(s.models), tuple(s.seeds)) for s in sweeps}
    assert shapes == {("recall-a1", ("unas", "dnas", "hnas"), (1, 2, 3)),
                      ("coverage-a1", ("unas", "hnas"), (1, 2, 3)),
                      ("coverage-a2", ("dnas",), (1, 3))}
    assert sorted(map(str, (r for s in sweeps for r in s.runs))) == sorted(map(str, missing))
    assert len(sweeps[0].runs) == 9  # the largest first
    # reproduce's launcher builds the command line from the sweep
    cmd = command(sweeps[0], plan, tmp_path / sweeps[0].slug)
    assert cmd[:3] == [sys.executable, str(ROOT / "train.py"), "-m"]
    assert cmd[3:] == ["task=probe", "probe=recall", "model=unas,dnas,hnas", "seed=1,2,3", *COMMON,
                       f"hydra.sweep.dir={tmp_path / 'recall-a1'}"]
    # a later attempt does not reuse an earlier attempt's dir
    (tmp_path / "recall-a1").mkdir()
    (tmp_path / "recall-a7").mkdir()
    assert {s.slug for s in sweeps_for([Run("recall", "unas", 1)], tmp_path)} == {"recall-a8"}


def test_one_probe_is_split_so_that_every_job_has_a_sweep(tmp_path):
    plan = ComparePlan(ROOT, "quick", ["unas", "dnas", "hnas", "coda", "entmax"], ["recall"], [1, 2, 3])
    sweeps = sweeps_for(plan.runs, tmp_path, jobs=2)
    assert [(s.slug, s.models, s.seeds) for s in sweeps] == [
        ("recall-a1", ["unas", "dnas", "hnas"], [1, 2, 3]), ("recall-a2", ["coda", "entmax"], [1, 2, 3])]
    assert [len(s) for s in (sweeps_for(plan.runs, tmp_path, jobs=1), sweeps_for(plan.runs[:1], tmp_path, jobs=2))] == [1, 1]


def write_record(runs_dir, slug, plan, run, status="ok", overrides=None, acc=0.9):
    """A job's metrics.json as the runner writes it (Hydra records `~key` as `~key=null` and a
    value as it parsed it: `false` as `False`)."""
    given = overrides if overrides is not None else [
        o + "=null" if o.startswith("~") else o.replace("=false", "=False")
        for o in [*plan.overrides(run.probe), f"model={run.model}", f"seed={run.seed}"]]
    assert overrides is not None or any(o.endswith("=False") for o in given)
    d = runs_dir / slug / f"{run.model}_seed{run.seed}"
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({
        "status": status, "task": "probe", "model": run.model, "seed": run.seed, "overrides": given,
        "metrics": {"test/acc": acc} if status == "ok" else {}}))


def test_a_second_invocation_reuses_exactly_the_finished_runs(tmp_path):
    plan = ComparePlan(ROOT, "quick", ["unas", "dnas"], ["recall"], [1, 2])
    write_record(tmp_path, "recall-a1", plan, Run("recall", "unas", 1))
    write_record(tmp_path, "recall-a1", plan, Run("recall", "unas", 2), status="failed")
    write_record(tmp_path, "recall-a1", plan, Run("recall", "dnas", 1), status="running")  # killed
    write_record(tmp_path, "recall-a2", plan, Run("recall", "unas", 2))  # the failed one, again
    # trained with other settings (another --override): not this plan's run
    other = ComparePlan(ROOT, "quick", ["dnas"], ["recall"], [2], extra=("trainer.max_epochs=1",))
    write_record(tmp_path, "recall-a3", other, Run("recall", "dnas", 2))
    found = finished_runs(plan, tmp_path)
    assert set(found) == {Run("recall", "unas", 1), Run("recall", "unas", 2)}
    assert found[Run("recall", "unas", 2)]["_path"].endswith("recall-a2/unas_seed2")
    assert finished_runs(other, tmp_path) == {Run("recall", "dnas", 2): found_in(tmp_path, "recall-a3")}
    assert finished_runs(plan, tmp_path / "nothing_yet") == {}


def found_in(runs_dir, slug):
    path = next((runs_dir / slug).rglob("metrics.json"))
    return json.loads(path.read_text()) | {"_path": str(path.parent)}
