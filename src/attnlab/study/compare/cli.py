"""Which attention scheme wins where, on probes built so that one mechanism decides the answer:
the pre-registered primary contrasts (each probe's config), trained through train.py with a
learning-rate grid per scheme, seeds chosen from a pilot for 80 % power, the probes' positive and
negative controls and shortcut baselines, and compare/<time>/REPORT.md with intervals, effect
sizes and verdicts (better / worse / equivalent / inconclusive). A second invocation with the same
--out reuses the runs that finished. See docs/compare.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.errors import ConfigError
from attnlab.study.compare import generalization, stability
from attnlab.study.compare.analysis import (
    build_cells,
    exploratory,
    negative_controls,
    primary_family,
    probe_checks,
)
from attnlab.study.compare.plan import (
    COMMON,
    MAX_NEEDED,
    SETTINGS,
    TASK,
    ComparePlan,
    discover,
)
from attnlab.study.compare.probes import probe_cards
from attnlab.study.compare.writeup import contrast_rows, log_to_wandb, write_report
from attnlab.study.evidence import Session, default_jobs, project_root
from attnlab.study.launch import dry_run, train


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnlab.compare", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    q, f = SETTINGS["quick"], SETTINGS["full"]
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help=f"the primary family and its controls, each probe's schemes, up to "
                           f"{q.max_seeds} seeds (default; <= 20 min on 2 cores)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help=f"every probe x every scheme, controls, difficulty sweeps, up to "
                           f"{f.max_seeds} seeds (hours)")
    mode.add_argument("--gpu", dest="mode", action="store_const", const="gpu",
                      help="as --full, with hardware=gpu and the probes' GPU sizes")
    parser.set_defaults(mode="quick")
    parser.add_argument("--probes", help="comma-separated probe= choices (default: the mode's)")
    parser.add_argument("--schemes", help="comma-separated model= choices to keep (UNAS is "
                        "always there)")
    parser.add_argument("--seeds", type=int, help="fix the seeds of every cell (no pilot, no "
                        "power computation)")
    parser.add_argument("--no-lr-grid", action="store_true",
                        help="train every scheme at the probe's learning rate")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override appended to every run (repeatable)")
    parser.add_argument("--jobs", type=int, default=default_jobs(),
                        help="sweeps side by side (default: %(default)s)")
    parser.add_argument("--wandb", action="store_true", help="also log the report to W&B (offline)")
    parser.add_argument("--out", type=Path, help="report directory (default: <root>/compare/<time>); "
                        "an earlier one to resume it")
    parser.add_argument("--generalization", action="store_true",
                        help="train small, test large: for the probes with test_options (quick: "
                             "needle; --probes to choose), one model per scheme and seed, "
                             "accuracy and target mass against test size with intervals "
                             "(REPORT.md and a PNG per probe); no contrasts or controls")
    parser.add_argument("--stability", action="store_true",
                        help="learning-rate stability (Wortsman et al., ICLR 2024): task=lm at "
                             "every rate of a log-spaced grid (quick: 7 rates over 3 decades, 3 "
                             "seeds, ~21 min on 2 cores), LR sensitivity per scheme, the "
                             "pre-registered gate / sigmoid / softpick vs UNAS (--schemes adds "
                             "exploratory ones); STABILITY.md and lr_sensitivity.png")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the first stage's train.py sweeps and exit")
    return parser.parse_args(argv)


def choose(given: str | None, known: list[str], flag: str) -> list[str] | None:
    if not given:
        return None
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"{flag} {given}: unknown {unknown}; choose from {', '.join(known)}")
    return names


def build_plan(args: argparse.Namespace, root: Path) -> ComparePlan:
    conf = root / "conf"
    if not (conf / "task" / f"{TASK}.yaml").is_file():
        raise ConfigError(f"no conf/task/{TASK}.yaml in {root}: the probe task is missing")
    registered = discover(conf, "model")
    probes = choose(args.probes, discover(conf, "probe"), "--probes")
    if args.generalization and probes is None and args.mode == "quick":
        probes = list(generalization.QUICK_PROBES)
    schemes = choose(args.schemes, registered, "--schemes")
    cards = probe_cards(conf, probes)
    plan = ComparePlan(root, args.mode, cards, registered, schemes, args.seeds,
                       not args.no_lr_grid, tuple(args.override))
    if probes:  # named probes run whatever their family
        plan.settings = type(plan.settings)(**{**plan.settings.__dict__, "every_probe": True})
    return plan


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if (args.seeds is not None and args.seeds < 2) or args.jobs < 1:
        print(f"error: --seeds {args.seeds} --jobs {args.jobs}: --seeds takes a number >= 2 (a "
              f"paired test needs two seeds), --jobs >= 1", file=sys.stderr)
        return 2
    root = project_root()
    if args.stability:
        return run_stability(args, root, sys.argv[1:] if argv is None else argv)
    try:
        plan = build_plan(args, root)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    given = sys.argv[1:] if argv is None else argv
    session = Session.begin("python -m attnlab.compare " + " ".join(given), args.mode, root,
                            args.jobs)
    out_dir = (args.out or root / "compare" / session.started).resolve()
    runs_dir = out_dir / "runs"
    if args.generalization:
        return run_generalization(args, plan, session, out_dir, root)
    first = plan.lr_runs() or plan.main_runs(plan.choose_lrs({}), plan.pilot_seeds())
    if args.dry_run:
        print("\n".join(dry_run(first, root, runs_dir, COMMON, args.jobs)))
        print("# later stages (pilot, power, controls) depend on these runs' results")
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    probes = plan.probes()
    print(f"[compare] {args.mode}: {len(probes)} probe(s) "
          f"({', '.join(p.name for p in probes)}) -> {out_dir}", flush=True)
    records: dict = {}
    trained = 0

    def stage(runs: list, label: str) -> None:
        nonlocal trained
        found, count = train(runs, root, runs_dir, COMMON, args.jobs, label)
        records.update(found)
        trained += count

    if plan.lr_grid:
        stage(plan.lr_runs(), "learning rates")
    lrs = plan.choose_lrs(records)
    stage(plan.main_runs(lrs, plan.pilot_seeds()), "pilot")
    seeds, power = plan.seeds_needed(records, lrs)
    for p in power:
        need = f"{'>= ' if p.seeds >= MAX_NEEDED else ''}{p.seeds}"
        print(f"[compare] power: {p.probe} {p.contrast} {p.outcome}: pilot s.d. {p.pilot_sd:.4f} "
              f"({p.pilot_pairs} pairs; used {p.sd_used:.4f}), effect {p.effect}, alpha "
              f"{p.alpha:.2g} -> {need} seeds for 80% power (this mode runs at most "
              f"{plan.settings.max_seeds})", flush=True)
    stage(plan.final_runs(lrs, seeds), "main and controls")
    cells = build_cells(plan, records, lrs)
    primary = primary_family(cells, probes)
    negatives = negative_controls(cells, probes)
    checks = probe_checks(cells, plan, negatives)
    meta = session.meta(trained, len(records) - trained)
    report = write_report(out_dir, plan, cells, lrs, power, seeds, primary, negatives,
                          exploratory(cells, plan), checks, meta)
    print("\n".join(contrast_rows(primary)))
    for check in checks.values():
        print(f"[compare] {check.probe}: tests its mechanism: {check.summary}")
    if args.wandb:
        print(f"[compare] W&B run: {log_to_wandb(out_dir, primary, meta)}")
    print(f"[compare] {report} ({meta['wall_s'] / 60:.1f} min)")
    return 0


def run_generalization(args: argparse.Namespace, plan: ComparePlan, session: Session,
                       out_dir: Path, root: Path) -> int:
    """--generalization: one model per (probe, scheme, seed), then the curves (its module)."""
    if not generalization.generalization_probes(plan):
        print(f"error: --generalization: none of {', '.join(plan.cards)} declares test_options "
              f"(conf/probe/<name>.yaml); choose one that does, e.g. --probes needle",
              file=sys.stderr)
        return 2
    seeds = args.seeds or (generalization.QUICK_SEEDS if args.mode == "quick"
                           else generalization.FULL_SEEDS)
    runs = generalization.runs(plan, seeds)
    runs_dir = out_dir / "runs"
    if args.dry_run:
        print("\n".join(dry_run(runs, root, runs_dir, COMMON, args.jobs)))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    names = ", ".join(c.name for c in generalization.generalization_probes(plan))
    print(f"[compare] generalization ({args.mode}): {names}, {seeds} seed(s) -> {out_dir}",
          flush=True)
    records, trained = train(runs, root, runs_dir, COMMON, args.jobs, "generalization")
    found = generalization.collect(plan, records, seeds)
    report = generalization.write_report(out_dir, plan, found,
                                         session.meta(trained, len(records) - trained))
    for card in generalization.generalization_probes(plan):
        print("\n".join(generalization.table(card, found.get(card.name, []))))
    print(f"[compare] {report}")
    return 0


def run_stability(args: argparse.Namespace, root: Path, given: list[str]) -> int:
    """--stability: every arm at every rate and seed, then LR sensitivity and the contrasts
    (attnlab.study.compare.stability)."""
    if args.generalization or args.probes or args.no_lr_grid:
        print("error: --stability trains task=lm over its own learning-rate grid; drop --probes, "
              "--generalization and --no-lr-grid", file=sys.stderr)
        return 2
    try:
        schemes = choose(args.schemes, discover(root / "conf", "model"), "--schemes")
        plan = stability.StabilityPlan.build(root, args.mode, args.seeds, schemes)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    session = Session.begin("python -m attnlab.compare " + " ".join(given), args.mode, root, args.jobs)
    out_dir = (args.out or root / "compare" / f"stability-{session.started}").resolve()
    runs, common = plan.runs(), (*COMMON, *args.override)
    if args.dry_run:
        lines = dry_run(runs, root, out_dir / "runs", common, args.jobs)
        for rate in plan.rates:
            print(f"# lr={rate:g}: {', '.join(a.label for a in plan.arms)}; seeds 1-{plan.seeds}")
            print("\n".join(line for line in lines if f"{stability.RATE}={rate} " in line))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"[compare] stability ({args.mode}): {len(plan.arms)} arms x {len(plan.rates)} rates x "
          f"{plan.seeds} seeds -> {out_dir}", flush=True)
    records, trained = train(runs, root, out_dir / "runs", common, args.jobs, "stability")
    found = stability.measure(plan, records)
    judged = stability.judge(plan, found)
    meta = session.meta(trained, len(records) - trained)
    report = stability.write_report(out_dir, plan, found, judged, meta)
    print("\n".join(stability.grid_table(plan, found)))
    print("\n".join(stability.contrast_table(judged)))
    print(f"[compare] {stability.engaged(found)[1]}")
    if args.wandb:
        print(f"[compare] W&B run: {stability.log_to_wandb(out_dir, found, judged, meta)}")
    print(f"[compare] {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

