"""`make gpu-check`: what anyone with a GPU runs first. One report (Markdown) of

1. every `gpu` test (`make test-gpu`; tests/gpu: the compiled Triton kernels against the
   float64 reference, the compiled encoder), in a fresh process without TRITON_INTERPRET;
2. the CUDA attention benchmark, `bench/attention.py --device cuda`;
3. a short training run of every task card (conf/task/*.yaml) with every scheme it takes, in
   bf16: `python train.py -m hardware=gpu task=<t> model=<all it takes> trainer.max_steps=30
   logger=csv` (one multirun per task; schemes a causal task refuses are left out).

    python bench/gpu_check.py                     # all three -> outputs/gpu_check/<time>/report.md
    python bench/gpu_check.py --skip-bench --tasks vqa mlm
    python bench/gpu_check.py --tiny              # the tasks' tiny data (tests/fixtures): offline

On a machine without CUDA it stops at once with one line saying so (exit 2). Exit 1 when any
part failed; the report says which.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDS_CUDA = ("make gpu-check needs a CUDA GPU: torch.cuda.is_available() is False on this "
              "machine (run it where `nvidia-smi` lists a GPU and torch is a CUDA build)")
# short runs, bf16 (hardware=gpu), metrics in CSV: a check that every cell runs, not results
RUN_OVERRIDES = ["hardware=gpu", "trainer.max_steps=30", "trainer.limit_val_batches=10",
                 "trainer.limit_test_batches=10", "logger=csv"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default outputs/gpu_check/<time>)")
    parser.add_argument("--tasks", nargs="*", default=None, help="task cards (default: all)")
    parser.add_argument("--tiny", action="store_true",
                        help="the cards' tiny overrides (tests/fixtures data: no download)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    return parser.parse_args(argv)


def run(cmd: list[str], log: Path, env: dict | None = None) -> tuple[int, str]:
    """Run cmd from the repository root, its output into `log`; (exit code, output tail)."""
    with log.open("w") as f:
        code = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                              check=False).returncode
    lines = log.read_text(errors="replace").splitlines()
    return code, "\n".join(lines[-40:])


def gpu_tests(out: Path) -> tuple[bool, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code, tail = run([sys.executable, "-m", "pytest", "-m", "gpu", "-n0", "-q", "-p",
                      "no:cacheprovider"], out / "gpu_tests.log", env)
    return code == 0, f"```\n{tail}\n```"


def bench(out: Path) -> tuple[bool, str]:
    code, _ = run([sys.executable, "bench/attention.py", "--device", "cuda"], out / "bench.log")
    text = (out / "bench.log").read_text(errors="replace")
    return code == 0, f"```\n{text.strip()[-20000:]}\n```"


def schemes_for(card) -> list[str]:
    """Every registered scheme the task takes (a causal task refuses query-normalized ones, the
    others causal-only ones)."""
    from attnlab.attention.schemes import fitting

    return fitting(causal=card.causal)


def train_matrix(out: Path, tasks: list[str] | None, tiny: bool, progress) -> tuple[bool, str]:
    from attnlab.cards import task_cards

    cards = task_cards(ROOT / "conf")
    unknown = sorted(set(tasks or []) - set(cards))
    if unknown:
        raise SystemExit(f"--tasks: unknown {', '.join(unknown)}; task cards: {', '.join(cards)}")
    rows, ok = [], True
    job = progress.add_task("train.py matrix", total=len(tasks or cards))
    for name, card in cards.items():
        if tasks and name not in tasks:
            continue
        models = schemes_for(card)
        sweep = out / "runs" / name
        extra = card.tiny_overrides(ROOT / "tests" / "fixtures") if tiny else []
        code, tail = run([sys.executable, "train.py", "-m", f"task={name}",
                          f"model={','.join(models)}", *RUN_OVERRIDES, *extra,
                          f"hydra.sweep.dir={sweep}"], out / f"train_{name}.log")
        records = {r["model"]: r for r in map(json.loads, map(Path.read_text,
                                                             sweep.rglob("metrics.json")))}
        for model in models:
            r = records.get(model, {"status": "missing", "error": f"exit {code}: {tail[-300:]}"})
            ok &= r["status"] == "ok"
            value = r.get("optimized_value")
            error = str(r.get("error", "")).strip().splitlines()[-1:] or [""]
            rows.append(f"| {name} | {model} | {r['status']} | {r.get('wall_s', '')} | "
                        f"{r.get('optimized_metric', '')} = {value} | {error[0][:160]} |")
        progress.advance(job)
    header = ("| task | model | status | wall s | optimized metric | error |\n"
              "|---|---|---|---|---|---|\n")
    return ok, header + "\n".join(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NEEDS_CUDA, file=sys.stderr)
        return 2
    import triton
    from rich.progress import Progress

    from attnlab.files import atomic_write_text

    out = args.out or ROOT / "outputs" / "gpu_check" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    sections = [f"# GPU check, {time.strftime('%Y-%m-%d %H:%M')}\n",
                (f"{torch.cuda.get_device_name(0)} ({props.total_memory / 2**30:.0f} GiB, "
                 f"sm_{props.major}{props.minor}), torch {torch.__version__}, triton "
                 f"{triton.__version__}, CUDA {torch.version.cuda}\n")]
    parts = [("gpu tests (pytest -m gpu)", args.skip_tests, gpu_tests),
             ("bench/attention.py --device cuda", args.skip_bench, bench)]
    failed = []
    with Progress() as progress:
        for title, skip, fn in parts:
            if skip:
                continue
            job = progress.add_task(title, total=None)
            ok, text = fn(out)
            progress.update(job, total=1, completed=1)
            failed += [] if ok else [title]
            sections.append(f"## {title}: {'passed' if ok else 'FAILED'}\n\n{text}\n")
        if not args.skip_train:
            ok, text = train_matrix(out, args.tasks, args.tiny, progress)
            failed += [] if ok else ["train.py matrix"]
            sections.append(f"## train.py matrix ({' '.join(RUN_OVERRIDES)}): "
                            f"{'passed' if ok else 'FAILED'}\n\n{text}\n")
    report = out / "report.md"
    atomic_write_text(report, "\n".join(sections))
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all passed'}; report: {report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
