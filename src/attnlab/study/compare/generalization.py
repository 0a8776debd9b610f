"""`python -m attnlab.compare --generalization`: train small, test large (docs/compare.md).

For every chosen probe that declares `test_options` (conf/probe/<name>.yaml; e.g. needle's
{length: [128, ..., 1024], depth: [0.0, ..., 1.0]}), one model per (scheme, seed) is trained at
the probe's own sizes and learning rate, and its end-of-training test scores every test cell
(tasks/probe/datamodule.py: `test/acc@<cell>`, `test/target_mass@<cell>`). Here the cells become
curves: per scheme, accuracy and target mass against the first test option (the test size); the
other options of a grid (needle's depth) are averaged within each run first, so a seed is one
value per size. Each point is the mean over seeds with its Student-t 95 % interval
(attnlab.study.stats.t_interval); the training size's own test (`test/acc`) is the table's
`trained` column. Beside each scheme's accuracy, its probe's shortcut (the rule that answers
without the mechanism, `test/shortcut_acc@<cell>`) on the same cells, and `learned`: how many
runs beat both the shortcut and chance at the training size; a scheme none of whose runs did is
labelled "did not learn" (its curve then describes the shortcut, not the mechanism). REPORT.md
holds one table per probe and `generalization_<probe>.png` the curves; each run's dir keeps its
full grid (test_options.png, the heat map).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.figures import save_png
from attnlab.study.compare.plan import ComparePlan
from attnlab.study.compare.probes import MAIN, Condition, ProbeCard
from attnlab.study.evidence import Run
from attnlab.study.stats import t_interval

METRICS = ("acc", "shortcut_acc", "target_mass")
NAMES = {"acc": "accuracy", "shortcut_acc": "shortcut accuracy", "target_mass": "target mass"}
PLOTTED = ("acc", "target_mass")  # a panel each; the shortcut dashed in the accuracy panel
QUICK_SEEDS = 2  # --quick without --seeds: the fewest that give an interval
QUICK_PROBES = ("needle",)
# --quick: 128 test rows a cell, and two epochs for the quick probe set (needle's unas and ssmax
# reached test/acc 0.96-1.0 so), so its six runs take minutes on 2 cores; a probe asked for by
# --probes trains its own epochs (the needle variants need 5-10: their configs); --full trains
# the probes' own sizes
QUICK_OVERRIDES = ("probe.n_test=128",)
QUICK_EPOCHS = "trainer.max_epochs=2"
FULL_SEEDS = 5


def cell_name(cell: Mapping) -> str:
    """A test cell's metric suffix, as tasks/probe/datamodule.py's cell_name writes it."""
    return ",".join(f"{key}={value}" for key, value in cell.items())


def cells_at(test_options: Mapping[str, tuple], size) -> list[str]:
    """The names of the cells whose first option is `size` (every value of the others)."""
    first, *rest = list(test_options)
    return [cell_name({first: size, **dict(zip(rest, values))})
            for values in itertools.product(*(test_options[k] for k in rest))]


@dataclass(frozen=True)
class Point:
    """One scheme's metric at one test size: the per-seed values, their mean and interval."""

    probe: str
    scheme: str
    metric: str
    size: object  # the first test option's value; "trained" for the training-size test
    values: tuple[float, ...]
    # accuracy at the training size: (runs that beat their shortcut and chance there, runs that
    # report both); None elsewhere, or where the runs report no shortcut
    learned: tuple[int, int] | None = None

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        return t_interval(self.values)


def generalization_probes(plan: ComparePlan) -> list[ProbeCard]:
    """The chosen probes that declare test_options (every probe's family: --probes, or all)."""
    return [card for card in plan.cards.values() if card.test_options]


def run(plan: ComparePlan, card: ProbeCard, scheme: str, seed: int) -> Run:
    """A (probe, scheme, seed)'s run: the probe's learning rate, --quick's overrides last."""
    found = plan.run(card, Condition(MAIN), scheme, seed, card.lr)
    quick = ()
    if plan.mode == "quick":
        quick = (QUICK_EPOCHS, *QUICK_OVERRIDES) if card.name in QUICK_PROBES else QUICK_OVERRIDES
    return Run(found.task, found.model, found.seed, (*found.extra, *quick))


def runs(plan: ComparePlan, seeds: int) -> list[Run]:
    """One run per (probe, scheme, seed)."""
    return [run(plan, card, scheme, seed) for card in generalization_probes(plan)
            for scheme in plan.schemes_for(card) for seed in range(1, seeds + 1)]


def run_value(metrics: Mapping, metric: str, cells: Iterable[str]) -> float | None:
    """A run's metric averaged over `cells` (None when a cell is missing: not logged)."""
    values = [metrics.get(f"test/{metric}@{cell}") for cell in cells]
    if not values or any(v is None or not math.isfinite(float(v)) for v in values):
        return None
    return float(np.mean([float(v) for v in values]))


def points(card: ProbeCard, scheme: str, records: Mapping[int, Mapping]) -> list[Point]:
    """{seed: metrics} of one (probe, scheme) -> a Point per metric and test size, the training
    size's own test first (size "trained"); runs that failed are left out of every point."""
    sizes = next(iter(card.test_options))
    out = []
    for metric in METRICS:
        trained = [float(m[f"test/{metric}"]) for m in records.values() if f"test/{metric}" in m]
        out.append(Point(card.name, scheme, metric, "trained", tuple(trained),
                         learned(records.values()) if metric == "acc" else None))
        for size in card.test_options[sizes]:
            cells = cells_at(card.test_options, size)
            values = [v for m in records.values() if (v := run_value(m, metric, cells)) is not None]
            out.append(Point(card.name, scheme, metric, size, tuple(values)))
    return [p for p in out if p.values or p.metric == "acc"]


def learned(records: Iterable[Mapping]) -> tuple[int, int] | None:
    """(runs whose test/acc beats both test/shortcut_acc and test/baseline_acc (chance), runs
    that report all three); None when none does."""
    keys = ("test/acc", "test/shortcut_acc", "test/baseline_acc")
    judged = [[float(m[k]) for k in keys] for m in records if all(k in m for k in keys)]
    if not judged:
        return None
    return sum(acc > max(shortcut, chance) for acc, shortcut, chance in judged), len(judged)


def did_not_learn(point: Point) -> bool:
    return point.learned is not None and point.learned[0] == 0


def collect(plan: ComparePlan, records: Mapping[Run, dict], seeds: int) -> dict[str, list[Point]]:
    """{probe: its points} from the finished runs' records (status ok)."""
    out: dict[str, list[Point]] = {}
    for card in generalization_probes(plan):
        found = []
        for scheme in plan.schemes_for(card):
            metrics = {}
            for seed in range(1, seeds + 1):
                record = records.get(run(plan, card, scheme, seed))
                if record and record.get("status") == "ok":
                    metrics[seed] = record.get("metrics") or {}
            found += points(card, scheme, metrics)
        out[card.name] = found
    return out


def _cell(point: Point) -> str:
    if not point.values:
        return "—"
    low, high = point.interval
    shown = f"{point.mean:.3f}"
    if math.isfinite(low):
        shown += f" [{low:.3f}, {high:.3f}]"
    return shown


def table(card: ProbeCard, found: list[Point]) -> list[str]:
    """The probe's markdown table: a row per (scheme, metric), a column per test size."""
    first = next(iter(card.test_options))
    sizes = ["trained", *card.test_options[first]]
    head = ["scheme", "metric", "seeds", "learned", "trained", *(f"{first}={s}" for s in sizes[1:])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_key = {(p.scheme, p.metric, str(p.size)): p for p in found}
    schemes = list(dict.fromkeys(p.scheme for p in found))
    for scheme in schemes:
        for metric in METRICS:
            row = [by_key.get((scheme, metric, str(s))) for s in sizes]
            if all(p is None or not p.values for p in row):
                continue
            seeds = max(len(p.values) for p in row if p is not None)
            judged = row[0].learned if row[0] is not None else None
            learned = "" if judged is None else f"{judged[0]}/{judged[1]}" + (
                " (did not learn)" if did_not_learn(row[0]) else "")
            lines.append("| " + " | ".join([scheme, NAMES[metric], str(seeds), learned,
                                            *(_cell(p) if p else "—" for p in row)]) + " |")
    return lines


def figure(card: ProbeCard, found: list[Point], path: Path) -> Path:
    """Accuracy and target mass against the test size, a curve per scheme with its intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(card.test_options))
    sizes = list(card.test_options[first])
    metrics = [m for m in PLOTTED if any(p.metric == m and p.size != "trained" and p.values
                                         for p in found)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for scheme in dict.fromkeys(p.scheme for p in found):
            row = {p.size: p for p in found if p.scheme == scheme and p.metric == metric}
            xs = [i for i, s in enumerate(sizes) if s in row and row[s].values]
            means = np.array([row[sizes[i]].mean for i in xs])
            bounds = np.array([row[sizes[i]].interval for i in xs]).reshape(-1, 2)
            err = np.abs(np.nan_to_num(bounds - means[:, None], nan=0.0)).T
            trained = next((p for p in found if p.scheme == scheme and p.metric == "acc"
                            and p.size == "trained"), None)
            label = scheme + (" (did not learn)" if trained and did_not_learn(trained) else "")
            line = ax.errorbar(xs, means, yerr=err, marker="o", capsize=3, label=label)
            shortcut = {p.size: p for p in found if p.scheme == scheme
                        and p.metric == "shortcut_acc" and p.values}
            if metric == "acc" and shortcut:
                at = [i for i, s in enumerate(sizes) if s in shortcut]
                ax.plot(at, [shortcut[sizes[i]].mean for i in at], linestyle="--",
                        color=line.lines[0].get_color(), label=f"{scheme}: shortcut")
        ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set_xlabel(f"test {first}" + (" (other options averaged)" if len(card.test_options) > 1
                                         else ""))
        ax.set_ylabel(NAMES[metric])
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
    fig.suptitle(f"{card.name}: trained small, tested large (mean, 95% t-interval over seeds)")
    fig.tight_layout()
    return save_png(fig, path)


def write_report(out_dir: Path, plan: ComparePlan, found: Mapping[str, list[Point]],
                 meta: Mapping) -> Path:
    """REPORT.md of a --generalization run: per probe its training setting, table and curves."""
    session = (f"`{meta['command']}` ({meta['mode']}), commit {meta['commit']}, "
               f"{meta['machine']}, {meta['wall_s'] / 60:.1f} min, {meta['trained']} run(s) "
               f"trained, {meta['reused']} reused.")
    how = ("One model per (scheme, seed), trained at the probe's own sizes and learning rate, "
           "tested on every cell of its `test_options`; each value is the mean over seeds with "
           "its Student-t 95 % interval. A grid's other options are averaged within each run "
           "(each run dir's test_options.png shows its whole grid). `trained` is the ordinary "
           "test split, drawn like the training data. `shortcut accuracy` is the probe's rule "
           "that answers without the mechanism, on the same test rows; `learned` counts the runs "
           "whose accuracy at the training size beats both it and chance. A scheme with none is "
           "labelled \"did not learn\": its curve describes the shortcut, not the mechanism.")
    lines = ["# Train small, test large", "", session, "", how, ""]
    for card in generalization_probes(plan):
        grid = ", ".join(f"{k}: {list(v)}" for k, v in card.test_options.items())
        lines += [f"## {card.name}", "", f"{card.mechanism}. Test options: {grid}.", ""]
        lines += table(card, found.get(card.name, []))
        if found.get(card.name):
            png = figure(card, found[card.name], out_dir / f"generalization_{card.name}.png")
            lines += ["", f"![{card.name}]({png.name})"]
        lines.append("")
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines))
    return path
