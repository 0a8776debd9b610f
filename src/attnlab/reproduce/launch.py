"""Train the runs: one `train.py -m` subprocess per sweep (train.py's own machinery: Hydra
multirun, the runner, metrics.json per job), `jobs` of them side by side, one thread each. A sweep
that an earlier invocation with the same --out finished with the same command is not run again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attnlab.report import load_jobs
from attnlab.reproduce.plan import Plan, Run, Sweep
from attnlab.reproduce.results import Results

COMMAND_FILE = "reproduce_command.json"  # what a sweep dir was trained with


def project_root() -> Path:
    """The folder of train.py: ATTNLAB_ROOT, else this source tree's root (src/attnlab/reproduce)."""
    root = Path(os.environ.get("ATTNLAB_ROOT", Path(__file__).resolve().parents[3]))
    if not (root / "train.py").is_file():
        raise SystemExit(f"error: no train.py in {root}; run from a clone of attnlab or set ATTNLAB_ROOT")
    return root


def command(sweep: Sweep, plan: Plan, sweep_dir: Path) -> list[str]:
    return [sys.executable, str(plan.root / "train.py"), "-m", *sweep.overrides(plan), f"hydra.sweep.dir={sweep_dir}"]


def collect(sweep: Sweep, sweep_dir: Path) -> dict[Run, dict]:
    """The metrics.json records of a sweep's jobs, by Run."""
    found = {}
    for record in load_jobs(sweep_dir) if sweep_dir.is_dir() else []:
        for run in sweep.runs:
            if record.get("model") == run.model and record.get("seed") == run.seed:
                found[run] = record
    return found


def finished(sweep: Sweep, cmd: list[str], sweep_dir: Path) -> dict[Run, dict] | None:
    """The records of an earlier identical sweep in which every run finished (so that a
    reproduction started again with the same --out resumes), else None."""
    stamp = sweep_dir / COMMAND_FILE
    if not stamp.is_file() or json.loads(stamp.read_text()) != cmd[1:]:
        return None
    found = collect(sweep, sweep_dir)
    return found if all(found.get(r, {}).get("status") == "ok" for r in sweep.runs) else None


def run_sweep(sweep: Sweep, plan: Plan, runs_dir: Path, threads: int | None) -> dict[Run, dict]:
    """Run one sweep; its jobs' metrics.json records by Run (a missing one becomes a failure)."""
    sweep_dir = runs_dir / sweep.slug
    log = runs_dir / f"{sweep.slug}.log"
    cmd = command(sweep, plan, sweep_dir)
    done = finished(sweep, cmd, sweep_dir)
    if done is not None:
        print(f"[reproduce] {sweep.slug}: reusing its {len(done)} finished run(s)", flush=True)
        return done
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.time()
    print(f"[reproduce] {sweep.slug}: {len(sweep.runs)} run(s) ... log: {log}", flush=True)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / COMMAND_FILE).write_text(json.dumps(cmd[1:]))  # the interpreter may differ
    with log.open("w") as out:
        rc = subprocess.run(cmd, cwd=plan.root, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    print(f"[reproduce] {sweep.slug}: done in {time.time() - start:.0f} s (exit {rc})", flush=True)
    found = collect(sweep, sweep_dir)
    failure = {"status": "failed", "error": f"train.py exited {rc} without a metrics.json; see {log}"}
    return {run: found.get(run, failure) for run in sweep.runs}


def run_sweeps(sweeps: list[Sweep], plan: Plan, out_dir: Path, jobs: int = 1) -> Results:
    runs_dir = out_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    results = Results(plan.cards)  # judges every run against its task's trivial baseline
    # side by side, each sweep gets one thread (OMP_NUM_THREADS=1); alone, torch's default
    threads = 1 if jobs > 1 else None
    # the longest first, so that the last to finish is short
    ordered = sorted(sweeps, key=lambda s: -len(s.runs))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for records in pool.map(lambda s: run_sweep(s, plan, runs_dir, threads), ordered):
            for run, record in records.items():
                results.add(run, record)
    return results
