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
