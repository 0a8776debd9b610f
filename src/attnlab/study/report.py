"""Paper-style table of a sweep: one row per configuration, mean ± standard error over seeds.

    python -m attnlab.report outputs/multirun/<timestamp>
    python -m attnlab.report outputs/multirun/<timestamp> --baseline model=unas
    python -m attnlab.report outputs/multirun/<timestamp> --metrics 'test/*' val/loss

Reads every job's metrics.json (written by train.py) and groups the jobs by their command-line
overrides without `seed=`: each row is one configuration, its metrics the mean ± s.e. over its
seeds. Rows are labelled by the overrides that vary across the sweep (those shared by every job
are printed once above the table). The columns are, by default, the task's optimized metric and
the metrics its card names (`task.card.metrics` in conf/task/<task>.yaml); `--metrics` chooses
any (names or patterns such as 'test/*'). `--baseline model=unas` adds each row against the row
that differs from it only in those overrides, paired by seed (attnlab.study.stats.contrast_family:
paired t-test and TOST at --margin, Holm across the rows; better / worse / equivalent /
inconclusive) on the optimized metric. The table is also
written as CSV (`report.csv` next to the jobs). Jobs that did not finish are listed under the
table with their status: failed (the error), interrupted (SIGTERM; resume it), killed (the
process died: metrics.json still says running, or there is none).
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.cards import Card, task_cards
from attnlab.errors import ConfigError, did_you_mean
from attnlab.study.evidence import METRICS_FILE, load_jobs
from attnlab.study.stats import BETTER, WORSE, Contrast, contrast_family, mean_se

__all__ = ["METRICS_FILE", "build_table", "load_jobs", "main", "markdown", "mean_se"]


# ----------------------------------------------------------------------------- configurations
def overrides_of(record: dict) -> dict[str, str]:
    """The job's command-line overrides without the seed, {key: value} (`+`/`~` kept on the key)."""
    pairs = [o.split("=", 1) for o in record.get("overrides", []) if "=" in o]
    found = {k: v for k, v in pairs if not k.lstrip("+~").endswith("seed")}
    if not found:  # a job without recorded overrides: what its record says
        found = {"task": str(record.get("task")), "model": str(record.get("model"))}
    return found


def config_key(record: dict) -> str:
    return " ".join(sorted(f"{k}={v}" for k, v in overrides_of(record).items()))


@dataclass
class Row:
    """One configuration: its overrides, its label (what varies), its jobs."""

    overrides: dict[str, str]
    label: str = ""
    jobs: list[dict] = field(default_factory=list)

    @property
    def finished(self) -> list[dict]:
        return [j for j in self.jobs if j.get("status") == "ok"]

    def by_seed(self, metric: str) -> dict[object, float]:
        """{seed: value} of the finished jobs that logged `metric`."""
        out = {}
        for i, job in enumerate(self.finished):
            value = job.get("metrics", {}).get(metric)
            if value is not None:
                out[job.get("seed", f"job{i}")] = float(value)
        return out


def group_rows(jobs: list[dict]) -> tuple[list[Row], dict[str, str]]:
    """The configurations (one row each, labelled by the overrides that vary across the sweep)
    and the overrides every job shares. A sweep of one configuration is labelled by all of its."""
    rows: dict[str, Row] = {}
    for job in jobs:
        rows.setdefault(config_key(job), Row(overrides_of(job))).jobs.append(job)
    keys = {k for row in rows.values() for k in row.overrides}
    varying = sorted(k for k in keys if len({row.overrides.get(k) for row in rows.values()}) > 1)
    shared = {} if len(rows) < 2 else {k: v for k, v in next(iter(rows.values())).overrides.items()
                                       if k not in varying}
    for key, row in rows.items():
        label = [f"{k}={row.overrides[k]}" for k in varying if k in row.overrides]
        row.label = " ".join(label) or key
    return sorted(rows.values(), key=lambda r: r.label), shared


# ----------------------------------------------------------------------------- metrics
def _cards() -> dict[str, Card]:
    try:
        return task_cards()
    except (ConfigError, OSError):  # outside a checkout: fall back to what the records say
        return {}


def default_metrics(jobs: list[dict], cards: dict[str, Card] | None = None) -> list[str]:
    """Each task's optimized metric and its card's metrics, those some finished job logged."""
    cards = _cards() if cards is None else cards
    ok = [j for j in jobs if j.get("status") == "ok"]
    wanted: list[str] = []
    for job in ok:
        card = cards.get(str(job.get("task")))
        names = [job.get("optimized_metric") or (card and card.optimized_metric)]
        names += list(card.metrics) if card else []
        wanted += [n for n in names if n and n not in wanted]
    logged = {k for j in ok for k in j.get("metrics", {})}
    chosen = [m for m in wanted if m in logged]
    return chosen or sorted(k for k in logged if k.startswith("test/"))


def expand_metrics(patterns: list[str], jobs: list[dict]) -> list[str]:
    """--metrics: names kept as given (a job that did not log one shows —), patterns ('test/*')
    expanded; a name no job logged, or a pattern that matches none, is a ConfigError (a typo
    would otherwise print a column of dashes)."""
    logged = sorted({k for j in jobs for k in j.get("metrics", {})})
    out: list[str] = []
    for pattern in patterns:
        names = fnmatch.filter(logged, pattern) if any(c in pattern for c in "*?[") else [pattern]
        if not set(names) & set(logged):
            raise ConfigError(f"--metrics {pattern}: no job logged it{did_you_mean(pattern, logged)}; "
                              f"e.g. --metrics {' '.join((logged or ['test/acc'])[:2])} (or a pattern, 'test/*')")
        out += [n for n in names if n not in out]
    return out


def build_table(jobs: list[dict], metrics: list[str] | None = None) -> tuple[list[str], list[list]]:
    rows, _ = group_rows(jobs)
    metrics = metrics or default_metrics(jobs)
    header = ["configuration", "seeds", "not finished"] + metrics
    table = []
    for row in rows:
        cells: list = [row.label, len(row.finished), len(row.jobs) - len(row.finished)]
        for m in metrics:
            values = list(row.by_seed(m).values())
            cells.append(mean_se(values) if values else None)
        table.append(cells)
    return header, table


# ----------------------------------------------------------------------------- baseline
def parse_selector(tokens: list[str]) -> dict[str, str]:
    pairs = [t.split("=", 1) for t in tokens]
    if not tokens or any(len(p) != 2 or not p[0] for p in pairs):
        raise ConfigError(f"--baseline {' '.join(tokens)}: write overrides as key=value, "
                          f"e.g. --baseline model=unas")
    return dict(pairs)


DEFAULT_MARGIN = 0.01  # --margin: the equivalence margin, in the metric's units


def compare_to_baseline(rows: list[Row], selector: dict[str, str], metric: str,
                        higher_is_better: bool, margin: float = DEFAULT_MARGIN,
                        ) -> dict[str, tuple[Row, Contrast]]:
    """Each row against its baseline row (the same overrides with `selector`'s values), paired
    by seed, as one family (attnlab.study.stats.contrast_family: Holm across the rows, TOST at
    `margin`): {row label: (baseline row, contrast)}."""
    by_overrides = {tuple(sorted(r.overrides.items())): r for r in rows}
    pairs = {}
    for row in rows:
        base = by_overrides.get(tuple(sorted({**row.overrides, **selector}.items())))
        if base is not None and base is not row:
            pairs[row.label] = base
    if not pairs:
        choices = "; ".join(r.label for r in rows)
        raise ConfigError(f"--baseline {' '.join(f'{k}={v}' for k, v in selector.items())}: no row "
                          f"has these overrides, or no other row differs from one only in them; "
                          f"the rows: {choices}")
    row_of = {r.label: r for r in rows}
    cells = {label: (row_of[label].by_seed(metric), base.by_seed(metric), margin)
             for label, base in pairs.items()}
    results = contrast_family(cells, higher_is_better=higher_is_better)
    return {label: (pairs[label], results[label]) for label in pairs}


def baseline_table(results: dict[str, tuple[Row, Contrast]], metric: str) -> str:
    lines = [(f"| configuration | against | paired seeds | {metric} difference [95% CI] | d_z | "
              "p | p (Holm) | TOST p (Holm) | verdict |"), "|---" * 9 + "|"]
    for label, (base, c) in results.items():
        low, high = c.difference_interval
        interval = "" if math.isnan(low) else f" [{low:+.4f}, {high:+.4f}]"
        dropped = f" ({c.dropped} unpaired)" if c.dropped else ""
        verdict = f"**{c.verdict}**" if c.verdict in (BETTER, WORSE) else c.verdict
        difference = "—" if math.isnan(c.difference) else f"{c.difference:+.4f}{interval}"
        lines.append(f"| {label} | {base.label} | {c.n}{dropped} | {difference} | "
                     f"{_p(c.effect_size)} | {_p(c.p_value)} | {_p(c.p_adjusted)} | "
                     f"{_p(c.tost_adjusted)} | {verdict} |")
    return "\n".join(lines)


def _p(p: float) -> str:
    return "—" if math.isnan(p) else f"{p:.3g}"


# ----------------------------------------------------------------------------- output
def format_cell(cell, sign: str = "") -> str:
    if cell is None:
        return "—"
    if isinstance(cell, tuple):
        mean, se = cell
        if math.isnan(mean):
            return "—"
        return f"{mean:{sign}.4f}" if math.isnan(se) else f"{mean:{sign}.4f} ± {se:.4f}"
    return str(cell)


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        out_header = header[:3]
        for m in header[3:]:
            out_header += [f"{m} mean", f"{m} se"]
        writer.writerow(out_header)
        for row in rows:
            out = row[:3]
            for cell in row[3:]:
                out += list(cell) if cell is not None else ["", ""]
            writer.writerow(out)


def comparison_metric(jobs: list[dict]) -> tuple[str, bool]:
    """The optimized metric of the sweep's task and its direction (the card's monitor_mode)."""
    ok = [j for j in jobs if j.get("status") == "ok" and j.get("optimized_metric")]
    metrics = {(j["optimized_metric"], j.get("task")) for j in ok}
    if len({m for m, _ in metrics}) != 1:
        raise ConfigError(f"--baseline compares on the task's optimized metric; the finished jobs "
                          f"have {len(metrics)} different ones ({sorted(m for m, _ in metrics)}): "
                          f"report one task at a time")
    metric, task = next(iter(metrics))
    card = _cards().get(str(task))
    return metric, (card.monitor_mode if card else "max") != "min"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path,
                        help="a Hydra multirun dir, e.g. outputs/multirun/<timestamp>")
    parser.add_argument("--metrics", nargs="*", help="metrics or patterns to show, e.g. 'test/*' "
                        "(default: the task's optimized metric and its card's metrics)")
    parser.add_argument("--baseline", nargs="+", metavar="KEY=VALUE",
                        help="compare each row with the row that has these overrides, "
                        "paired by seed")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help="with --baseline: the equivalence margin in the metric's units "
                        "(TOST; default %(default)s)")
    parser.add_argument("--csv", type=Path, help="CSV path (default: <sweep_dir>/report.csv)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: {args.sweep_dir} is not a directory; pass outputs/multirun/<timestamp>",
              file=sys.stderr)
        return 2
    jobs = load_jobs(args.sweep_dir)
    if not jobs:
        print(f"error: no {METRICS_FILE} under {args.sweep_dir}: did the sweep run train.py?",
              file=sys.stderr)
        return 2
    try:
        metrics = expand_metrics(args.metrics, jobs) if args.metrics else None
        header, table = build_table(jobs, metrics)
        rows, shared = group_rows(jobs)
        if shared:
            print("every job: " + " ".join(f"{k}={v}" for k, v in sorted(shared.items())) + "\n")
        print(markdown(header, table))
        if args.baseline:
            metric, higher = comparison_metric(jobs)
            if not args.margin > 0:
                raise ConfigError(f"--margin {args.margin}: the equivalence margin must be > 0, "
                                  f"e.g. --margin 0.01")
            results = compare_to_baseline(rows, parse_selector(args.baseline), metric, higher,
                                          args.margin)
            print(f"\nAgainst {' '.join(args.baseline)}, paired by seed on {metric} "
                  f"({'higher' if higher else 'lower'} is better; paired t-test and TOST at "
                  f"+-{args.margin:g}, Holm across {len(results)} row(s), alpha 0.05: better / "
                  f"worse / equivalent / inconclusive):\n")
            print(baseline_table(results, metric))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for job in jobs:
        if job.get("status") != "ok":
            print(f"\n{job.get('status', 'failed')}: {job['_path']}: {job.get('error', '?')}")
    csv_path = args.csv or args.sweep_dir / "report.csv"
    write_csv(csv_path, header, table)
    print(f"\nCSV: {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
