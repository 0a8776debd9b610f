"""Train runs through train.py itself, for `compare` and `reproduce` alike.

Runs that differ only in model and seed share one Hydra multirun (`train.py -m task=<t>
model=a,b seed=1,2 <extra...> <common...>`: the runner, metrics.json per job), and `jobs` such
sweeps run side by side, one thread each, under a progress bar over the runs. A run that an
earlier invocation with the same runs dir finished with exactly the same overrides (its
metrics.json says ok) is reused, not trained again; the others train in new sweep dirs
(`<slug>-a<attempt>`), so nothing is overwritten and a killed invocation resumes.

The bar counts the jobs whose metrics.json says they ended (ok, failed or interrupted): the
runner writes it when a job starts ("running") and again when it ends.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from attnlab.study.evidence import Run, load_jobs

ENDED = ("ok", "failed", "interrupted")
POLL_S = 2.0


@dataclass
class Sweep:
    """One `train.py -m`: every model x seed of one task with the same extra overrides."""

    slug: str
    task: str
    models: list[str]
    seeds: list[int]
    extra: tuple[str, ...]

    @property
    def runs(self) -> list[Run]:
        return [Run(self.task, m, s, self.extra) for m in self.models for s in self.seeds]

    def overrides(self, common: Iterable[str] = ()) -> list[str]:
        return [f"task={self.task}", f"model={','.join(self.models)}",
                f"seed={','.join(map(str, self.seeds))}", *self.extra, *common]


def command(sweep: Sweep, root: Path, sweep_dir: Path, common: Iterable[str] = ()) -> list[str]:
    return [sys.executable, str(root / "train.py"), "-m", *sweep.overrides(common),
            f"hydra.sweep.dir={sweep_dir}"]


def slug(task: str, extra: tuple[str, ...]) -> str:
    """A readable, unique dir name for a task and its extra overrides."""
    values = [e.split("=", 1)[-1] for e in extra if e.split("=", 1)[0].split(".")[-1] != "lr"]
    text = "_".join([task, *values])[:48]
    digest = hashlib.sha1("\n".join(extra).encode()).hexdigest()[:6]
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text) + "-" + digest


def group_sweeps(runs: Iterable[Run], jobs: int = 1) -> list[Sweep]:
    """The sweeps that train `runs`: per (task, extra), the models that need the same seeds share
    one (a rectangle models x seeds); while there are fewer sweeps than `jobs`, the largest is
    split in two by its models, so that one group still keeps every core busy. Largest first (the
    last to finish is then short)."""
    seeds_of: dict[tuple, list[int]] = defaultdict(list)
    for run in dict.fromkeys(runs):  # unique, in order
        seeds_of[(run.task, run.extra, run.model)].append(run.seed)
    groups: dict[tuple, list[str]] = defaultdict(list)
    for (task, extra, model), seeds in seeds_of.items():
        groups[(task, extra, tuple(sorted(seeds)))].append(model)
    shapes = [(key, models) for key, models in groups.items()]
    while len(shapes) < jobs and any(len(models) > 1 for _, models in shapes):
        key, models = max((s for s in shapes if len(s[1]) > 1),
                          key=lambda s: len(s[1]) * len(s[0][2]))
        shapes.remove((key, models))
        half = (len(models) + 1) // 2
        shapes += [(key, models[:half]), (key, models[half:])]
    shapes.sort(key=lambda s: -len(s[1]) * len(s[0][2]))
    return [Sweep(slug(task, extra), task, models, list(seeds), extra)
            for (task, extra, seeds), models in shapes]


# ----------------------------------------------------------------------------- reuse
def _normalized(overrides: Iterable[str]) -> frozenset[str]:
    """Overrides as a sweep job records them: Hydra writes each value back from its parsed form
    (`false` -> `False`, `~key` -> `~key=null`) and keeps one override per key, the last one
    given (a task's quick setting overridden by --override), so both sides go through its parser
    and keep the last value of each key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    overrides = list(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:  # a malformed override: train.py will say what is wrong with it
        return frozenset(overrides)
    last: dict[str, str] = {}
    for override in parsed:
        key = override.get_key_element()
        if override.is_delete() and override.value() is None:
            last[key] = key
        else:
            last[key] = f"{key}={override.get_value_element_as_str()}"
    return frozenset(last.values())


def run_overrides(run: Run, common: Iterable[str] = ()) -> list[str]:
    """What a job of `run` records as its overrides (in some order)."""
    return [f"task={run.task}", f"model={run.model}", f"seed={run.seed}", *run.extra, *common]


def finished_runs(runs: Iterable[Run], runs_dir: Path, common: Iterable[str] = ()) -> dict[Run, dict]:
    """The records under runs_dir (every earlier attempt) of the `runs` that finished (status ok)
    with exactly the overrides they would be given now."""
    wanted = {_normalized(run_overrides(r, common)): r for r in runs}
    found: dict[Run, dict] = {}
    for record in load_jobs(runs_dir) if runs_dir.is_dir() else []:
        if record.get("status") != "ok":
            continue
        run = wanted.get(_normalized(record.get("overrides", [])))
        if run is not None and run not in found:
            found[run] = record
    return found


def next_attempt(runs_dir: Path, name: str) -> int:
    taken = [int(p.name.rsplit("-a", 1)[1]) for p in runs_dir.glob(f"{name}-a*")
             if p.is_dir() and p.name.rsplit("-a", 1)[1].isdigit()]
    return max(taken, default=0) + 1


# ----------------------------------------------------------------------------- training
def run_sweep(sweep: Sweep, root: Path, sweep_dir: Path, common: tuple[str, ...],
              threads: int | None) -> dict[Run, dict]:
    """Run one sweep; its jobs' records by Run (a run without a metrics.json becomes a failure
    naming the sweep's log)."""
    log = sweep_dir.with_suffix(".log")
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        rc = subprocess.run(command(sweep, root, sweep_dir, common), cwd=root, env=env,
                            stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    found = {}
    for record in load_jobs(sweep_dir):
        for run in sweep.runs:
            if record.get("model") == run.model and record.get("seed") == run.seed:
                found[run] = record
    failure = {"status": "failed", "error": f"train.py exited {rc} without a metrics.json; see {log}"}
    return {run: found.get(run, failure) for run in sweep.runs}


def train(runs: Iterable[Run], root: Path, runs_dir: Path, common: tuple[str, ...] = (),
          jobs: int = 1, label: str = "runs", show: bool = True) -> tuple[dict[Run, dict], int]:
    """Every run's record (reused where an earlier attempt finished it, else trained now: `jobs`
    sweeps side by side, a progress bar over the runs) and how many were trained now."""
    runs = list(dict.fromkeys(runs))
    runs_dir.mkdir(parents=True, exist_ok=True)
    records = finished_runs(runs, runs_dir, common)
    sweeps = group_sweeps([r for r in runs if r not in records], jobs)
    print(f"[{label}] {len(runs)} run(s): {len(runs) - len(records)} to train in {len(sweeps)} "
          f"sweep(s), {len(records)} reused -> {runs_dir}", flush=True)
    if not sweeps:
        return records, 0
    attempts: dict[str, int] = {}
    dirs = []
    for sweep in sweeps:
        attempts[sweep.slug] = attempts.get(sweep.slug, next_attempt(runs_dir, sweep.slug) - 1) + 1
        dirs.append(runs_dir / f"{sweep.slug}-a{attempts[sweep.slug]}")
    threads = 1 if jobs > 1 else None  # side by side: one thread each; alone, torch's default
    done = threading.Event()
    columns = (TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"),
               TimeElapsedColumn())
    reused = len(records)
    with Progress(*columns, disable=not show) as progress:
        bar = progress.add_task("runs", total=len(runs), completed=reused)

        def watch() -> None:
            while not done.wait(POLL_S):
                ended = sum(1 for d in dirs if d.is_dir() for r in load_jobs(d)
                            if r.get("status") in ENDED)
                progress.update(bar, completed=reused + ended)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        start = time.time()
        try:
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                for found in pool.map(lambda sd: run_sweep(sd[0], root, sd[1], common, threads),
                                      zip(sweeps, dirs)):
                    records.update(found)
        finally:
            done.set()
            watcher.join()
        progress.update(bar, completed=len(records))
    print(f"[{label}] trained {len(runs) - reused} run(s) in {time.time() - start:.0f} s",
          flush=True)
    return records, len(runs) - reused


def dry_run(runs: Iterable[Run], root: Path, runs_dir: Path, common: tuple[str, ...] = (),
            jobs: int = 1) -> list[str]:
    """The train.py commands `train` would run (nothing is trained)."""
    runs = list(dict.fromkeys(runs))
    records = finished_runs(runs, runs_dir, common)
    return [" ".join(command(s, root, runs_dir / f"{s.slug}-a?", common))
            for s in group_sweeps([r for r in runs if r not in records], jobs)]
