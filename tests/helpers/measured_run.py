"""The test figures the README and docs/results.md print, measured, never typed.

A whole default run (`make test`: no test paths, `-k` or `-m` given) that passes writes what it
measured to `outputs/test_run.json` (tests, seconds, the machine); `make docs` copies that file to
`docs/test_run.json` and writes the sentences from it (attnlab.docs). The run also compares its
count with `docs/test_run.json` and fails when they differ: a test added or removed since the last
measurement makes the figures untrue until `make test` and `make docs` run again.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import pytest

from attnlab.docs import MEASURED_RUN as MEASURED
from attnlab.docs import TEST_RUN_RECORD

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MARKERS = "not slow and not gpu"  # pyproject's addopts
_started: dict[str, float] = {}


def whole_default_run(config: pytest.Config) -> bool:
    """`make test` as CI runs it: every test of `testpaths` under the default markers."""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and config.option.markexpr == DEFAULT_MARKERS and not config.option.keyword
            and not config.option.deselect and not getattr(config.option, "lf", False))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def session_started() -> None:
    _started["time"] = time.time()
    _started["load"] = os.getloadavg()[0]


def session_finished(session: pytest.Session) -> None:
    """On the controller of a whole default run: record it, and fail it when its count is not
    the count the docs print."""
    config = session.config
    if hasattr(config, "workerinput") or not whole_default_run(config) or "time" not in _started:
        return
    stats = config.pluginmanager.get_plugin("terminalreporter").stats
    counts = {k: len([r for r in stats.get(k, []) if getattr(r, "when", "call") != "teardown"])
              for k in ("passed", "skipped", "failed", "error", "xfailed", "xpassed")}
    tests = sum(counts.values())
    if session.exitstatus == 0:
        record = {"tests": tests, "passed": counts["passed"], "skipped": counts["skipped"],
                  "seconds": round(time.time() - _started["time"], 1),
                  "cores": os.cpu_count(), "cpu": cpu_model(),
                  "load_at_start": round(_started["load"], 2), "python": platform.python_version(),
                  "date": time.strftime("%Y-%m-%d")}
        MEASURED.parent.mkdir(parents=True, exist_ok=True)
        MEASURED.write_text(json.dumps(record, indent=2) + "\n")
    try:
        printed = json.loads(TEST_RUN_RECORD.read_text())["tests"]
    except (OSError, ValueError, KeyError):
        printed = None
    if printed != tests:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        reporter.write("\n")
        reporter.write_line(
            f"FAILED the test figures: this run has {tests} tests, {TEST_RUN_RECORD.name} (what the "
            f"README prints) says {printed}; after a passing `make test`, `make docs` copies this "
            f"run's figures ({MEASURED.relative_to(ROOT)}) into the docs", red=True, bold=True)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
