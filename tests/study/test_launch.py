"""The shared launcher (attnlab.study.launch): runs grouped into train.py sweeps, their dirs, which
earlier runs a second invocation reuses (by their metrics.json), and `train` itself against a
stand-in train.py that writes what the runner would."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from attnlab.study.evidence import Run
from attnlab.study.launch import (
    command,
    dry_run,
    finished_runs,
    group_sweeps,
    next_attempt,
    run_overrides,
    slug,
    train,
)

COMMON = ("logger=csv", "~callbacks.progress_bar", "trainer.enable_progress_bar=false")
A = ("probe=hub_key", "probe.options.ask_every_key=false", "task.module.optimizer.lr=0.003")
B = ("probe=hub_key", "probe.options.ask_every_key=true", "task.module.optimizer.lr=0.003")


def runs(extra, models, seeds, task="probe"):
    return [Run(task, m, s, extra) for m in models for s in seeds]


def shape(sweeps):
    return [(s.extra, s.models, s.seeds) for s in sweeps]


def test_runs_that_share_task_extra_and_seeds_share_a_sweep_largest_first():
    wanted = [*runs(B, ["unas"], [1]), *runs(A, ["unas", "dnas"], [1, 2, 3]),
              *runs(A, ["hnas"], [1, 2]), *runs(A, ["unas"], [1])]  # a duplicate
    sweeps = group_sweeps(wanted)
    assert shape(sweeps) == [(A, ["unas", "dnas"], [1, 2, 3]), (A, ["hnas"], [1, 2]),
                             (B, ["unas"], [1])]
    assert sorted(map(str, (r for s in sweeps for r in s.runs))) == sorted(map(str, set(wanted)))
    assert {s.task for s in sweeps} == {"probe"}
    # another task never shares a sweep
    assert len(group_sweeps([Run("probe", "unas", 1, A), Run("lm", "unas", 1, A)])) == 2


def test_sweeps_are_split_by_model_while_fewer_than_jobs():
    wanted = runs(A, ["unas", "dnas", "hnas", "coda", "entmax"], [1, 2, 3])
    assert shape(group_sweeps(wanted, jobs=1)) == [(A, ["unas", "dnas", "hnas", "coda", "entmax"],
                                                    [1, 2, 3])]
    assert shape(group_sweeps(wanted, jobs=2)) == [(A, ["unas", "dnas", "hnas"], [1, 2, 3]),
                                                   (A, ["coda", "entmax"], [1, 2, 3])]
    assert [len(s.models) for s in group_sweeps(wanted, jobs=4)] == [2, 1, 1, 1]
    # one model: nothing to split, and never an empty sweep
    assert shape(group_sweeps(runs(A, ["unas"], [1, 2]), jobs=8)) == [(A, ["unas"], [1, 2])]
    # the largest sweep has one model: the next largest that has two is split
    mixed = [*runs(A, ["unas"], range(1, 11)), *runs(B, ["unas", "dnas"], [1, 2])]
    sweeps = group_sweeps(mixed, jobs=3)
    assert all(s.models for s in sweeps) and len(sweeps) == 3
    assert shape(sweeps) == [(A, ["unas"], list(range(1, 11))), (B, ["unas"], [1, 2]),
                             (B, ["dnas"], [1, 2])]


def test_a_slug_is_readable_and_unique_per_extra():
    assert slug("probe", A).startswith("probe_hub_key_false-")
    lr = ("probe=hub_key", "probe.options.ask_every_key=false", "task.module.optimizer.lr=0.009")
    names = {slug("probe", e) for e in (A, B, lr, ())}
    assert len(names) == 4  # the rate is not in the text, but in the digest
    assert slug("probe", A) == slug("probe", A) and slug("lm", A) != slug("probe", A)
    odd = slug("probe", ("probe/analyses=full", "x.y=[1,2]", "z='a b'") * 4)
    assert len(odd) <= 48 + 7 and all(c.isalnum() or c in "-_." for c in odd)


def test_command_is_one_train_py_multirun():
    (sweep,) = group_sweeps(runs(A, ["unas", "dnas"], [1, 2]))
    cmd = command(sweep, Path("/repo"), Path("/out/sweep"), COMMON)
    assert cmd == [sys.executable, "/repo/train.py", "-m", "task=probe", "model=unas,dnas",
                   "seed=1,2", *A, *COMMON, "hydra.sweep.dir=/out/sweep"]


def hydra_recorded(overrides):
    """What a job records: Hydra writes each value back from its parsed form."""
    return [o + "=null" if o.startswith("~") else o.replace("=false", "=False")
            .replace("=true", "=True") for o in overrides]


def write_record(runs_dir, sweep_dir, run, status="ok", overrides=None, **more):
    given = overrides if overrides is not None else hydra_recorded(run_overrides(run, COMMON))
    d = runs_dir / sweep_dir / f"{run.model}_seed{run.seed}"
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({
        "status": status, "task": run.task, "model": run.model, "seed": run.seed,
        "overrides": given, "metrics": {"test/acc": 0.9} if status == "ok" else {}, **more}))
    return d


def test_a_second_invocation_reuses_exactly_the_finished_runs(tmp_path):
    u1, u2, d1, d2 = (Run("probe", m, s, A) for m in ("unas", "dnas") for s in (1, 2))
    write_record(tmp_path, "s-a1", u1)
    write_record(tmp_path, "s-a1", u2, status="failed")
    write_record(tmp_path, "s-a1", d1, status="running", host="elsewhere", pid=1)  # killed?
    write_record(tmp_path, "s-a2", u2)  # the failed one, again: now finished
    # the overrides in another order, `false` as written and `~key` without `=null`
    write_record(tmp_path, "s-a3", d2, overrides=list(reversed(run_overrides(d2, COMMON))))
    # another setting (a different --override), and a job that died before its metrics.json
    other = Run("probe", "unas", 1, (*A, "trainer.max_epochs=1"))
    write_record(tmp_path, "s-a4", other)
    (tmp_path / "s-a5" / "dead" / ".hydra").mkdir(parents=True)
    (tmp_path / "s-a5" / "dead" / ".hydra" / "overrides.yaml").write_text(
        "".join(f"- {o}\n" for o in hydra_recorded(run_overrides(d1, COMMON))))
    found = finished_runs([u1, u2, d1, d2], tmp_path, COMMON)
    assert set(found) == {u1, u2, d2}
    assert found[u2]["_path"].endswith("s-a2/unas_seed2") and found[u2]["status"] == "ok"
    assert set(finished_runs([other], tmp_path, COMMON)) == {other}
    # the same run under other common overrides is not the same run
    assert finished_runs([u1], tmp_path, COMMON[:1]) == {}
    assert finished_runs([u1], tmp_path / "nothing_yet", COMMON) == {}


def test_normalization_is_hydras():
    """Both sides of the comparison go through Hydra's parser: `false`/`False`, `~key` and
    `~key=null`, `1.0`/`1.0`, quoting; a value that differs is another run."""
    run = Run("probe", "unas", 1, ("a.b=false", "~c.d", "e=1.0", "f='x y'"))
    recorded = ["task=probe", "model=unas", "seed=1", "a.b=False", "~c.d=null", "e=1.0",
                "f='x y'"]
    from attnlab.study.launch import _normalized

    assert _normalized(run_overrides(run)) == _normalized(recorded)
    assert _normalized(run_overrides(run)) != _normalized([*recorded[:-1], "f='x z'"])
    assert _normalized(["seed=1"]) != _normalized(["seed=2"])
    assert _normalized(["broken=[1,"]) == frozenset(["broken=[1,"])  # train.py will say why


def test_next_attempt_counts_past_every_earlier_dir(tmp_path):
    assert next_attempt(tmp_path, "s") == 1
    for name in ("s-a1", "s-a7", "s-abc", "t-a9", "s-x-a3"):
        (tmp_path / name).mkdir()
    (tmp_path / "s-a12.log").write_text("a log, not a dir")
    assert next_attempt(tmp_path, "s") == 8
    assert next_attempt(tmp_path, "t") == 10


def test_dry_run_lists_the_commands_of_what_is_missing(tmp_path):
    wanted = [*runs(A, ["unas", "dnas"], [1, 2]), *runs(B, ["unas"], [1, 2])]
    write_record(tmp_path, "x-a1", wanted[0])
    lines = dry_run(wanted, Path("/repo"), tmp_path, COMMON, jobs=1)
    assert len(lines) == 3 and not list((tmp_path).glob("probe_*"))  # nothing made
    # unas seed 1 of A finished: unas seed 2 and dnas 1, 2 are two sweeps of A
    assert lines[0] == " ".join([sys.executable, "/repo/train.py", "-m", "task=probe",
                                 "model=dnas", "seed=1,2", *A, *COMMON,
                                 f"hydra.sweep.dir={tmp_path / slug('probe', A)}-a?"])
    assert " model=unas seed=1,2 " in lines[1] and " model=unas seed=2 " in lines[2]
    assert f" {' '.join(B)} " in lines[1] and f" {' '.join(A)} " in lines[2]
    assert dry_run(wanted[:1], Path("/repo"), tmp_path, COMMON) == []


FAKE_TRAIN = textwrap.dedent('''\
    """Stands in for `train.py -m`: one job dir per model x seed with the metrics.json the runner
    writes (Hydra's record of the overrides); a model named `crash` kills the sweep there."""
    import json, os, sys
    from pathlib import Path

    args = sys.argv[1:]
    assert args[0] == "-m", args
    sweep_dir = Path(next(a for a in args if a.startswith("hydra.sweep.dir=")).split("=", 1)[1])
    given = [a for a in args[1:] if not a.startswith("hydra.")]
    models = next(a for a in given if a.startswith("model=")).split("=", 1)[1].split(",")
    seeds = next(a for a in given if a.startswith("seed=")).split("=", 1)[1].split(",")
    print("sweep", models, seeds, flush=True)
    for num, (model, seed) in enumerate((m, s) for m in models for s in seeds):
        if model == "crash":
            sys.exit(3)
        job = sweep_dir / f"{num}_{model}_seed{seed}"
        job.mkdir(parents=True)
        overrides = [f"model={model}" if a.startswith("model=") else
                     f"seed={seed}" if a.startswith("seed=") else a for a in given]
        overrides = [o + "=null" if o.startswith("~") else o.replace("=false", "=False")
                     for o in overrides]
        (job / "metrics.json").write_text(json.dumps({
            "status": "ok", "task": "probe", "model": model, "seed": int(seed),
            "overrides": overrides, "metrics": {"test/acc": 0.5},
            "threads": os.environ.get("OMP_NUM_THREADS")}))
''')


@pytest.fixture
def fake_root(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "train.py").write_text(FAKE_TRAIN)
    return root


def test_train_runs_the_sweeps_then_reuses_them(fake_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    runs_dir = tmp_path / "runs"
    wanted = [*runs(A, ["unas", "dnas", "hnas"], [1, 2]), *runs(B, ["unas"], [1, 2])]
    found, trained = train(wanted, fake_root, runs_dir, COMMON, jobs=1, label="stage",
                           show=False)
    assert trained == 8 and set(found) == set(wanted)
    assert {r["status"] for r in found.values()} == {"ok"}
    assert {r["threads"] for r in found.values()} == {"7"}  # alone: the environment's threads
    out = capsys.readouterr().out
    assert f"[stage] 8 run(s): 8 to train in 2 sweep(s), 0 reused -> {runs_dir}" in out
    assert sorted(p.name for p in runs_dir.iterdir()) == sorted(
        [f"{slug('probe', A)}-a1", f"{slug('probe', A)}-a1.log", f"{slug('probe', B)}-a1",
         f"{slug('probe', B)}-a1.log"])
    # again: nothing to train; one more seed of A: only its runs, in a new attempt dir
    found, trained = train(wanted, fake_root, runs_dir, COMMON, jobs=1, label="stage",
                           show=False)
    assert trained == 0 and set(found) == set(wanted)
    assert "8 run(s): 0 to train in 0 sweep(s), 8 reused" in capsys.readouterr().out
    more = [*wanted, *runs(A, ["unas", "dnas", "hnas"], [3])]
    found, trained = train(more, fake_root, runs_dir, COMMON, jobs=2, show=False)
    assert trained == 3 and set(found) == set(more)
    assert "11 run(s): 3 to train in 2 sweep(s), 8 reused" in capsys.readouterr().out
    # side by side: one thread each; the two halves of one sweep are two attempts of its slug
    new = [found[r] for r in more if r.seed == 3]
    assert {r["threads"] for r in new} == {"1"}
    assert sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and
                  p.name.startswith(slug("probe", A))) == [f"{slug('probe', A)}-a{i}"
                                                          for i in (1, 2, 3)]


def test_a_run_without_a_metrics_json_is_a_failure_and_trains_again(fake_root, tmp_path):
    runs_dir = tmp_path / "runs"
    wanted = runs(A, ["unas", "crash"], [1])
    found, trained = train(wanted, fake_root, runs_dir, COMMON, show=False)
    assert trained == 2 and found[wanted[0]]["status"] == "ok"
    crash = found[wanted[1]]
    log = runs_dir / f"{slug('probe', A)}-a1.log"
    assert crash == {"status": "failed",
                     "error": f"train.py exited 3 without a metrics.json; see {log}"}
    assert "sweep ['unas', 'crash'] ['1']" in log.read_text()
    found, trained = train(wanted, fake_root, runs_dir, COMMON, show=False)
    assert trained == 1 and found[wanted[0]]["_path"].endswith("-a1/0_unas_seed1")
    assert (runs_dir / f"{slug('probe', A)}-a2").is_dir()


def test_a_key_given_twice_counts_once_with_its_last_value_as_hydra_records_it():
    """A task's quick setting overridden by --override: Hydra keeps one override per key, the last
    value, so a run asked with both is the run recorded with the last one (and not the first)."""
    from attnlab.study.launch import _normalized

    asked = ["task=vqa", "trainer.max_epochs=2", "model=unas", "trainer.max_epochs=1"]
    recorded = ["task=vqa", "trainer.max_epochs=1", "model=unas"]
    assert _normalized(asked) == _normalized(recorded)
    assert _normalized(asked) != _normalized(["task=vqa", "trainer.max_epochs=2", "model=unas"])
