"""Run each claim of the papers as a small experiment and write reproduce/<time>/REPORT.md."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from attnlab.errors import ConfigError
from attnlab.study.evidence import Session, default_jobs, not_tested, project_root
from attnlab.study.launch import dry_run, train
from attnlab.study.reproduce.plan import Plan
from attnlab.study.reproduce.registry import claims as all_claims
from attnlab.study.reproduce.results import Results
from attnlab.study.reproduce.writeup import log_to_wandb, summary_table, write_report


def parse(argv: list[str] | None, claims: dict) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnlab.reproduce", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="short runs: one seed per task, 5 per probe (default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="the tasks' CPU defaults, 3 seeds per task, 10 per probe (hours)")
    mode.add_argument("--gpu", dest="mode", action="store_const", const="gpu",
                      help="the paper presets (experiment=...) on hardware=gpu")
    parser.set_defaults(mode="quick")
    parser.add_argument("--claims", default=",".join(claims),
                        help=f"comma-separated subset of: {', '.join(claims)} (default: all)")
    parser.add_argument("--tasks", help="train only these tasks, e.g. vqa,probe (default: every "
                        "task --quick trains, or every task)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override appended to every run (repeatable)")
    parser.add_argument("--jobs", type=int, default=default_jobs(),
                        help="sweeps side by side (default: %(default)s)")
    parser.add_argument("--wandb", action="store_true",
                        help="runs log to W&B too, and the report goes to a W&B run")
    parser.add_argument("--out", type=Path, help="report directory (default: "
                        "<root>/reproduce/<time>); an earlier one to resume it")
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
        print(f"error: --claims {args.claims}: unknown {unknown}; choose from {', '.join(known)}",
              file=sys.stderr)
        return 2
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip()) if args.tasks is not None else None
    plan = Plan(args.mode, root, args.wandb, tasks, tuple(args.override))
    unknown = [t for t in tasks or () if t not in plan.cards]
    if unknown or tasks == ():  # else every run is skipped "not selected" and the command does nothing
        print(f"error: --tasks {args.tasks}: unknown {unknown}; choose from {', '.join(plan.cards)}",
              file=sys.stderr)
        return 2
    given = sys.argv[1:] if argv is None else argv
    session = Session.begin("python -m attnlab.reproduce " + " ".join(given), args.mode, root,
                            args.jobs)
    out_dir = (args.out or root / "reproduce" / session.started).resolve()
    claims = [known[n] for n in names]
    try:
        wanted = [r for c in claims for r in c.runs(plan)]
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    runs = [r for r in dict.fromkeys(wanted) if not plan.skip_reason(r.task)]
    if args.dry_run:
        print("\n".join(dry_run(runs, root, out_dir / "runs", plan.common, args.jobs)))
        staged = [c.NAME for c in claims if hasattr(c, "more_runs")]
        if staged:
            print(f"# then: the seeds 80 % power needs, from these runs as a pilot ({', '.join(staged)})")
        for task in sorted({r.task for r in wanted if plan.skip_reason(r.task)}):
            print(f"# {task}: {plan.skip_reason(task)}")
        return 0

    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"[reproduce] {args.mode}: claims {', '.join(names)} -> {out_dir}", flush=True)
    records, trained = train(runs, root, out_dir / "runs", plan.common, args.jobs, "reproduce")
    results = Results(plan.cards)  # judges every run against its task's trivial baseline
    for run, record in records.items():
        results.add(run, record)
    # second stage: a claim that planned its seeds from a pilot (the first runs) asks for the rest
    more = [r for c in claims if hasattr(c, "more_runs") for r in c.more_runs(plan, results)]
    more = [r for r in dict.fromkeys(more) if r not in records and not plan.skip_reason(r.task)]
    if more:
        print(f"[reproduce] {len(more)} more run(s): the seeds 80 % power needs", flush=True)
        extra, extra_trained = train(more, root, out_dir / "runs", plan.common, args.jobs, "reproduce")
        trained += extra_trained
        records.update(extra)
        for run, record in extra.items():
            results.add(run, record)
    outcomes = []
    for claim in claims:
        try:
            outcomes.append(claim.evaluate(plan, results, out_dir))
        except Exception as exc:  # noqa: BLE001 - one broken claim must not lose the others' report
            traceback.print_exc()
            outcomes.append(not_tested(claim.NAME, claim.TITLE, claim.PAPER, claim.CLAIM,
                                       f"evaluation failed: {type(exc).__name__}: {exc}"))
    meta = session.meta(trained, len(records) - trained)
    report = write_report(out_dir, outcomes, meta, results.runs_table())
    print(summary_table(outcomes))
    if args.wandb:
        print(f"[reproduce] W&B run: {log_to_wandb(out_dir, outcomes, meta)}")
    print(f"[reproduce] {report} ({meta['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
