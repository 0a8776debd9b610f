"""Train the missing runs with attnlab.reproduce's launcher (one `train.py -m` subprocess per
sweep, `jobs` side by side, one thread each), under a rich progress bar over the runs.

The bar counts the jobs whose metrics.json says they ended (ok, failed or interrupted): the
runner writes it when a job starts ("running") and again when it ends.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from attnlab.compare.plan import ComparePlan, CompareSweep, Run
from attnlab.report import load_jobs
from attnlab.reproduce.launch import run_sweep

ENDED = ("ok", "failed", "interrupted")
POLL_S = 2.0


def ended_jobs(sweep_dirs: list[Path]) -> int:
    return sum(1 for d in sweep_dirs if d.is_dir()
               for record in load_jobs(d) if record.get("status") in ENDED)


def run_missing(sweeps: list[CompareSweep], plan: ComparePlan, runs_dir: Path, reused: int,
                jobs: int = 2, show: bool = True) -> dict[Run, dict]:
    """Run the sweeps, `jobs` at a time; the records of their runs (a run without a metrics.json
    becomes a failure naming the sweep's log)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    total = reused + sum(len(s.runs) for s in sweeps)
    threads = 1 if jobs > 1 else None  # side by side: one thread each; alone, torch's default
    results: dict[Run, dict] = {}
    done = threading.Event()
    columns = (TextColumn("[bold]compare"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"),
               TimeElapsedColumn())
    with Progress(*columns, disable=not show) as progress:
        bar = progress.add_task("runs", total=total, completed=reused)

        def watch() -> None:
            dirs = [runs_dir / s.slug for s in sweeps]
            while not done.wait(POLL_S):
                progress.update(bar, completed=reused + ended_jobs(dirs))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                for records in pool.map(lambda s: run_sweep(s, plan, runs_dir, threads), sweeps):
                    results.update(records)
        finally:
            done.set()
            watcher.join()
        progress.update(bar, completed=reused + len(results))
    return results
