"""Run each claim of the papers as a small experiment and write reproduce/<time>/REPORT.md."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path

from attnlab.errors import ConfigError
from attnlab.reproduce.launch import command, project_root, run_sweeps
from attnlab.reproduce.plan import Plan, default_jobs, group_sweeps
from attnlab.reproduce.registry import claims as all_claims
from attnlab.reproduce.results import NOT_RUN, ClaimResult, Results
from attnlab.reproduce.writeup import git_commit, log_to_wandb, machine, summary_table, write_report


def parse(argv: list[str] | None, claims: dict) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnlab.reproduce", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="short runs, one seed (default; <= 15 min on 2 cores)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="the tasks' CPU defaults, 3 seeds (hours)")
    mode.add_argument("--gpu", dest="mode", action="store_const", const="gpu",
                      help="the paper presets (experiment=...) on hardware=gpu, 3 seeds")
    parser.set_defaults(mode="quick")
    parser.add_argument("--claims", default=",".join(claims),
                        help=f"comma-separated subset of: {', '.join(claims)} (default: all)")
    parser.add_argument("--tasks", help="train only these tasks, e.g. vqa,mlm (default: every task that exists)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override appended to every run (repeatable)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="sweeps side by side (default: %(default)s)")
    parser.add_argument("--wandb", action="store_true", help="runs log to W&B too, and the report goes to a W&B run")
    parser.add_argument("--out", type=Path, help="report directory (default: <root>/reproduce/<time>)")
    parser.add_argument("--dry-run", action="store_true", help="print the train.py sweeps and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    root = project_root()
    try:
        known = all_claims(root / "conf")  # the library's claims and those the task cards name
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args = parse(argv, known)
    names = [n.strip() for n in args.claims.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        print(f"error: --claims {args.claims}: unknown {unknown}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    tasks = tuple(t.strip() for t in args.tasks.split(",")) if args.tasks else None
    plan = Plan(args.mode, root, args.wandb, tasks, tuple(args.override))
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out_dir = (args.out or root / "reproduce" / stamp).resolve()
    claims = [known[n] for n in names]
    sweeps, skipped = group_sweeps([r for c in claims for r in c.runs(plan)], plan)
    if args.dry_run:
        for sweep in sweeps:
            print(" ".join(command(sweep, plan, out_dir / "runs" / sweep.slug)))
        for task in sorted({r.task for r in skipped}):
            print(f"# {task}: {plan.skip_reason(task)}")
        return 0

    out_dir.mkdir(parents=True, exist_ok=True)
    start, load_before, commit = time.time(), os.getloadavg()[0], git_commit(root)  # what the runs train
    print(f"[reproduce] {args.mode}: claims {', '.join(names)}; {sum(len(s.runs) for s in sweeps)} training runs "
          f"in {len(sweeps)} sweep(s), {args.jobs} at a time -> {out_dir}", flush=True)
    results = run_sweeps(sweeps, plan, out_dir, args.jobs) if sweeps else Results(plan.cards)
    outcomes = []
    for claim in claims:
        try:
            outcomes.append(claim.evaluate(plan, results, out_dir))
        except Exception as exc:  # noqa: BLE001 - one broken claim must not lose the others' report
            traceback.print_exc()
            outcomes.append(ClaimResult(claim.NAME, claim.TITLE, claim.PAPER, claim.CLAIM,
                                        ours=f"evaluation failed: {type(exc).__name__}: {exc}", setting="—",
                                        seeds="—", verdict=NOT_RUN))
    meta = {"command": "python -m attnlab.reproduce " + " ".join(sys.argv[1:] if argv is None else argv),
            "mode": args.mode, "commit": commit, "started": stamp, "machine": machine(),
            "load_before": f"{load_before:.1f}", "load_after": f"{os.getloadavg()[0]:.1f}", "jobs": args.jobs,
            "wall_s": time.time() - start}
    report = write_report(out_dir, outcomes, meta, results.runs_table())
    print(summary_table(outcomes))
    if args.wandb:
        print(f"[reproduce] W&B run: {log_to_wandb(out_dir, outcomes, meta)}")
    print(f"[reproduce] {report} ({meta['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
