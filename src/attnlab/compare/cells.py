"""From the runs' metrics.json records to the cells of the comparison table (scheme x probe):
the metric's mean ± s.e. over seeds, whether the runs beat the trivial baseline, the paired
verdict against UNAS (Holm across every tested cell), and the diagnostics that explain it.

Which metric: the probe card's optimized metric on the test split (`val/acc` -> `test/acc`, the
best checkpoint's) and the card's baseline on the same split, where the runs logged both; else the
optimized metric itself and the card's baseline as named. A cell "did not learn" unless every one
of its finished runs beat the baseline (attnlab.comparison_stats.did_learn): such a cell is a
warning, not a result, and enters no verdict (nor does any scheme's cell on a probe where UNAS did
not learn: there is nothing to compare with).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from attnlab.cards import Card
from attnlab.compare.plan import BASELINE_SCHEME, Run
from attnlab.comparison_stats import Comparison, compare_cells, did_learn, mean_se

# the diagnostics per layer (ExplainedAway), by the name the report gives them
LAYER_DIAGNOSTICS = {"min col sum x S": "min_col_sum_times_S", "share < 1e-8": "share_below_1e-08",
                     "entropy (nats)": "entropy"}
HEAD_DIAGNOSTICS = {"head JSD": "avg_jsd", "head distance": "head_distance"}  # HeadDiversity
_LAYER_KEY = re.compile(r"^explained_away/layer(\d+)/(.+)$")


def test_twin(key: str | None) -> str | None:
    return None if key is None else re.sub(r"^val/", "test/", key)


@dataclass(frozen=True)
class Keys:
    metric: str
    baseline: str | None
    higher_is_better: bool


def keys_for(card: Card, records: list[dict]) -> Keys:
    """The metric and baseline keys the cells use (see the module docstring)."""
    ok = [r for r in records if r.get("status") == "ok"]
    logged = set.intersection(*(set(r.get("metrics", {})) for r in ok)) if ok else set()
    metric, baseline = card.optimized_metric, card.baseline
    twin, twin_baseline = test_twin(metric), test_twin(baseline)
    if twin in logged and (baseline is None or twin_baseline in logged):
        metric, baseline = twin, twin_baseline
    return Keys(metric, baseline, card.monitor_mode != "min")


@dataclass
class Cell:
    probe: str
    scheme: str
    values: dict[int, float] = field(default_factory=dict)  # metric by seed (finished runs)
    baselines: dict[int, float] = field(default_factory=dict)  # the trivial baseline by seed
    failed: list[str] = field(default_factory=list)  # the errors of runs that did not finish
    diagnostics: dict[str, list[float]] = field(default_factory=dict)  # name -> per layer (mean)
    learned_seeds: int = 0
    comparison: Comparison | None = None  # against UNAS (None: not tested)
    untested_reason: str = ""

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean_se(self) -> tuple[float, float]:
        return mean_se(list(self.values.values())) if self.values else (math.nan, math.nan)

    @property
    def baseline(self) -> float:
        return float(np.mean(list(self.baselines.values()))) if self.baselines else math.nan

    @property
    def learned(self) -> bool:
        """Every finished run beat its baseline (and there is at least one)."""
        return self.n > 0 and self.learned_seeds == self.n


def _per_layer(records: list[dict], suffix: str) -> list[float]:
    """The per-layer mean over runs of explained_away/layer{l}/<suffix>."""
    layers: dict[int, list[float]] = {}
    for record in records:
        for key, value in record.get("metrics", {}).items():
            match = _LAYER_KEY.match(key)
            if match and match.group(2) == suffix and math.isfinite(float(value)):
                layers.setdefault(int(match.group(1)), []).append(float(value))
    return [float(np.mean(layers[i])) for i in sorted(layers)]


def _head(records: list[dict], name: str) -> list[float]:
    values = []
    for record in records:
        m = record.get("metrics", {})
        value = m.get(f"test/{name}", m.get(f"val/{name}"))
        if value is not None and math.isfinite(float(value)):
            values.append(float(value))
    return [float(np.mean(values))] if values else []


def _hnas_u(records: list[dict]) -> list[float]:
    """HNAS u per layer (its heads' mean), averaged over the runs; [] for other schemes."""
    layers: dict[str, list[float]] = {}
    for record in records:
        for layer, u in (record.get("hnas_u") or {}).items():
            layers.setdefault(layer, []).append(float(np.mean(u)))
    # in layer order: "layers.10..." after "layers.2..."
    order = sorted(layers, key=lambda name: [int(t) if t.isdigit() else t
                                             for t in re.split(r"(\d+)", name)])
    return [float(np.mean(layers[name])) for name in order]


def diagnostics(records: list[dict]) -> dict[str, list[float]]:
    out = {name: _per_layer(records, suffix) for name, suffix in LAYER_DIAGNOSTICS.items()}
    out |= {name: _head(records, key) for name, key in HEAD_DIAGNOSTICS.items()}
    out["HNAS u"] = _hnas_u(records)
    return out


def build_cells(records: dict[Run, dict], keys: Keys,
                alpha: float = 0.05) -> dict[tuple[str, str], Cell]:
    """{(probe, scheme): Cell}, each scheme's verdict against UNAS on the same probe."""
    cells: dict[tuple[str, str], Cell] = {}
    finished: dict[tuple[str, str], list[dict]] = {}
    for run, record in records.items():
        cell = cells.setdefault((run.probe, run.model), Cell(run.probe, run.model))
        if record.get("status") != "ok":
            cell.failed.append(str(record.get("error", record.get("status", "failed"))))
            continue
        metrics = record.get("metrics", {})
        value = float(metrics.get(keys.metric, math.nan))
        if not math.isfinite(value):
            cell.failed.append(f"no {keys.metric} in its metrics.json")
            continue
        cell.values[run.seed] = value
        base = float(metrics.get(keys.baseline, math.nan)) if keys.baseline else math.nan
        if keys.baseline:
            cell.baselines[run.seed] = base
        # a task without a baseline key: every finished run counts as learned
        cell.learned_seeds += did_learn(value, base, keys.higher_is_better) if keys.baseline else 1
        finished.setdefault((run.probe, run.model), []).append(record)
    for key, cell in cells.items():
        cell.diagnostics = diagnostics(finished.get(key, []))
    verdicts(cells, keys.higher_is_better, alpha)
    return cells


def verdicts(cells: dict[tuple[str, str], Cell], higher_is_better: bool, alpha: float) -> None:
    """Each learned scheme cell against the learned UNAS cell of its probe, paired by seed, the
    verdicts from Holm-adjusted p-values across every tested cell."""
    tested = {}
    for (probe, scheme), cell in cells.items():
        base = cells.get((probe, BASELINE_SCHEME))
        if scheme == BASELINE_SCHEME:
            cell.untested_reason = "the reference"
        elif base is None or base.n == 0:
            cell.untested_reason = "no UNAS runs on this probe"
        elif not cell.learned:
            cell.untested_reason = "did not learn"
        elif not base.learned:
            cell.untested_reason = "UNAS did not learn"
        else:
            tested[f"{probe}|{scheme}"] = (cell.values, base.values)
    for name, comparison in compare_cells(tested, alpha, higher_is_better).items():
        probe, scheme = name.split("|")
        cells[(probe, scheme)].comparison = comparison
