"""What the three drivers (report, compare, reproduce) and the tasks' own claims share: a training
run (`Run`), what a finished run left behind (its metrics.json record: `load_jobs`), what a claim
concludes (`ClaimResult` and the verdict words), and where and on what a report was made.

A leaf: it imports nothing of attnlab, so a task's claim module (tasks/vqa/claim.py) imports it,
and `attnlab.study.stats`, and never the drivers, which load the task's claim by name from its
card: no import cycle, visible or hidden.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

# every job of a sweep writes this file into its run dir (attnlab.runner, attnlab.run_record)
METRICS_FILE = "metrics.json"


def scheme_params(record: dict) -> dict[str, dict[str, list[float]]]:
    """A run record's `scheme_params` ({"hnas_u": {layer: [per head]}, "sink_b": ...}); records
    written before it held HNAS's u alone, as `hnas_u`."""
    if "scheme_params" in record:
        return record["scheme_params"] or {}
    return {"hnas_u": record["hnas_u"]} if record.get("hnas_u") else {}


# ----------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Run:
    """One training run: `python train.py task=<task> model=<model> seed=<seed> <extra...>`."""

    task: str
    model: str
    seed: int
    extra: tuple[str, ...] = ()  # further overrides, e.g. ("probe=hub_key", "task.fusion=concat")


@dataclass(frozen=True)
class Arm:
    """One configuration: a scheme (`model=`) and its overrides, e.g. the positions (a
    claim's or a comparison's arm)."""

    model: str
    overrides: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """`ssmax, positions=none`: the scheme and the overrides' last key parts."""
        parts = [f"{o.split('=', 1)[0].split('.')[-1]}={o.split('=', 1)[1]}" for o in self.overrides]
        return ", ".join([self.model, *parts])


def load_jobs(sweep_dir: Path) -> list[dict]:
    """One record per job dir under `sweep_dir` (a dir with Hydra's .hydra/ or a metrics.json);
    a job whose process died is marked "killed"."""
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


# ----------------------------------------------------------------------------- claims
HOLDS = "holds"
CONTRADICTED = "contradicted"
NOT_TESTED = "not tested"
VERDICTS = (HOLDS, CONTRADICTED, NOT_TESTED)


@dataclass
class ClaimResult:
    """One paper statement, what we measured and the verdict: `holds` (the evidence says so at
    the stated power), `contradicted` (it says the opposite), `not tested` with `reason` (not run,
    underpowered: the interval, or the mechanism never engaged: the diagnostic that shows it)."""

    name: str
    title: str
    source: str  # the paper and its figure/table
    paper: str  # what the paper states
    ours: str  # what we measured
    setting: str
    seeds: str
    verdict: str
    reason: str = ""  # why `not tested`; also said with the other verdicts when they are qualified
    details: str = ""  # Markdown: tables, notes
    figures: list[str] = field(default_factory=list)  # PNG file names beside REPORT.md

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}: use one of {VERDICTS}")
        if self.verdict == NOT_TESTED and not self.reason:
            raise ValueError(f"claim {self.name}: a 'not tested' verdict needs its reason")


def not_tested(name: str, title: str, source: str, paper: str, reason: str, **more) -> ClaimResult:
    return ClaimResult(name, title, source, paper, ours=more.pop("ours", "—"),
                       setting=more.pop("setting", "—"), seeds=more.pop("seeds", "—"),
                       verdict=NOT_TESTED, reason=reason, **more)


# ----------------------------------------------------------------------------- where
def project_root() -> Path:
    """The folder of train.py: ATTNLAB_ROOT, else this source tree's root (src/attnlab/study)."""
    root = Path(os.environ.get("ATTNLAB_ROOT", Path(__file__).resolve().parents[3]))
    if not (root / "train.py").is_file():
        raise SystemExit(f"error: no train.py in {root}; run from a clone of attnlab or set "
                         f"ATTNLAB_ROOT")
    return root


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores"


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                             capture_output=True, text=True, check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


@dataclass
class Session:
    """Where, when and on what a driver's report was made: `Session.begin` when the command
    starts (the commit it trains, the load on the machine), `meta` when it writes its report."""

    command: str
    mode: str
    jobs: int
    commit: str
    started: str
    load_before: float
    start: float

    @classmethod
    def begin(cls, command: str, mode: str, root: Path, jobs: int) -> Session:
        return cls(command, mode, jobs, git_commit(root), datetime.now().strftime(
            "%Y-%m-%d_%H-%M-%S"), os.getloadavg()[0], time.time())

    def meta(self, trained: int, reused: int) -> dict:
        return {"command": self.command, "mode": self.mode, "commit": self.commit,
                "started": self.started, "machine": machine(),
                "load_before": f"{self.load_before:.1f}",
                "load_after": f"{os.getloadavg()[0]:.1f}", "jobs": self.jobs,
                "trained": trained, "reused": reused, "wall_s": time.time() - self.start}


def default_jobs() -> int:
    """Sweeps run side by side, one thread each: as many as the machine has cores, at most 2."""
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    return max(1, min(2, cores))
