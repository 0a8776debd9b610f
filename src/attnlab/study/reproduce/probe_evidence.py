"""A claim judged on a probe, with compare's machinery (attnlab.study.compare): the probe's main
setting and its controls over seeds (SEEDS per mode, at the probe's own learning rate), its
cells, the claim's contrasts (Holm within the claim) and whether the probe tests its mechanism
(its shortcut, its positive control).

The verdict of a contrast with a predicted direction (`verdict`):
    the predicted direction, at Holm's level   holds, if the probe tests its mechanism (its
                                               shortcut is beaten and its positive control
                                               breaks it); else not tested: the diagnostic
    the opposite direction, or equivalent      contradicted, if the probe can tell the schemes
      (TOST) where a difference was predicted  apart (its shortcut does not reach them); else
                                               not tested: the diagnostic
    neither                                    not tested: underpowered, with the interval
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnlab.errors import ConfigError
from attnlab.study import stats
from attnlab.study.compare.analysis import (
    ACC,
    Cell,
    ContrastResult,
    ProbeCheck,
    build_cells,
    negative_controls,
    probe_checks,
)
from attnlab.study.compare.plan import ComparePlan, discover
from attnlab.study.compare.probes import MAIN, ContrastSpec, probe_cards
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED, Run

SEEDS = {"quick": 5, "full": 10, "gpu": 10}
TASK = "probe"


def compare_plan(plan, probe: str, schemes: tuple[str, ...]) -> ComparePlan | None:
    """The comparison a claim needs on `probe` (None: no such probe config)."""
    conf = plan.root / "conf"
    if not (conf / TASK / f"{probe}.yaml").is_file():
        return None
    try:
        cards = probe_cards(conf, [probe])
    except ConfigError:
        return None
    mode = plan.mode
    cp = ComparePlan(plan.root, mode, cards, discover(conf, "model"), list(schemes), SEEDS[mode],
                     lr_grid=False, extra=tuple(plan.overrides))
    cp.settings = dataclasses.replace(cp.settings, every_probe=True, sweep_seeds=0)
    return cp


def untrained(plan, probe: str) -> str:
    """Why a claim's probe has no evidence (evaluate returned None): the reason not tested."""
    why = plan.skip_reason(TASK) or f"no conf/probe/{probe}.yaml"
    return f"the {probe} probe was not trained: {why}"


def runs(plan, probe: str, schemes: tuple[str, ...]) -> list[Run]:
    cp = compare_plan(plan, probe, schemes)
    if cp is None or plan.skip_reason(TASK):
        return []
    lrs = cp.choose_lrs({})
    return cp.final_runs(lrs, cp.seeds_needed({}, lrs)[0])


@dataclass
class Evidence:
    probe: str
    cells: dict[tuple[str, str, str], Cell]
    contrasts: dict[str, stats.Contrast]  # by ContrastSpec.name, accuracy, Holm within the claim
    check: ProbeCheck | None
    negatives: list[ContrastResult]  # the probe's own contrasts on its negative control
    seeds: int

    def verdict(self, spec: ContrastSpec) -> tuple[str, str]:
        """(verdict, reason) of one contrast (see the module docstring)."""
        c = self.contrasts.get(spec.name)
        if c is None or c.n == 0:
            return NOT_TESTED, f"{self.probe}: {spec.name} has no finished pair of runs"
        if self.check is None:
            return NOT_TESTED, f"{self.probe}: no scheme finished its main setting"
        opposite = {"better": "worse", "worse": "better"}.get(spec.predicts)
        if c.verdict == spec.predicts:
            if not self.check.tests_mechanism:  # a win the mechanism may not explain
                return NOT_TESTED, f"mechanism not engaged on {self.probe}: {self.check.summary}"
            return HOLDS, ""
        if c.verdict == opposite or (opposite and c.verdict == stats.EQUIVALENT):
            if self.check.shortcut_reached:  # the probe could not tell the schemes apart
                return NOT_TESTED, f"mechanism not engaged on {self.probe}: {self.check.summary}"
            return CONTRADICTED, ""
        low, high = c.difference_interval
        underpowered = (f"underpowered: {spec.name} on {self.probe} differs by "
                        f"{c.difference:+.3f} [{low:+.3f}, {high:+.3f}] over {c.n} seeds")
        if not self.check.tests_mechanism:  # more seeds would not make it evidence either
            return NOT_TESTED, (f"mechanism not engaged on {self.probe}: {self.check.summary}; "
                                f"and {underpowered}")
        return NOT_TESTED, underpowered

    def text(self, spec: ContrastSpec) -> str:
        c = self.contrasts.get(spec.name)
        if c is None or c.n == 0:
            return f"{spec.name}: no result"
        low, high = c.difference_interval
        return (f"{spec.name} on {self.probe}: accuracy {c.scheme_mean:.3f} vs {c.baseline_mean:.3f}, "
                f"difference {c.difference:+.3f} [{low:+.3f}, {high:+.3f}], d_z "
                f"{c.effect_size:.2f}, {c.n} seeds: {c.verdict}")


def evaluate(plan, results, probe: str, specs: tuple[ContrastSpec, ...]) -> Evidence | None:
    """The evidence on `probe` for the claim's contrasts (None: the probe was not trained)."""
    schemes = tuple(dict.fromkeys(s for spec in specs for s in (spec.scheme, spec.against)))
    cp = compare_plan(plan, probe, schemes)
    if cp is None or plan.skip_reason(TASK):
        return None
    lrs = cp.choose_lrs({})
    cells = build_cells(cp, results.records, lrs)
    family = {}
    for spec in specs:
        a, b = cells.get((probe, MAIN, spec.scheme)), cells.get((probe, MAIN, spec.against))
        if a is not None and b is not None:
            card = cp.cards[probe]
            family[spec.name] = (a.values.get(ACC, {}), b.values.get(ACC, {}), card.margin)
    contrasts = stats.contrast_family(family) if family else {}
    negatives = negative_controls(cells, list(cp.cards.values()))
    checks = probe_checks(cells, cp, negatives)
    return Evidence(probe, cells, contrasts, checks.get(probe), negatives, cp.seeds or 0)


def cells_table(evidence: Evidence) -> list[str]:
    """Markdown: each condition x scheme of the probe (accuracy with its interval, k of n
    learned), then whether the probe tests its mechanism and its negative control."""
    lines = ["| condition | scheme | accuracy [95% CI] | learned (k of n) | shortcut | trivial baseline |",
             "|---|---|---|---|---|---|"]
    for (probe, condition, scheme), cell in sorted(evidence.cells.items()):
        low, high = cell.interval()
        lines.append(f"| {condition} | {scheme} | {cell.mean():.3f} [{low:.3f}, {high:.3f}] | "
                     f"{cell.learned_count} of {cell.n} | {cell.shortcut:.3f} | {cell.baseline:.3f} |")
    if evidence.check is not None:
        c = evidence.check
        lines += ["", f"- {evidence.probe} tests its mechanism: {c.summary}; positive control: "
                      f"{c.positive}" + (f" ({c.positive_detail})" if c.positive_detail else "")
                  + f"; negative control: {c.negative}"]
    lines += [f"- negative control, {r.spec.name}: {r.result.difference:+.3f} "
              f"[{r.result.difference_interval[0]:+.3f}, {r.result.difference_interval[1]:+.3f}]: "
              f"{r.result.verdict}" for r in evidence.negatives]
    return lines
