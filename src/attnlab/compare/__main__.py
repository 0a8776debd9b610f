"""Which attention scheme wins where: every scheme x every probe x seeds, trained through
train.py as Hydra multiruns, and compare/<time>/REPORT.md with the table (mean ± s.e. over
seeds, best per probe), each scheme against UNAS paired by seed (paired t-test, Holm), the
trivial baselines, the diagnostics and a heatmap. A second invocation with the same --out reuses
the runs that finished. See docs/compare.md."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from attnlab.cards import task_cards
from attnlab.compare.cells import build_cells, keys_for
from attnlab.compare.launch import run_missing
from attnlab.compare.plan import (
    BASELINE_SCHEME,
    SEEDS,
    TASK,
    ComparePlan,
    discover,
    finished_runs,
    sweeps_for,
)
from attnlab.compare.writeup import HEATMAP, heatmap, log_to_wandb, write_report
from attnlab.errors import ConfigError
from attnlab.reproduce.launch import command, project_root
from attnlab.reproduce.plan import default_jobs
from attnlab.reproduce.writeup import git_commit, machine


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnlab.compare", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="the probes' CPU defaults, 3 seeds (default; <= 20 min on 2 cores)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="5 seeds, the probes' longer settings (probe.compare.full)")
    mode.add_argument("--gpu", dest="mode", action="store_const", const="gpu",
                      help="5 seeds, hardware=gpu and the probes' GPU sizes (probe.compare.gpu)")
    parser.set_defaults(mode="quick")
    parser.add_argument("--schemes",
                        help="comma-separated model= choices (default: every conf/model/*.yaml)")
    parser.add_argument("--probes",
                        help="comma-separated probe= choices (default: every conf/probe/*.yaml)")
    parser.add_argument("--seeds", type=int,
                        help="seeds 1..N per scheme and probe (default: 3 quick, 5 full/gpu)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override appended to every run (repeatable)")
    parser.add_argument("--jobs", type=int, default=default_jobs(),
                        help="sweeps side by side (default: %(default)s)")
    parser.add_argument("--wandb", action="store_true",
                        help="also log the table and heatmap to a W&B run (offline)")
    parser.add_argument("--out", type=Path, help="report directory (default: "
                        "<root>/compare/<time>); an earlier one to resume it")
    parser.add_argument("--dry-run", action="store_true", help="print the train.py sweeps and exit")
    return parser.parse_args(argv)


def choose(given: str | None, known: list[str], flag: str) -> list[str]:
    if not given:
        return known
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"{flag} {given}: unknown {unknown}; choose from {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if (args.seeds is not None and args.seeds < 1) or args.jobs < 1:
        print(f"error: --seeds {args.seeds} --jobs {args.jobs}: both take a number >= 1",
              file=sys.stderr)
        return 2
    root = project_root()
    card = task_cards(root / "conf").get(TASK)
    if card is None:
        print(f"error: no conf/task/{TASK}.yaml in {root}: the probe task is missing",
              file=sys.stderr)
        return 2
    try:
        schemes = choose(args.schemes, discover(root / "conf", "model"), "--schemes")
        probes = choose(args.probes, discover(root / "conf", "probe"), "--probes")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # UNAS first, always there: every verdict is against it
    schemes = [BASELINE_SCHEME] + [s for s in schemes if s != BASELINE_SCHEME]
    seeds = list(range(1, (args.seeds or SEEDS[args.mode]) + 1))
    plan = ComparePlan(root, args.mode, schemes, probes, seeds, tuple(args.override))
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out_dir = (args.out or root / "compare" / stamp).resolve()
    runs_dir = out_dir / "runs"
    reused = finished_runs(plan, runs_dir)
    missing = [r for r in plan.runs if r not in reused]
    sweeps = sweeps_for(missing, runs_dir, args.jobs)
    if args.dry_run:
        for sweep in sweeps:
            print(" ".join(command(sweep, plan, runs_dir / sweep.slug)))
        return 0

    out_dir.mkdir(parents=True, exist_ok=True)
    start, load_before = time.time(), os.getloadavg()[0]
    print(f"[compare] {args.mode}: {len(schemes)} scheme(s) x {len(probes)} probe(s) x "
          f"{len(seeds)} seed(s): {len(missing)} run(s) to train in {len(sweeps)} sweep(s), "
          f"{len(reused)} reused -> {out_dir}", flush=True)
    records = {r: reused[r] for r in plan.runs if r in reused}
    records |= run_missing(sweeps, plan, runs_dir, len(reused), args.jobs) if sweeps else {}
    keys = keys_for(card, list(records.values()))
    cells = build_cells(records, keys)
    heatmap(cells, schemes, probes, keys, out_dir / HEATMAP)
    given = sys.argv[1:] if argv is None else argv
    meta = {"command": "python -m attnlab.compare " + " ".join(given), "mode": args.mode,
            "seeds": len(seeds), "commit": git_commit(root), "started": stamp, "machine": machine(),
            "load_before": f"{load_before:.1f}", "load_after": f"{os.getloadavg()[0]:.1f}",
            "jobs": args.jobs, "trained": len(missing), "reused": len(reused),
            "wall_s": time.time() - start}
    report = write_report(out_dir, cells, schemes, probes, keys, meta)
    if args.wandb:
        print(f"[compare] W&B run: {log_to_wandb(out_dir, cells, keys, meta)}")
    print(f"[compare] {report} ({meta['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
