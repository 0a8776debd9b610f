"""`make gpu-check`: what anyone with a GPU runs first; by default under 10 minutes on one H100.

The plan (`plan()` below, the one place that says what runs) is a list of steps, each a command
run from the repository root in its own process group under its own timeout:

1. the `gpu` tests in groups (the Triton kernels against float64, the compiled encoder, the
   FlexAttention paths, any other), each a fresh pytest without TRITON_INTERPRET; bf16 only
   (the fp16 / fp32 cases deselected: a full-precision Triton compile takes 16-75 s);
2. the CUDA benchmark, bf16, S = 1k and 4k, 3 repeats (`bench/attention.py --device cuda`);
3. per task card (conf/task/*.yaml), every scheme it takes (the registry), 5 steps at the
   card's tiny sizes on the test fixtures (offline), bf16: one `train.py -m` per task.

By default the Triton kernels run one pinned tile each (ATTNLAB_TRITON_AUTOTUNE=0: one compile
per kernel instead of 4-5). `--full` is the long version (an hour or more): autotuned tiles,
the fp16 / fp32 tests, the bench in bf16 and fp32 up to S = 16k, real data, 30 steps per run.

    python bench/gpu_check.py --dry-run    # the plan, each step's timeout, the total (no GPU needed)
    python bench/gpu_check.py              # -> outputs/gpu_check/<time>/report.md
    python bench/gpu_check.py --full
    python bench/gpu_check.py --skip-bench --tasks vqa mlm

report.md is rewritten after every step and names the step running, so a crash or a kill leaves
every result up to it; a step past its timeout is killed with its whole process group and
reported as "timeout after N s". Without CUDA it stops at once with one line saying so (exit 2);
exit 1 when any step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDS_CUDA = ("make gpu-check needs a CUDA GPU: torch.cuda.is_available() is False on this "
              "machine (run it where `nvidia-smi` lists a GPU and torch is a CUDA build; "
              "--dry-run shows the plan anywhere)")

# ---- the plan: (title, test files, pytest -k or None, timeout s by default, with --full). The
# bounds are estimates (the H200 run of docs/gpu.md, CPU runs): tune them here after a GPU run.
KERNELS = "tests/gpu/test_compiled_kernels.py"
FLEX = ["tests/attention/test_flex_paths.py", "tests/attention/test_flex_rowwise.py"]
TESTS = [
    ("Triton DNAS/HNAS kernels vs float64", [KERNELS], "not compiled_encoder", 130, 3600),
    ("torch.compile of an encoder, every scheme", [KERNELS], "compiled_encoder", 50, 900),
    ("FlexAttention paths vs float64", FLEX, None, 80, 1800),
    ("every other gpu test", ["tests", f"--ignore={KERNELS}", *(f"--ignore={f}" for f in FLEX)],
     None, 25, 600),
]
DEFAULT_DESELECT = "not fp16 and not fp32"  # the test ids name their dtype
BENCH = (["--dtypes", "bf16", "--seq", "1024", "4096", "--repeats", "3", "--methods", "sdpa_flash",
          "dnas_triton", "dnas_flex", "hnas_triton", "hnas_flex"], 55)  # --full: the _det rows too
BENCH_FULL = ([], 1800)  # the bench's defaults: bf16 + fp32, S = 1k ... 16k, 5 repeats
# the training matrix: its time shared evenly by the tasks it runs
TRAIN = (["trainer.max_steps=5", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2"],
         252)
TRAIN_FULL = (["trainer.max_steps=30", "trainer.limit_val_batches=10",
               "trainer.limit_test_batches=10"], 7 * 900)
RUN_OVERRIDES = ["hardware=gpu", "logger=csv"]  # bf16; metrics in CSV, no W&B
PINNED_TILES = {"ATTNLAB_TRITON_AUTOTUNE": "0"}  # default only: see the module docstring


@dataclass
class Step:
    name: str
    cmd: list[str]
    timeout: int  # seconds; past it the step's process group is killed
    env: dict[str, str] = field(default_factory=dict)  # set on top of this process's
    # (exit code, None on a timeout; log tail) -> (passed?, Markdown); default: exit 0 and the tail
    summarize: Callable[[int | None, str], tuple[bool, str]] | None = None


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default outputs/gpu_check/<time>)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (steps, timeouts, total) and stop; needs no GPU")
    parser.add_argument("--full", action="store_true",
                        help="the long version: fp16/fp32, autotuned, S up to 16k, real data, 30 steps")
    parser.add_argument("--tasks", nargs="*", default=None, help="task cards (default: all)")
    parser.add_argument("--tiny", action="store_true",
                        help="with --full: the cards' tiny sizes on tests/fixtures (the default's data)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    return parser.parse_args(argv)


def schemes_for(card) -> list[str]:
    """Every registered scheme the task takes (a causal task refuses query-normalized ones, the
    others causal-only ones)."""
    from attnlab.attention.schemes import fitting

    return fitting(causal=card.causal)


def plan(args: argparse.Namespace, out: Path) -> list[Step]:
    """The steps of this check, in order."""
    python, full = sys.executable, args.full
    env = {} if full else PINNED_TILES
    steps = []
    if not args.skip_tests:
        pytest = [python, "-m", "pytest", "-m", "gpu", "-n0", "-v", "-p", "no:cacheprovider"]
        for title, files, keyword, timeout, timeout_full in TESTS:
            keys = [k for k in (keyword, None if full else DEFAULT_DESELECT) if k]
            select = ["-k", " and ".join(f"({k})" for k in keys)] if keys else []
            steps.append(Step(f"tests: {title}" + ("" if full else " (bf16)"),
                              [*pytest, *files, *select], timeout_full if full else timeout,
                              env, passed_or_nothing_selected))
    if not args.skip_bench:
        extra, timeout = BENCH_FULL if full else BENCH
        steps.append(Step("CUDA bench" + ("" if full else " (bf16, S = 1k, 4k)"),
                          [python, "bench/attention.py", "--device", "cuda", *extra,
                           "--out-dir", str(out)], timeout, env))
    if not args.skip_train:
        steps += train_steps(args, out, env)
    return steps


def train_steps(args, out: Path, env: dict) -> list[Step]:
    from attnlab.cards import task_cards

    cards = task_cards(ROOT / "conf")
    unknown = sorted(set(args.tasks or []) - set(cards))
    if unknown:
        raise SystemExit(f"--tasks: unknown {', '.join(unknown)}; task cards: {', '.join(cards)}")
    names = [n for n in cards if not args.tasks or n in args.tasks]
    overrides, budget = TRAIN_FULL if args.full else TRAIN
    tiny = args.tiny or not args.full
    steps = []
    for name in names:
        models, sweep = schemes_for(cards[name]), out / "runs" / name
        data = cards[name].tiny_overrides(ROOT / "tests" / "fixtures") if tiny else []
        cmd = [sys.executable, "train.py", "-m", f"task={name}", f"model={','.join(models)}",
               *RUN_OVERRIDES, *overrides, *data, f"hydra.sweep.dir={sweep}"]
        steps.append(Step(f"train.py {name} x {len(models)} schemes", cmd,
                          budget // len(names), env, matrix_summary(name, models, sweep)))
    return steps


# ---- summaries of a finished (or killed) step: (passed?, Markdown)
def tail_summary(code: int | None, tail: str) -> tuple[bool, str]:
    return code == 0, f"```\n{tail}\n```"


def passed_or_nothing_selected(code: int | None, tail: str) -> tuple[bool, str]:
    """pytest's exit 5: no test selected (e.g. no other gpu test exists): nothing failed."""
    return code in (0, 5), f"```\n{tail}\n```"


def matrix_summary(task: str, models: list[str], sweep: Path):
    def summarize(code: int | None, tail: str) -> tuple[bool, str]:
        records = {}
        for file in sweep.rglob("metrics.json"):
            try:
                record = json.loads(file.read_text())
            except ValueError:  # killed while it was written
                continue
            records[record.get("model")] = record
        rows, ok = [], code == 0
        last = (tail.strip().splitlines() or [""])[-1][:160]
        for model in models:
            r = records.get(model)
            if r is None and code is not None:
                r = {"status": "missing", "error": f"exit {code}: {last}"}
            elif r is None:  # runs go in order: the first missing one was running at the kill
                running = all(m in records for m in models[:models.index(model)])
                r = {"status": "killed at the timeout" if running else "not reached"}
            ok &= r["status"] == "ok"
            error = (str(r.get("error") or "").strip().splitlines() or [""])[-1].strip()
            metric = f"{r['optimized_metric']} = {r.get('optimized_value')}" \
                if "optimized_metric" in r else ""
            rows.append(f"| {task} | {model} | {r['status']} | {r.get('wall_s', '')} | {metric} | "
                        f"{error[:160].replace('|', '/')} |")
        return ok, ("| task | model | status | wall s | optimized metric | error |\n"
                    "|---|---|---|---|---|---|\n" + "\n".join(rows))
    return summarize


# ---- running the plan
def shown(step: Step) -> str:
    """The step's command as one would type it from the repository root."""
    python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) \
        else "python"
    env = [f"{k}={v}" for k, v in step.env.items()]
    return shlex.join([*env, python if step.cmd[0] == sys.executable else step.cmd[0],
                       *step.cmd[1:]])


def describe(steps: list[Step], full: bool) -> str:
    total = sum(s.timeout for s in steps)
    lines = [(f"make gpu-check{' --full' if full else ''}: {len(steps)} steps, each under its "
              f"own timeout; at most {total} s ({total / 60:.1f} min) in all"),
             "  " + ("autotuned Triton tiles, bf16 + fp16/fp32 tests, the bench up to S = 16k, "
                     "real data, 30 steps per run" if full else
                     "bf16, pinned Triton tiles (ATTNLAB_TRITON_AUTOTUNE=0), the bench at S = 1k "
                     "and 4k, tiny data (offline), 5 steps per run; --full: the long version")]
    for i, step in enumerate(steps, 1):
        lines += [f"{i:3d}. [{step.timeout:5d} s] {step.name}", f"       {shown(step)}"]
    return "\n".join(lines)


def run_step(step: Step, log: Path) -> int | None:
    """Run the step's command into `log` in a new session (process group); its exit code, or
    None when it ran past its timeout and the group was killed (its workers and compilers too)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | step.env
    env["PYTHONUNBUFFERED"] = "1"  # a killed step's log holds all it printed
    with log.open("w") as f:
        proc = subprocess.Popen(step.cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=step.timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:  # a timeout, or this process interrupted: nothing of the step survives it
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def status(code: int | None, passed: bool, step: Step, seconds: float) -> str:
    if code is None:
        return f"timeout after {step.timeout} s"
    if code < 0:
        return f"FAILED (killed by {signal.Signals(-code).name}, {seconds:.0f} s)"
    if passed:
        return f"passed ({seconds:.0f} s)"
    return f"FAILED ({f'exit {code}, ' if code else ''}{seconds:.0f} s)"  # exit 0: failed runs


def run_steps(steps: list[Step], out: Path, header: str) -> list[str]:
    """Run the steps in order, rewriting out/report.md before and after each; the failed ones."""
    from rich.console import Console

    from attnlab.files import atomic_write_text

    console, report, sections, failed = Console(), out / "report.md", [header], []

    def write(*running: str) -> None:
        atomic_write_text(report, "\n".join([*sections, *running]) + "\n")

    for i, step in enumerate(steps, 1):
        log = out / f"{i:02d}-{re.sub('[^a-z0-9]+', '-', step.name.lower()).strip('-')[:48]}.log"
        about = f"`{shown(step)}`\n\ntimeout {step.timeout} s; log: {log.name}"
        write(f"## {i}. {step.name}: RUNNING since {time.strftime('%H:%M:%S')} (timeout "
              f"{step.timeout} s): a check that ends here stopped in this step\n\n{about}\n")
        console.print(f"[{i}/{len(steps)}] {step.name} (at most {step.timeout} s) ...")
        start = time.monotonic()
        code = run_step(step, log)
        seconds = time.monotonic() - start
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        passed, body = (step.summarize or tail_summary)(code, tail)
        passed &= code is not None
        result = status(code, passed, step, seconds)
        failed += [] if passed else [step.name]
        sections.append(f"## {i}. {step.name}: {result}\n\n{about}\n\n{body}\n")
        write()
        console.print(f"      {result}")
    sections.append(f"## Result: {'FAILED: ' + '; '.join(failed) if failed else 'all passed'}\n")
    write()
    return failed


def machine() -> str:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    return (f"# GPU check, {time.strftime('%Y-%m-%d %H:%M')}\n\n"
            f"{torch.cuda.get_device_name(0)} ({props.total_memory / 2**30:.0f} GiB, "
            f"sm_{props.major}{props.minor}), torch {torch.__version__}, triton "
            f"{triton.__version__}, CUDA {torch.version.cuda}\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = (args.out or ROOT / "outputs" / "gpu_check" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print(NEEDS_CUDA, file=sys.stderr)
            return 2
    steps = plan(args, out)
    if args.dry_run:
        print(describe(steps, args.full))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    header = f"{machine()}\n```\n{describe(steps, args.full)}\n```\n"
    failed = run_steps(steps, out, header)
    print(f"{'FAILED: ' + '; '.join(failed) if failed else 'all passed'}; "
          f"report: {out / 'report.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
