"""Running the real CLI (train.py / eval.py): as a subprocess, or in this process."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import ROOT

# fast, quiet defaults for every CLI test run
QUIET = ["logger=csv", "callbacks.progress_bar=null", "trainer.enable_model_summary=false"]


def cli_env(tmp_path: Path, data_dir: Path) -> dict:
    env = dict(os.environ)
    env.update(
        ATTNLAB_OUTPUTS=str(tmp_path / "outputs"),
        ATTNLAB_DATA=str(data_dir),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
        # this checkout's code, whatever clone the venv was installed (-e) from (pyproject's pytest
        # `pythonpath` does the same for the tests' own process)
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH"))
                                   if p),
    )
    env.pop("WANDB_API_KEY", None)
    return env


def run_cli(args: list[str], tmp_path: Path, data_dir: Path, script: str = "train.py",
            timeout: float = 600, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=tmp_path,
        env={**cli_env(tmp_path, data_dir), **(env or {})},
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{script} {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def metrics_files(outputs: Path) -> list[dict]:
    return [json.loads(p.read_text()) | {"_dir": p.parent} for p in sorted(outputs.rglob("metrics.json"))]


# ----------------------------------------------------------------------------- in-process CLI
@dataclass
class AppResult:
    code: int
    stdout: str
    stderr: str


def _load_script(script: str):
    """train.py / eval.py as a module (its `main` is the @hydra.main function), loaded once."""
    name = f"attnlab_cli_{Path(script).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        # Hydra finds conf/ next to the file of a task function that lives in __main__
        module.main.__wrapped__.__module__ = "__main__"
    return sys.modules[name]


def run_app(args: list[str], env: dict[str, str], script: str = "train.py") -> AppResult:
    """The CLI entry (attnlab.cli.run around the script's Hydra app) in this process: what the
    shell would see (exit code, stdout, stderr) without paying ~10 s of imports per call."""
    from attnlab import cli

    app = _load_script(script)
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_env = sys.argv, dict(os.environ)
    sys.argv = [str(ROOT / script), *args]
    os.environ.update(env)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.run(app.main, ROOT / "conf")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:  # noqa: BLE001 - what Python does with an uncaught exception
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return AppResult(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def process_state_kept():
    """What a run sets for its whole process, put back after it (a subprocess would have taken
    it away): torch's determinism (Lightning's `deterministic`), threads, default dtype and
    matmul precision, and the signal handlers a run installs."""
    import signal

    import torch

    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_num_threads(),
             torch.get_default_dtype(), torch.get_float32_matmul_precision())
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.set_num_threads(saved[2])
        torch.set_default_dtype(saved[3])
        torch.set_float32_matmul_precision(saved[4])
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def composed_once():
    """A sweep composes each job's config once: Hydra's sweeper composes the whole batch first to
    fail early in case the launcher runs elsewhere, "repeating work the launcher will do"; the
    basic launcher composes each job again in this process, and fails the same way."""
    from unittest import mock

    from hydra.plugins.sweeper import Sweeper

    with mock.patch.object(Sweeper, "validate_batch_is_legal", lambda self, batch: None):
        yield


def run_here(args: list[str], tmp_path: Path, data_dir: Path, script: str = "train.py",
             check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """run_cli in this process: run_app with run_cli's environment, working directory (tmp_path)
    and PYTHONPATH (its folders on sys.path for the call, as callbacks that tests/helpers defines
    need), giving what run_cli gives (exit code, stdout, stderr) without ~10 s of imports per call.

    For tests about what a run does and writes. What only a process shows (an exit status, a
    signal, what the console prints) keeps run_cli: test_cli.py, test_console.py, test_faults.py
    and test_cli_errors.py each keep real processes for it."""
    full_env = {**cli_env(tmp_path, data_dir), **(env or {})}
    added = [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    saved_cwd, saved_path = os.getcwd(), list(sys.path)
    os.chdir(tmp_path)
    sys.path[:0] = added
    try:
        with process_state_kept(), composed_once():
            result = run_app(args, full_env, script)
    finally:
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
    if check and result.code != 0:
        raise AssertionError(
            f"{script} {' '.join(args)} exited {result.code} (in-process)\n--- stdout\n"
            f"{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-6000:]}")
    return subprocess.CompletedProcess([script, *args], result.code, result.stdout, result.stderr)


def run_cli_batch(runs: list[tuple[list[str], Path]], data_dir: Path, script: str = "train.py",
                  timeout: float = 1200, check: bool = True) -> list[subprocess.CompletedProcess]:
    """Several runs of `script`, each (args, tmp_path) as run_cli would run it, one after another
    in ONE new process (run_here there): what they leave in the process (W&B's service and
    state, signal handlers) stays out of the test's, and the imports are paid once, not per run."""
    tmp_dir = Path(runs[0][1])
    spec = tmp_dir / "cli_batch.json"
    spec.write_text(json.dumps({"script": script, "data_dir": str(data_dir),
                                "runs": [{"args": a, "tmp": str(t)} for a, t in runs]}))
    env = cli_env(tmp_dir, data_dir)  # helpers importable after this checkout's own packages
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT / "tests")])
    proc = subprocess.run([sys.executable, "-m", "helpers.cli", str(spec)], cwd=tmp_dir, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"the batch process exited {proc.returncode}\n--- stdout\n"
                             f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    results = [subprocess.CompletedProcess([script, *r["args"]], r["code"], r["stdout"], r["stderr"])
               for r in json.loads(spec.with_suffix(".out.json").read_text())]
    for r in results if check else []:
        if r.returncode != 0:
            raise AssertionError(f"{script} {' '.join(r.args[1:])} exited {r.returncode} (batch)\n"
                                 f"--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-6000:]}")
    return results


def _run_batch(spec_path: str) -> None:
    """The batch process of run_cli_batch."""
    spec = json.loads(Path(spec_path).read_text())
    results = []
    for run in spec["runs"]:
        proc = run_here(run["args"], Path(run["tmp"]), Path(spec["data_dir"]), spec["script"], check=False)
        results.append({"args": run["args"], "code": proc.returncode, "stdout": proc.stdout,
                        "stderr": proc.stderr})
    Path(spec_path).with_suffix(".out.json").write_text(json.dumps(results))


if __name__ == "__main__":
    _run_batch(sys.argv[1])
