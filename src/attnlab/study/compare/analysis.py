"""From the runs' records to what a comparison concludes (docs/compare.md):

- cells (probe, condition, scheme): each outcome by seed (test accuracy, learning-curve AUC),
  whether each run learned (an exact binomial test of its test answers against the trivial
  baseline: k of n, failures kept in the cell, never dropped), the baselines, the diagnostics;
- the primary family: every primary probe's contrasts on its main setting x both outcomes, with
  Holm within that family only (attnlab.study.stats.contrast_family): better / worse /
  equivalent (TOST at the probe's margin) / inconclusive;
- the controls: the negative control's contrasts (its own family: equivalent is what theory
  says), and whether the positive control breaks the probe (its schemes fall at least halfway
  to the shortcut, or its contrasts' differences at least halve or reverse);
- per probe, whether it tests its mechanism: its schemes beat the shortcut and its positive
  control breaks it;
- everything else exploratory: each scheme against UNAS, intervals and no verdict.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

import numpy as np

from attnlab.study import stats
from attnlab.study.compare.plan import OUTCOMES, REFERENCE, CellKey, ComparePlan
from attnlab.study.compare.probes import MAIN, NEGATIVE, POSITIVE, ContrastSpec, ProbeCard
from attnlab.study.evidence import Run, scheme_params
from attnlab.study.learned import learned_test

ACC = OUTCOMES[0]
# the diagnostics per layer (ExplainedAway) and per run, by the name the report gives them
LAYER_DIAGNOSTICS = {"min col sum x S": "min_col_sum_times_S", "share < 1e-8": "share_below_1e-08",
                     "entropy (nats)": "entropy"}
RUN_DIAGNOSTICS = {"head JSD": "avg_jsd", "head distance": "head_distance",
                   "collision rate": "collision_rate", "target mass": "target_mass"}
_LAYER_KEY = re.compile(r"^explained_away/layer(\d+)/(.+)$")


@dataclass
class Cell:
    probe: str
    condition: str
    scheme: str
    lr: float
    values: dict[str, dict[int, float]] = field(default_factory=dict)  # outcome -> seed -> value
    learned: dict[int, bool] = field(default_factory=dict)  # seed -> beat the trivial baseline
    baselines: list[float] = field(default_factory=list)
    shortcuts: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    diagnostics: dict[str, list[float]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.values.get(ACC, {}))

    def mean(self, outcome: str = ACC) -> float:
        values = list(self.values.get(outcome, {}).values())
        return float(np.mean(values)) if values else math.nan

    def interval(self, outcome: str = ACC) -> tuple[float, float]:
        return stats.t_interval(list(self.values.get(outcome, {}).values()))

    @property
    def baseline(self) -> float:
        return float(np.mean(self.baselines)) if self.baselines else math.nan

    @property
    def shortcut(self) -> float:
        return float(np.mean(self.shortcuts)) if self.shortcuts else math.nan

    @property
    def learned_count(self) -> int:
        return sum(self.learned.values())


def run_learned(metrics: dict) -> bool:
    """Did a run beat its trivial baseline on the test set: an exact one-sided binomial test of its
    correct answers against the baseline's accuracy (attnlab.study.learned.learned_test)."""
    acc, answers = metrics.get("test/acc"), metrics.get("test/answers")
    baseline = metrics.get("test/baseline_acc")
    if acc is None or answers is None or baseline is None:
        return False
    learned, _ = learned_test(round(float(acc) * float(answers)), int(answers), float(baseline))
    return learned


def _per_layer(records: list[dict], suffix: str) -> list[float]:
    layers: dict[int, list[float]] = {}
    for record in records:
        for key, value in record.get("metrics", {}).items():
            match = _LAYER_KEY.match(key)
            if match and match.group(2) == suffix and math.isfinite(float(value)):
                layers.setdefault(int(match.group(1)), []).append(float(value))
    return [float(np.mean(layers[i])) for i in sorted(layers)]


def _run_level(records: list[dict], name: str) -> list[float]:
    values = []
    for record in records:
        m = record.get("metrics", {})
        value = m.get(f"test/{name}", m.get(f"val/{name}"))
        if value is not None and math.isfinite(float(value)):
            values.append(float(value))
    return [float(np.mean(values))] if values else []


def _scheme_params(records: list[dict]) -> dict[str, list[float]]:
    """What the scheme reports of its own parameters ({"hnas_u": ..., "sink_b": ...}), per layer
    (its heads' mean), averaged over the runs; {} for schemes without parameters."""
    found: dict[str, dict[str, list[float]]] = {}
    for record in records:
        for key, layers in scheme_params(record).items():
            for layer, values in layers.items():
                found.setdefault(key, {}).setdefault(layer, []).append(float(np.mean(values)))
    order = lambda name: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
    return {key: [float(np.mean(layers[name])) for name in sorted(layers, key=order)]
            for key, layers in sorted(found.items())}


def diagnostics(records: list[dict]) -> dict[str, list[float]]:
    out = {name: _per_layer(records, suffix) for name, suffix in LAYER_DIAGNOSTICS.items()}
    out |= {name: _run_level(records, key) for name, key in RUN_DIAGNOSTICS.items()}
    return out | _scheme_params(records)


def build_cells(plan: ComparePlan, records: dict[Run, dict], lrs: dict) -> dict[CellKey, Cell]:
    cells: dict[CellKey, Cell] = {}
    finished: dict[CellKey, list[dict]] = {}
    for run, record in records.items():
        for key in plan.cells_of(run, lrs):  # a sweep point that is a control's: both cells
            cell = cells.setdefault(key, Cell(*key, lr=lrs[(key[0], key[2])].lr))
            if record.get("status") != "ok":
                cell.failed.append(f"seed {run.seed}: {record.get('error', record.get('status'))}")
                continue
            metrics = record.get("metrics", {})
            if ACC not in metrics:
                cell.failed.append(f"seed {run.seed}: no {ACC} in its metrics.json")
                continue
            for outcome in OUTCOMES:
                if outcome in metrics:
                    cell.values.setdefault(outcome, {})[run.seed] = float(metrics[outcome])
            cell.learned[run.seed] = run_learned(metrics)
            for name, target in (("test/baseline_acc", cell.baselines),
                                 ("test/shortcut_acc", cell.shortcuts)):
                if name in metrics:
                    target.append(float(metrics[name]))
            finished.setdefault(key, []).append(record)
    for key, cell in cells.items():
        cell.diagnostics = diagnostics(finished.get(key, []))
    return cells


# ----------------------------------------------------------------------------- contrasts
@dataclass(frozen=True)
class ContrastResult:
    probe: str
    condition: str
    spec: ContrastSpec
    outcome: str
    result: stats.Contrast

    @property
    def as_predicted(self) -> str:
        if self.result.verdict == stats.INCONCLUSIVE:
            return "—"
        return "yes" if self.result.verdict == self.spec.predicts else "no"


def _pairs(cells: dict, probe: str, condition: str, spec: ContrastSpec, outcome: str):
    a = cells.get((probe, condition, spec.scheme))
    b = cells.get((probe, condition, spec.against))
    if a is None or b is None:
        return None
    return a.values.get(outcome, {}), b.values.get(outcome, {})


def family(cells: dict, cards: list[ProbeCard], condition: str,
           outcomes: tuple[str, ...] = OUTCOMES) -> list[ContrastResult]:
    """The contrasts of `cards` in `condition` x outcomes, as one Holm family."""
    named, index = {}, {}
    for card in cards:
        for spec in card.contrasts:
            for outcome in outcomes:
                pairs = _pairs(cells, card.name, condition, spec, outcome)
                if pairs is None:
                    continue
                name = f"{card.name}|{spec.name}|{outcome}"
                named[name] = (*pairs, card.margin)
                index[name] = (card, spec, outcome)
    results = stats.contrast_family(named) if named else {}
    return [ContrastResult(index[n][0].name, condition, index[n][1], index[n][2], r)
            for n, r in results.items()]


def primary_family(cells: dict, cards: list[ProbeCard]) -> list[ContrastResult]:
    return family(cells, [c for c in cards if c.primary], MAIN)


def negative_controls(cells: dict, cards: list[ProbeCard]) -> list[ContrastResult]:
    """Each primary probe's contrasts in its negative control, on accuracy (one Holm family);
    what theory predicts there is a tie."""
    results = family(cells, [c for c in cards if c.primary and c.negative], NEGATIVE, (ACC,))
    return [dataclasses.replace(r, spec=dataclasses.replace(r.spec, predicts=stats.EQUIVALENT))
            for r in results]


def exploratory(cells: dict, plan: ComparePlan) -> list[ContrastResult]:
    """Every scheme against UNAS on the main setting of every probe, where it is not a primary
    contrast: intervals, no verdict (uncorrected: not a test)."""
    out = []
    for card in plan.probes():
        primary = {(s.scheme, s.against) for s in card.contrasts} if card.primary else set()
        for scheme in plan.schemes_for(card):
            if scheme == REFERENCE or (scheme, REFERENCE) in primary:
                continue
            spec = ContrastSpec(scheme, REFERENCE, "")
            pairs = _pairs(cells, card.name, MAIN, spec, ACC)
            if pairs is not None:
                result = stats.contrast(*pairs, margin=card.margin)
                out.append(ContrastResult(card.name, MAIN, spec, ACC, result))
    return out


# ----------------------------------------------------------------------------- controls
@dataclass(frozen=True)
class ProbeCheck:
    """Does a probe test its mechanism: the shortcut, the positive control, the negative one."""

    probe: str
    shortcut: float
    best: float  # the best scheme's mean accuracy on the main setting
    shortcut_reached: bool
    positive: str  # "breaks", "does not break", "not run", or why it cannot tell
    positive_detail: str
    negative: str  # "ties", "does not tie", "not run"
    tests_mechanism: bool

    @property
    def summary(self) -> str:
        if self.shortcut_reached:
            return (f"no: the shortcut ({self.shortcut:.3f}) reaches the best scheme "
                    f"({self.best:.3f})")
        if self.positive != "breaks":
            return f"no: the positive control {self.positive}"
        return "yes"


def _positive(card: ProbeCard, cells: dict) -> tuple[str, str]:
    control = card.positive
    if control is None:
        return "not defined", ""
    if control.expect == "fall":
        parts, falls = [], []
        ran = False
        for scheme in control.schemes:
            main, pos = cells.get((card.name, MAIN, scheme)), cells.get((card.name, POSITIVE, scheme))
            if main is None or pos is None or not pos.n or not main.n:
                continue
            ran = True
            s, m, c = main.shortcut, main.mean(), pos.mean()
            parts.append(f"{scheme} {m:.3f} -> {c:.3f} (shortcut {s:.3f})")
            if math.isfinite(s) and m > s + card.margin:  # only what beat the shortcut can fall
                falls.append(c <= s + 0.5 * (m - s))
        if not ran:
            return "not run", ""
        if not falls:
            return ("cannot tell (the schemes it ablates do not beat the shortcut on the main "
                    "setting)"), "; ".join(parts)
        return ("breaks" if all(falls) else "does not break"), "; ".join(parts)
    parts, vanish = [], []
    for spec in card.contrasts:
        main = _pairs(cells, card.name, MAIN, spec, ACC)
        pos = _pairs(cells, card.name, POSITIVE, spec, ACC)
        if main is None or pos is None:
            continue
        dm = stats.contrast(*main, margin=card.margin).difference
        dc = stats.contrast(*pos, margin=card.margin).difference
        if not (math.isfinite(dm) and math.isfinite(dc)) or abs(dm) < card.min_effect:
            continue
        # the advantage in the main setting's direction at least halves (a reversal breaks it too)
        vanish.append(dc * math.copysign(1.0, dm) <= 0.5 * abs(dm))
        parts.append(f"{spec.name} {dm:+.3f} -> {dc:+.3f}")
    if not vanish:
        return "cannot tell (no contrast differs by the minimum effect on the main setting)", ""
    return ("breaks" if all(vanish) else "does not break"), "; ".join(parts)


def probe_checks(cells: dict, plan: ComparePlan,
                 negatives: list[ContrastResult]) -> dict[str, ProbeCheck]:
    out = {}
    for card in plan.probes():
        schemes = plan.schemes_for(card)
        main = [cells[(card.name, MAIN, s)] for s in schemes if (card.name, MAIN, s) in cells]
        main = [c for c in main if c.n]
        if not main:
            continue
        best = max(c.mean() for c in main)
        shortcut = float(np.nanmean([c.shortcut for c in main])) if any(
            math.isfinite(c.shortcut) for c in main) else math.nan
        reached = math.isfinite(shortcut) and best <= shortcut + card.margin
        positive, detail = _positive(card, cells)
        mine = [r for r in negatives if r.probe == card.name]
        if not mine:
            negative = "not run" if card.negative else "not defined"
        else:
            verdicts = {r.result.verdict for r in mine}
            negative = ("ties" if verdicts == {stats.EQUIVALENT} else
                        "does not tie" if verdicts & {stats.BETTER, stats.WORSE} else
                        "inconclusive (not every contrast shown equivalent)")
        out[card.name] = ProbeCheck(card.name, shortcut, best, reached, positive, detail,
                                    negative, not reached and positive == "breaks")
    return out
