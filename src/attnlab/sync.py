"""Upload every offline W&B run under a directory in one command.

    python -m attnlab.sync outputs/multirun/<dir>            # a sweep (or outputs/<task>/<model>/<run>)
    python -m attnlab.sync outputs/multirun/<dir> --dry-run  # what it would upload, nothing sent
    python -m attnlab.sync <dir> --entity me --project attnlab

Finds every offline run (`wandb/offline-run-<time>-<id>/run-<id>.wandb`) under the directory. A
job that was killed and resumed left one such fragment per process, all with the job's id (see
attnlab.wandb_runs); they go to one `wandb sync` call, which uploads them into that one run in
order of start time, each continuing the steps of the previous. Fragments uploaded before (W&B's
`.wandb.synced` marker) are skipped. Ends with a table of runs and their W&B URLs.

Needs a W&B server (`wandb login`; WANDB_BASE_URL for a self-hosted one). To look at offline
runs without one: `wandb leet <run dir>/wandb` (terminal UI), or
`wandb leet inspect --summary --json <run dir>/wandb/offline-run-*` (config and last values).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

URL_FILE = "attnlab-sync-url.txt"  # written into a fragment's dir once it is uploaded
_VIEW_RUN = re.compile(r"View run .* at (\S+/runs/([a-z0-9]+))")


@dataclass
class Run:
    """One W&B run: every offline fragment of one job, oldest first."""

    run_id: str
    job_dir: Path  # the attnlab run dir the fragments belong to
    fragments: list[Path] = field(default_factory=list)

    def pending(self) -> list[Path]:
        return [f for f in self.fragments if not (f / f"run-{self.run_id}.wandb.synced").exists()]

    def url(self) -> str:
        for f in reversed(self.fragments):
            if (f / URL_FILE).is_file():
                return (f / URL_FILE).read_text().strip()
        return ""


def find_runs(root: Path) -> list[Run]:
    """Every offline run under `root`, its fragments grouped by run id (sorted by job dir)."""
    runs: dict[str, Run] = {}
    for log in sorted(root.rglob("offline-run-*/run-*.wandb")):
        fragment = log.parent
        run_id = log.stem[len("run-"):]
        run = runs.setdefault(run_id, Run(run_id, fragment.parent.parent))
        run.fragments.append(fragment)
    for run in runs.values():  # offline-run-<YYYYmmdd_HHMMSS>-<id>: the name sorts by start time
        run.fragments.sort(key=lambda f: f.name)
    return sorted(runs.values(), key=lambda r: (str(r.job_dir), r.run_id))


def wandb_sync(fragments: list[Path], entity: str | None, project: str | None) -> tuple[int, str]:
    """One `wandb sync` over all fragments (W&B orders the fragments of each run itself)."""
    cmd = [sys.executable, "-m", "wandb", "sync", *(str(f) for f in fragments)]
    cmd += ["--entity", entity] if entity else []
    cmd += ["--project", project] if project else []
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def print_table(runs: list[Run], root: Path, status: dict[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    for column in ("job", "W&B run id", "fragments", "status", "URL"):
        table.add_column(column)
    for run in runs:
        job = str(run.job_dir.relative_to(root)) if run.job_dir.is_relative_to(root) else str(run.job_dir)
        table.add_row(job or ".", run.run_id, str(len(run.fragments)), status[run.run_id], run.url())
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.sync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="a sweep dir, a run dir, or any dir holding wandb/offline-run-*")
    parser.add_argument("--dry-run", action="store_true", help="list what would be uploaded; send nothing")
    parser.add_argument("--entity", help="W&B entity (default: your default entity)")
    parser.add_argument("--project", help="W&B project (default: the runs' own, attnlab)")
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    if not root.is_dir():
        print(f"error: {args.dir} is not a directory; pass outputs/multirun/<dir> or a run dir", file=sys.stderr)
        return 2
    runs = find_runs(root)
    if not runs:
        print(f"error: no offline W&B run (wandb/offline-run-*) under {args.dir}; were the runs made with "
              f"logger=wandb (the default)?", file=sys.stderr)
        return 2
    pending = [f for run in runs for f in run.pending()]
    status = {run.run_id: (f"to upload ({len(run.pending())} new)" if run.pending() else "synced before")
              for run in runs}
    if args.dry_run or not pending:
        print_table(runs, root, status)
        print(f"{len(runs)} run(s), {len(pending)} fragment(s) to upload" + (" (dry run)" if args.dry_run else ""))
        return 0
    code, output = wandb_sync(pending, args.entity, args.project)
    urls = {m.group(2): m.group(1) for m in _VIEW_RUN.finditer(output)}
    for run in runs:
        if run.run_id in urls and not run.pending():  # uploaded now: remember where it went
            (run.fragments[-1] / URL_FILE).write_text(urls[run.run_id] + "\n")
            status[run.run_id] = "uploaded"
        elif run.pending():
            status[run.run_id] = "FAILED"
    print_table(runs, root, status)
    if code != 0 or any(s == "FAILED" for s in status.values()):
        print(output[-3000:], file=sys.stderr)
        print(f"error: wandb sync failed (exit {code}); log in with `wandb login` (WANDB_BASE_URL for a "
              f"self-hosted server), then run this again: uploaded runs are skipped", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
