"""Paper-style table of a sweep: one row per configuration, mean ± standard error over seeds.

    python -m attnlab.report outputs/multirun/<timestamp> [--metrics test/acc test/acc_count] [--csv out.csv]

Reads every job's metrics.json (written by train.py), groups jobs by their command-line overrides
without `seed=`, prints a Markdown table and writes `report.csv` next to the jobs. Jobs that did
not finish are listed under the table with their status: failed (the error), interrupted
(SIGTERM; resume it), killed (the process died: metrics.json still says running, or there is none).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import socket
import sys
from collections import defaultdict
from pathlib import Path

# every job of a sweep writes this file into its run dir (attnlab.runner)
METRICS_FILE = "metrics.json"


def load_jobs(sweep_dir: Path) -> list[dict]:
    """One record per job dir (a dir with Hydra's .hydra/ or a metrics.json)."""
    job_dirs = {p.parent for p in sweep_dir.rglob(METRICS_FILE)}
    job_dirs |= {p.parent for p in sweep_dir.rglob(".hydra") if p.parent != sweep_dir}
    jobs = []
    for job_dir in sorted(job_dirs):
        path = job_dir / METRICS_FILE
        if not path.is_file():
            record = {"status": "killed", "overrides": _hydra_overrides(job_dir),
                      "error": "no metrics.json: the process died before training started"}
        else:
            try:
                record = json.loads(path.read_text())
            except json.JSONDecodeError:
                record = {"status": "failed", "error": f"unreadable {path}", "overrides": []}
        if record.get("status") == "running" and not _still_running(record):
            record["status"] = "killed"
            record["error"] = "the process died during training (kill -9, out of memory, lost node)"
        record["_path"] = str(job_dir)
        jobs.append(record)
    return jobs


def _hydra_overrides(job_dir: Path) -> list[str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    # a YAML list of strings, one "- key=value" per line
    return [line[2:].strip() for line in path.read_text().splitlines() if line.startswith("- ")]


def _still_running(record: dict) -> bool:
    """A job marked running: is its process alive? (Unknown on another host: assume yes.)"""
    if record.get("host") != socket.gethostname() or not record.get("pid"):
        return True
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def config_key(record: dict) -> str:
    overrides = [o for o in record.get("overrides", []) if not o.split("=")[0].lstrip("+~").endswith("seed")]
    if not overrides:
        overrides = [f"task={record.get('task')}", f"model={record.get('model')}"]
    return " ".join(sorted(overrides))


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def build_table(jobs: list[dict], metrics: list[str] | None = None) -> tuple[list[str], list[list]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for job in jobs:
        groups[config_key(job)].append(job)
    if not metrics:
        names = {k for j in jobs if j.get("status") == "ok" for k in j.get("metrics", {})}
        metrics = sorted(k for k in names if k.startswith("test/"))
    header = ["configuration", "seeds", "not finished"] + metrics
    rows = []
    for key, group in groups.items():
        ok = [j for j in group if j.get("status") == "ok"]
        row: list = [key, len(ok), len(group) - len(ok)]
        for m in metrics:
            vals = [float(j["metrics"][m]) for j in ok if m in j.get("metrics", {})]
            row.append(mean_se(vals) if vals else None)
        rows.append(row)
    rows.sort(key=lambda r: r[0])
    return header, rows


def format_cell(cell) -> str:
    if cell is None:
        return "—"
    if isinstance(cell, tuple):
        mean, se = cell
        return f"{mean:.4f}" if math.isnan(se) else f"{mean:.4f} ± {se:.4f}"
    return str(cell)


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        out_header = header[:3]
        for m in header[3:]:
            out_header += [f"{m} mean", f"{m} se"]
        writer.writerow(out_header)
        for row in rows:
            out = row[:3]
            for cell in row[3:]:
                out += list(cell) if cell is not None else ["", ""]
            writer.writerow(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun dir, e.g. outputs/multirun/<timestamp>")
    parser.add_argument("--metrics", nargs="*", help="metrics to show (default: every test/* metric)")
    parser.add_argument("--csv", type=Path, help="CSV path (default: <sweep_dir>/report.csv)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: {args.sweep_dir} is not a directory; pass outputs/multirun/<timestamp>", file=sys.stderr)
        return 2
    jobs = load_jobs(args.sweep_dir)
    if not jobs:
        print(f"error: no {METRICS_FILE} under {args.sweep_dir}: did the sweep run train.py?", file=sys.stderr)
        return 2
    header, rows = build_table(jobs, args.metrics)
    print(markdown(header, rows))
    for job in jobs:
        if job.get("status") != "ok":
            print(f"\n{job.get('status', 'failed')}: {job['_path']}: {job.get('error', '?')}")
    csv_path = args.csv or args.sweep_dir / "report.csv"
    write_csv(csv_path, header, rows)
    print(f"\nCSV: {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
