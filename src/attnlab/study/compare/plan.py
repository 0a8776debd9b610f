"""What a comparison trains, stage by stage (docs/compare.md):

1. learning rates: each (probe, scheme) on the probe's main setting at the probe's learning rate
   x LR_FACTORS, `lr_seeds` seeds each; the best by mean validation accuracy is that scheme's
   rate on that probe from then on (so no scheme loses to a learning rate), the spread reported;
2. pilot: the main setting's cells at their rates with seeds 1..`pilot_seeds`: the spread of each
   primary contrast's paired differences gives the seeds it needs for 80 % power at the probe's
   `min_effect` (attnlab.study.power.seeds_for_power, at the family's Bonferroni level); a cell
   runs at most `max_seeds` (the report gives the power at what ran);
3. the rest: the main cells topped up to their seeds, the controls at `control_seeds`, the
   difficulty sweeps (--full) at `sweep_seeds`.

A run is `Run("probe", scheme, seed, extra)`, its extra overrides naming the probe, the mode's
and the condition's overrides and the learning rate, so a run of one stage that another needs
(the pilot's seeds at the chosen rate are the lr stage's) is trained once. `--seeds N` fixes the
seeds of every cell (no pilot, no power computation); `--no-lr-grid` keeps each probe's rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from attnlab.study.compare.probes import MAIN, Condition, ProbeCard
from attnlab.study.evidence import Run
from attnlab.study.power import seeds_for_power

MODES = ("quick", "full", "gpu")
TASK = "probe"  # the task whose configs the probes select (conf/task/probe.yaml)
REFERENCE = "unas"  # softmax attention: every scheme of an exploratory probe is set against it
LR_FACTORS = (1 / 3, 1.0, 3.0)  # the grid, around each probe's own rate
SD_FLOOR = 0.01  # a pilot's spread below this (e.g. every seed at 1.000) counts as this much
MAX_NEEDED = 200  # the seed counts the power computation reports beyond a mode's cap
POWER = 0.8
ALPHA = 0.05
# the outcomes of every run: final test accuracy (the best checkpoint's) and the area under the
# validation learning curve (co-primary)
OUTCOMES = ("test/acc", "val/acc_auc")

# Every comparison run: CSV metrics only (no W&B run per job), no progress bar in the logs
# (Lightning adds its own unless told not to); the analyses are the probe task's own choice.
COMMON = ("logger=csv", "~callbacks.progress_bar", "trainer.enable_progress_bar=false")


@dataclass(frozen=True)
class Settings:
    every_probe: bool  # exploratory probes too (quick: the primary family only)
    every_scheme: bool  # every registered scheme on every probe (quick: each probe's own)
    lr_seeds: int
    pilot_seeds: int
    max_seeds: int
    control_seeds: int
    sweep_seeds: int  # 0: no difficulty sweeps


SETTINGS = {
    "quick": Settings(False, False, lr_seeds=1, pilot_seeds=3, max_seeds=8, control_seeds=3,
                      sweep_seeds=0),
    "full": Settings(True, True, lr_seeds=2, pilot_seeds=3, max_seeds=20, control_seeds=10,
                     sweep_seeds=5),
    "gpu": Settings(True, True, lr_seeds=2, pilot_seeds=3, max_seeds=20, control_seeds=10,
                    sweep_seeds=5),
}


def discover(conf_dir: Path, group: str) -> list[str]:
    """The choices of a config group: the stems of conf/<group>/*.yaml, in name order."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def lr_text(lr: float) -> str:
    return f"{lr:.3g}"


CellKey = tuple[str, str, str]  # (probe, condition, scheme)


@dataclass
class ComparePlan:
    root: Path
    mode: str
    cards: dict[str, ProbeCard]
    registered: list[str]  # every model= choice
    schemes: list[str] | None = None  # --schemes
    seeds: int | None = None  # --seeds: fixed seeds, no pilot
    lr_grid: bool = True
    extra: tuple[str, ...] = ()  # --override
    settings: Settings = field(init=False)

    def __post_init__(self) -> None:
        self.settings = SETTINGS[self.mode]

    # ----------------------------------------------------------------- what runs where
    def probes(self) -> list[ProbeCard]:
        return [c for c in self.cards.values() if c.primary or self.settings.every_probe]

    def schemes_for(self, card: ProbeCard) -> list[str]:
        """UNAS first (always there: what exploratory cells are set against), then the card's
        schemes (--full: every scheme) that --schemes keeps. A contrast whose two schemes are
        not both there is left out."""
        chosen = list(self.registered if self.settings.every_scheme or not card.schemes
                      else card.schemes)
        if self.schemes is not None:
            chosen = [s for s in chosen if s in self.schemes]
        # the probes' attention is not causal: a causal-only scheme (stick-breaking) cannot run
        from attnlab.attention.schemes import fitting, names

        fits = fitting(causal=False)
        chosen = [s for s in chosen if s in fits or s not in names()]
        return [REFERENCE] + [s for s in chosen if s != REFERENCE]

    def conditions(self, card: ProbeCard) -> list[Condition]:
        return card.conditions(controls=True, sweep=self.settings.sweep_seeds > 0,
                               main=self.main_setting(card))

    def main_setting(self, card: ProbeCard) -> dict[str, object]:
        """The main setting's value of each swept key: the probe's config's, or the mode's
        override of it (--gpu's sizes)."""
        main = dict(card.main)
        for override in self.mode_overrides(card):
            key, _, value = override.partition("=")
            if key in main:
                main[key] = yaml.safe_load(value)
        return main

    def mode_overrides(self, card: ProbeCard) -> list[str]:
        mode = ["hardware=gpu"] if self.mode == "gpu" else []
        return mode + list(card.mode_overrides.get(self.mode, ()))

    def run(self, card: ProbeCard, condition: Condition, scheme: str, seed: int, lr: float) -> Run:
        extra = (f"probe={card.name}", *self.mode_overrides(card), *condition.overrides,
                 f"task.module.optimizer.lr={lr_text(lr)}", *self.extra)
        return Run(TASK, scheme, seed, extra)

    # ----------------------------------------------------------------- stage 1: rates
    def lr_candidates(self, card: ProbeCard) -> list[float]:
        return [card.lr * f for f in LR_FACTORS] if self.lr_grid else [card.lr]

    def lr_runs(self) -> list[Run]:
        seeds = range(1, (self.settings.lr_seeds if self.lr_grid else 0) + 1)
        return [self.run(card, Condition(MAIN), scheme, seed, lr) for card in self.probes()
                for scheme in self.schemes_for(card) for lr in self.lr_candidates(card)
                for seed in seeds] if self.lr_grid else []

    def choose_lrs(self, records: dict[Run, dict]) -> dict[tuple[str, str], LrChoice]:
        """Per (probe, scheme): the rate with the best mean validation accuracy (its run's best
        checkpoint) over the lr stage's seeds; the probe's own rate without a grid."""
        out = {}
        for card in self.probes():
            for scheme in self.schemes_for(card):
                means = {}
                for lr in self.lr_candidates(card):
                    values = [float(r["optimized_value"]) for seed in
                              range(1, self.settings.lr_seeds + 1)
                              if (r := records.get(self.run(card, Condition(MAIN), scheme, seed, lr)))
                              and r.get("status") == "ok" and r.get("optimized_value") is not None]
                    means[lr] = float(np.mean(values)) if values else math.nan
                finite = {lr: m for lr, m in means.items() if math.isfinite(m)}
                best = max(finite, key=lambda lr: (finite[lr], lr == card.lr)) if finite else card.lr
                out[(card.name, scheme)] = LrChoice(best, means)
        return out

    # ----------------------------------------------------------------- stage 2: pilot
    def main_runs(self, lrs: dict, seeds: dict[CellKey, int] | int) -> list[Run]:
        runs = []
        for card in self.probes():
            for scheme in self.schemes_for(card):
                n = seeds if isinstance(seeds, int) else seeds.get((card.name, MAIN, scheme), 0)
                lr = lrs[(card.name, scheme)].lr
                runs += [self.run(card, Condition(MAIN), scheme, s, lr) for s in range(1, n + 1)]
        return runs

    def pilot_seeds(self) -> int:
        return self.seeds or self.settings.pilot_seeds

    def contrasts(self, card: ProbeCard) -> list:
        """The card's contrasts whose two schemes both run (--schemes may leave one out)."""
        schemes = self.schemes_for(card)
        return [c for c in card.contrasts if c.scheme in schemes and c.against in schemes]

    def family_size(self) -> int:
        """The primary family's tests: the contrasts that run x the outcomes."""
        return sum(len(self.contrasts(c)) for c in self.probes() if c.primary) * len(OUTCOMES)

    def seeds_needed(self, records: dict[Run, dict], lrs: dict) -> tuple[dict[CellKey, int], list[Power]]:
        """The seeds of each main cell (the most any of its contrasts needs) and, per primary
        contrast and outcome, the computation (printed and reported)."""
        cells: dict[CellKey, int] = {}
        rows = []
        alpha = ALPHA / max(1, self.family_size())
        for card in self.probes():
            schemes = self.schemes_for(card)
            for scheme in schemes:
                cells[(card.name, MAIN, scheme)] = self.seeds or self.settings.pilot_seeds
            if self.seeds or not card.primary:
                continue
            for spec in self.contrasts(card):
                needed = self.settings.pilot_seeds
                for outcome in OUTCOMES:
                    d = []
                    for seed in range(1, self.settings.pilot_seeds + 1):
                        a = _value(records.get(self.run(card, Condition(MAIN), spec.scheme, seed,
                                                        lrs[(card.name, spec.scheme)].lr)), outcome)
                        b = _value(records.get(self.run(card, Condition(MAIN), spec.against, seed,
                                                        lrs[(card.name, spec.against)].lr)), outcome)
                        if math.isfinite(a) and math.isfinite(b):
                            d.append(a - b)
                    sd = float(np.std(d, ddof=1)) if len(d) > 1 else math.nan
                    used = max(sd, SD_FLOOR) if math.isfinite(sd) else math.nan
                    # what 80 % power needs (up to MAX_NEEDED: more is reported as that), and
                    # what this mode runs: at most its cap
                    n = (seeds_for_power(card.min_effect, used, alpha, POWER, minimum=2,
                                         maximum=MAX_NEEDED)
                         if math.isfinite(used) else MAX_NEEDED)
                    rows.append(Power(card.name, spec.name, outcome, len(d), sd, used,
                                      card.min_effect, alpha, n))
                    needed = max(needed, min(n, self.settings.max_seeds))
                for scheme in (spec.scheme, spec.against):
                    key = (card.name, MAIN, scheme)
                    cells[key] = max(cells[key], needed)
        return cells, rows

    # ----------------------------------------------------------------- stage 3: the rest
    def final_runs(self, lrs: dict, seeds: dict[CellKey, int]) -> list[Run]:
        runs = self.main_runs(lrs, seeds)
        for card in self.probes():
            for condition in self.conditions(card)[1:]:
                control = not condition.name.startswith("sweep")
                n = self.seeds or (self.settings.control_seeds if control
                                   else self.settings.sweep_seeds)
                for scheme in self.schemes_for(card):
                    lr = lrs[(card.name, scheme)].lr
                    runs += [self.run(card, condition, scheme, s, lr) for s in range(1, n + 1)]
        return runs

    def cells_of(self, run: Run, lrs: dict) -> list[CellKey]:
        """Every cell a run belongs to: one, or more where two conditions are one setting (a
        sweep point that is a control's); none for a run of the lr stage at a rate not chosen."""
        out = []
        for card in self.probes():
            if f"probe={card.name}" not in run.extra:
                continue
            lr = lrs.get((card.name, run.model))
            for condition in self.conditions(card):
                if lr is not None and run == self.run(card, condition, run.model, run.seed, lr.lr):
                    out.append((card.name, condition.name, run.model))
        return out

    def cell_of(self, run: Run, lrs: dict) -> CellKey | None:
        """The (first) cell a run belongs to (None: a run of the lr stage at a rate not
        chosen)."""
        cells = self.cells_of(run, lrs)
        return cells[0] if cells else None


@dataclass(frozen=True)
class LrChoice:
    lr: float
    means: dict[float, float]  # mean validation accuracy per rate tried


@dataclass(frozen=True)
class Power:
    """One primary contrast's seed count: the pilot's spread of the paired differences of an
    outcome, the effect to detect, the (Bonferroni) level, the seeds for 80 % power (MAX_NEEDED
    where the spread is unknown or the need larger; a cell runs at most the mode's cap)."""

    probe: str
    contrast: str
    outcome: str
    pilot_pairs: int
    pilot_sd: float
    sd_used: float
    effect: float
    alpha: float
    seeds: int


def _value(record: dict | None, key: str) -> float:
    if not record or record.get("status") != "ok":
        return math.nan
    value = record.get("metrics", {}).get(key)
    return math.nan if value is None else float(value)
