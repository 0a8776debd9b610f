"""`python -m attnlab.compare --stability`: which learning rates a scheme tolerates, measured as
Wortsman et al. measure it ("Small-scale proxies for large-scale Transformer training
instabilities", ICLR 2024, section 3.1). docs/compare.md has the protocol in prose.

Every arm (a scheme and its overrides) trains the causal LM (`task=lm`, the size of its card's
`reproduce.quick`: 2 layers of 64) at each rate of a log-spaced grid, once per seed. Each run
records its final validation loss and, through the StabilityMonitor callback, its loss at
initialization, loss spikes and divergence (metrics.json `stability`). Per (arm, seed):

    LR sensitivity = mean over the grid of  min(loss(lr), l_0) - l*

with loss(lr) the final validation loss at rate lr (a diverged run: l_0), l_0 the loss at
initialization and l* the best of min(loss(lr), l_0) over the grid: 0 when every rate reaches the
best loss, large when most rates do little better than the untrained model. Lower is better.

The pre-registered family (fixed here, before any run): the head-wise output gate against none,
sigmoid against UNAS and softpick against UNAS, each predicted LOWER in LR sensitivity than UNAS
(the gated-attention, sigmoid-attention and softpick papers each report training that tolerates
larger rates). Paired by seed; a paired t-test per contrast, Holm across the three; TOST within
the margin for "equivalent"; each with its 95 % interval, Cohen's d_z and the seeds 80 % power
needs at MIN_EFFECT (from this run's spread). `--schemes` adds exploratory arms against UNAS,
Holm-corrected as a family of their own.

The comparison only tests stability if the grid reaches rates where softmax attention is
unstable: when no UNAS run of the grid spikes (a loss above 2x the median of the last 50) or
diverges, every verdict is "mechanism not engaged", whatever the statistics. An arm that beats
the unigram baseline (the task card's `val/baseline_ppl`) at no rate in a seed did not learn:
that seed leaves its contrasts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from attnlab.cards import task_cards
from attnlab.study import stats
from attnlab.study.evidence import Arm, Run
from attnlab.study.power import seeds_for_power

TASK = "lm"
RATE = "task.module.optimizer.lr"
LOSS = "val/loss"
BASELINE = "val/baseline_ppl"
ALPHA, POWER = 0.05, 0.8
MARGIN = 0.05  # nats: LR sensitivities this close are the same (TOST)
MIN_EFFECT = 0.05  # nats: the difference the seeds are planned for
SD_FLOOR = 0.01  # a spread of paired differences below this counts as this much
MAX_NEEDED = 200
PREDICTED = "lower"
NOT_ENGAGED = "mechanism not engaged"
DID_NOT_LEARN = "did not learn"
VERDICT_WORDS = {stats.BETTER: "lower (as predicted)", stats.WORSE: "higher (against the prediction)",
                 stats.EQUIVALENT: "equivalent", stats.INCONCLUSIVE: "inconclusive"}


@dataclass(frozen=True)
class Mode:
    rates: tuple[float, ...]  # the learning-rate grid, log-spaced
    seeds: int
    steps: int  # training steps of every run


def log_grid(low: float, high: float, count: int) -> tuple[float, ...]:
    """`count` rates from `low` to `high`, evenly spaced in log10, rounded to 3 significant
    digits (so they read back as written)."""
    return tuple(float(f"{x:.3g}") for x in np.logspace(math.log10(low), math.log10(high), count))


# quick: three decades in 7 rates, 3 seeds, 120 steps (~20 s a run; the tiny LM's softmax
# spikes at 1.0); full: four decades in 9, 5 seeds, 500 steps; gpu: as full
MODES = {"quick": Mode(log_grid(1e-3, 1.0, 7), 3, 120),
         "full": Mode(log_grid(1e-4, 1.0, 9), 5, 500),
         "gpu": Mode(log_grid(1e-4, 1.0, 9), 5, 500)}


UNAS = Arm("unas")
GATE = Arm("unas", ("model.gate=headwise",))
GATE_LABEL = GATE.label
REGISTERED = (GATE, Arm("sigmoid"), Arm("softpick"))
# what every run gets beyond the card's quick size: no test split and none of the end-of-run
# analyses (the validation loss is the result), the stability monitor on
RUN_EXTRA = ("test=false", "++callbacks.diagnostics=null", "++callbacks.head_diversity=null",
             "++callbacks.explained_away=null", "++callbacks.head_importance=null",
             "++callbacks.calibration=null")


@dataclass
class StabilityPlan:
    mode: str
    size: tuple[str, ...]  # the task card's quick overrides: the model's size
    rates: tuple[float, ...]
    seeds: int
    steps: int
    exploratory: tuple[Arm, ...] = ()

    @classmethod
    def build(cls, root: Path, mode: str, seeds: int | None = None,
              schemes: list[str] | None = None) -> StabilityPlan:
        card = task_cards(root / "conf")[TASK]
        m = MODES[mode]
        extra = tuple(Arm(s) for s in schemes or () if Arm(s) not in (UNAS, *REGISTERED))
        check_causal(root, [a.model for a in extra])
        size = tuple(o for o in card.quick or () if o.split("=", 1)[0].lstrip("+") != RATE)  # the grid sets it
        return cls(mode, size, m.rates, seeds or m.seeds, m.steps, extra)

    @property
    def arms(self) -> list[Arm]:
        return [UNAS, *REGISTERED, *self.exploratory]

    def run(self, arm: Arm, rate: float, seed: int) -> Run:
        hardware = ("hardware=gpu",) if self.mode == "gpu" else ()
        return Run(TASK, arm.model, seed, (*self.size, f"++trainer.limit_train_batches={self.steps}",
                                           *RUN_EXTRA, *hardware, *arm.overrides,
                                           f"{RATE}={rate}"))

    def runs(self) -> list[Run]:
        return [self.run(arm, rate, seed) for rate in self.rates for arm in self.arms
                for seed in range(1, self.seeds + 1)]


def check_causal(root: Path, models: list[str]) -> None:
    """A ConfigError (the runner's own line) for a --schemes model that cannot attend causally,
    before any run: task=lm is a causal LM."""
    if not models:
        return
    from hydra import compose, initialize_config_dir

    from attnlab.runner import check_scheme_fits_task

    with initialize_config_dir(str((root / "conf").resolve()), version_base="1.3"):
        for model in models:
            check_scheme_fits_task(compose("train", overrides=[f"task={TASK}", f"model={model}", "logger=none"]))


# ----------------------------------------------------------------------------- measurements
@dataclass(frozen=True)
class Outcome:
    """One run: its final validation loss (inf: diverged or missing), loss at initialization,
    spikes, divergence, and the unigram baseline's loss."""

    loss: float
    initial: float
    spikes: int
    diverged: bool
    baseline: float
    error: str | None = None


def outcome(record: Mapping | None) -> Outcome:
    if record is None or record.get("status") != "ok":
        why = "not run" if record is None else record.get("error") or record.get("status", "failed")
        return Outcome(math.inf, math.nan, 0, False, math.nan, str(why))
    metrics, stability = record.get("metrics", {}), record.get("stability") or {}
    diverged = bool(stability.get("diverged"))
    loss = float(metrics.get(LOSS, math.inf))
    initial = stability.get("initial_loss")
    return Outcome(math.inf if diverged or not math.isfinite(loss) else loss,
                   math.nan if initial is None else float(initial), int(stability.get("loss_spikes", 0)),
                   diverged, math.log(float(metrics[BASELINE])) if BASELINE in metrics else math.nan)


def lr_sensitivity(losses: list[float], initial: float) -> float:
    """Wortsman et al.'s LR sensitivity over one grid (module docstring): the mean of
    min(loss, l_0) - l*, a diverged or non-finite loss counting as l_0."""
    capped = [min(x, initial) if math.isfinite(x) else initial for x in losses]
    best = min(capped)
    return float(np.mean([x - best for x in capped]))


@dataclass
class ArmSeed:
    arm: str
    seed: int
    losses: list[float]  # per rate, as `Outcome.loss`
    initial: float  # l_0: the median of the runs' losses at initialization
    sensitivity: float  # NaN when a run is missing or the arm did not learn in this seed
    learned: bool
    spikes: int  # over the grid
    diverged: int  # runs of the grid that diverged
    why: str | None = None


def measure(plan: StabilityPlan, records: Mapping[Run, dict]) -> dict[str, dict[int, ArmSeed]]:
    """{arm label: {seed: ArmSeed}} from the runs' records."""
    found: dict[str, dict[int, ArmSeed]] = {}
    for arm in plan.arms:
        for seed in range(1, plan.seeds + 1):
            outs = [outcome(records.get(plan.run(arm, rate, seed))) for rate in plan.rates]
            missing = [f"lr={r}: {o.error}" for r, o in zip(plan.rates, outs) if o.error]
            initials = [o.initial for o in outs if math.isfinite(o.initial)]
            initial = float(np.median(initials)) if initials else math.nan
            baseline = next((o.baseline for o in outs if math.isfinite(o.baseline)), math.nan)
            learned = any(o.loss < baseline for o in outs)
            why = ("; ".join(missing) if missing else
                   None if learned else f"{DID_NOT_LEARN} (no rate beat the unigram loss {baseline:.3f})")
            value = lr_sensitivity([o.loss for o in outs], initial) if why is None and math.isfinite(initial) else math.nan
            found.setdefault(arm.label, {})[seed] = ArmSeed(
                arm.label, seed, [o.loss for o in outs], initial, value, learned,
                sum(o.spikes for o in outs), sum(o.diverged for o in outs), why)
    return found


def engaged(found: Mapping[str, Mapping[int, ArmSeed]]) -> tuple[bool, str]:
    """Whether some UNAS run of the grid spiked or diverged, and the count in words."""
    seeds = found.get(UNAS.label, {}).values()
    spikes, diverged = sum(s.spikes for s in seeds), sum(s.diverged for s in seeds)
    return spikes + diverged > 0, f"UNAS over the grid: {spikes} loss spike(s), {diverged} diverged run(s)"


# ----------------------------------------------------------------------------- verdicts
@dataclass
class Judged:
    name: str
    contrast: stats.Contrast
    verdict: str
    seeds_needed: int | None  # for 80 % power at MIN_EFFECT (None: fewer than 2 pairs)
    family: str  # "pre-registered" | "exploratory"


def sensitivities(found, arm: Arm) -> dict[int, float]:
    return {s: a.sensitivity for s, a in found.get(arm.label, {}).items() if math.isfinite(a.sensitivity)}


def judge(plan: StabilityPlan, found) -> list[Judged]:
    """Each family's contrasts against UNAS, Holm within the family; every verdict "mechanism not
    engaged" when UNAS never spiked or diverged."""
    on, _ = engaged(found)
    base = sensitivities(found, UNAS)
    out = []
    for family, arms in (("pre-registered", REGISTERED), ("exploratory", plan.exploratory)):
        cells = {f"{a.label} vs unas": (sensitivities(found, a), base, MARGIN) for a in arms}
        if not cells:
            continue
        results = stats.contrast_family(cells, ALPHA, higher_is_better=False)
        for name, c in results.items():
            needed = None
            if c.n >= 2:
                sd = max(float(np.std(np.subtract(*stats.pair(*cells[name][:2])[:2]), ddof=1)), SD_FLOOR)
                needed = seeds_for_power(MIN_EFFECT, sd, ALPHA / len(cells), POWER, maximum=MAX_NEEDED)
            verdict = (NOT_ENGAGED if not on else "not tested: fewer than 2 seeds where both learned"
                       if c.n < 2 else VERDICT_WORDS[c.verdict])
            out.append(Judged(name, c, verdict, needed, family))
    return out


# ----------------------------------------------------------------------------- report
def _f(x: float, spec: str = ".3f") -> str:
    return format(x, spec) if x is not None and math.isfinite(x) else "—"


def grid_table(plan: StabilityPlan, found) -> list[str]:
    """Markdown: per arm, the mean final validation loss at every rate ("div" where a seed
    diverged), then the LR sensitivity with its 95 % interval."""
    head = "| arm | " + " | ".join(f"lr={r:g}" for r in plan.rates) + " | spikes | diverged | LR sensitivity [95% CI] (seeds) |"
    lines = [head, "|---|" + "---|" * (len(plan.rates) + 3)]
    for arm in plan.arms:
        seeds = list(found.get(arm.label, {}).values())
        cells = []
        for i in range(len(plan.rates)):
            xs = [s.losses[i] for s in seeds]
            finite = [x for x in xs if math.isfinite(x)]
            cells.append(_f(float(np.mean(finite))) + (f" ({len(xs) - len(finite)} div)" if len(finite) < len(xs) else "")
                         if finite else "div")
        values = [s.sensitivity for s in seeds if math.isfinite(s.sensitivity)]
        low, high = stats.t_interval(values) if len(values) > 1 else (math.nan, math.nan)
        sens = f"{_f(float(np.mean(values)))} [{_f(low)}, {_f(high)}] ({len(values)})" if values else "—"
        not_learned = sum(not s.learned for s in seeds)
        if not_learned:
            sens += f"; {not_learned} seed(s) {DID_NOT_LEARN}"
        lines.append(f"| {arm.label} | " + " | ".join(cells) +
                     f" | {sum(s.spikes for s in seeds)} | {sum(s.diverged for s in seeds)} | {sens} |")
    return lines


def contrast_table(judged: list[Judged]) -> list[str]:
    lines = ["| contrast (LR sensitivity, nats) | family | seeds | difference [95% CI] | d_z | p (Holm) | verdict | seeds for 80% power |",
             "|---|---|---|---|---|---|---|---|"]
    for j in judged:
        c = j.contrast
        low, high = c.difference_interval
        need = "—" if j.seeds_needed is None else f"{'>= ' if j.seeds_needed >= MAX_NEEDED else ''}{j.seeds_needed}"
        lines.append(f"| {j.name} | {j.family} | {c.n} | {_f(c.difference, '+.3f')} [{_f(low, '+.3f')}, "
                     f"{_f(high, '+.3f')}] | {_f(c.effect_size, '+.2f')} | {_f(c.p_adjusted, '.3g')} | "
                     f"{j.verdict} | {need} |")
    return lines


def figure(plan: StabilityPlan, found, path: Path) -> Path:
    """Final validation loss against the learning rate, one line per arm (mean over seeds; a
    diverged run drawn at l_0), the loss at initialization dashed: Wortsman et al.'s figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.figures import save_png

    fig, ax = plt.subplots(figsize=(5.5, 3.6), constrained_layout=True)
    initials = []
    for arm in plan.arms:
        seeds = list(found.get(arm.label, {}).values())
        if not seeds:
            continue
        rows = [[min(x, s.initial) if math.isfinite(x) else s.initial for x in s.losses] for s in seeds]
        initials += [s.initial for s in seeds]
        ax.plot(plan.rates, np.nanmean(np.array(rows, dtype=float), axis=0), marker="o", label=arm.label)
    finite = [x for x in initials if math.isfinite(x)]
    if finite:
        ax.axhline(float(np.median(finite)), color="grey", ls="--", lw=1, label="loss at initialization")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final validation loss (nats)")
    ax.legend(fontsize=7)
    return save_png(fig, path)


def write_report(out_dir: Path, plan: StabilityPlan, found, judged: list[Judged], meta: Mapping) -> Path:
    on, counts = engaged(found)
    session = (f"`{meta['command']}` ({meta['mode']}), commit {meta['commit']}, {meta['machine']}, "
               f"{meta['wall_s'] / 60:.1f} min, {meta['trained']} run(s) trained, {meta['reused']} reused.")
    rates = ", ".join(f"{r:g}" for r in plan.rates)
    how = (f"task={TASK} at its card's quick size ({' '.join(plan.size)}), {plan.steps} steps, rates "
           f"{rates}, seeds 1-{plan.seeds}. LR sensitivity (Wortsman et al., ICLR 2024): the mean over "
           f"the grid of min(final val loss, l_0) - l*, l_0 the loss at initialization, l* the best over "
           f"the grid; lower is better. Pre-registered: each of {', '.join(a.label for a in REGISTERED)} "
           f"has a {PREDICTED} LR sensitivity than UNAS; paired by seed, Holm across the family, "
           f"equivalence margin {MARGIN} nats (TOST), power planned at {MIN_EFFECT} nats.")
    gate = (f"Mechanism engaged: {counts}." if on else
            f"**{NOT_ENGAGED}**: {counts}; no rate of the grid made softmax attention unstable, so "
            "no verdict here is about stability. Extend the grid (--full) or the model.")
    lines = ["# Learning-rate stability", "", session, "", how, "", gate, "",
             "## Final validation loss per rate (mean over seeds) and LR sensitivity", "",
             *grid_table(plan, found), "", "## Contrasts", "", *contrast_table(judged), ""]
    png = figure(plan, found, out_dir / "lr_sensitivity.png")
    lines += [f"![loss against learning rate]({png.name})", ""]
    path = out_dir / "STABILITY.md"
    path.write_text("\n".join(lines))
    (out_dir / "stability.json").write_text(json.dumps(_finite({
        "engaged": on, "counts": counts, "rates": list(plan.rates), "seeds": plan.seeds,
        "arms": {label: {s: asdict(a) for s, a in seeds.items()} for label, seeds in found.items()},
        "contrasts": [{"name": j.name, "family": j.family, "verdict": j.verdict,
                       "seeds_needed": j.seeds_needed, **asdict(j.contrast)} for j in judged]}),
        indent=2))
    return path


def _finite(value):
    """`value` with every NaN or infinity as null (strict JSON; a diverged run's loss reads null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def log_to_wandb(out_dir: Path, found, judged: list[Judged], meta: Mapping) -> str:
    """One W&B run (offline unless WANDB_MODE=online): the LR-sensitivity and contrast tables,
    the figure and STABILITY.md; returns its directory."""
    import os

    import wandb

    mode = "online" if os.environ.get("WANDB_MODE", "").lower() == "online" else "offline"
    run = wandb.init(project="attnlab", job_type="compare-stability", name=f"stability-{out_dir.name}",
                     dir=str(out_dir), mode=mode, config={k: v for k, v in meta.items() if k != "command"})
    arms = [[label, s.seed, _finite(s.sensitivity), s.spikes, s.diverged, s.learned]
            for label, seeds in found.items() for s in seeds.values()]
    run.log({"stability/lr_sensitivity": wandb.Table(
        columns=["arm", "seed", "lr_sensitivity", "spikes", "diverged", "learned"], data=arms)})
    rows = [[j.name, j.family, j.contrast.n, *(_finite(x) for x in (j.contrast.difference, *j.contrast.difference_interval,
                                                                     j.contrast.effect_size, j.contrast.p_adjusted)),
             j.verdict, j.seeds_needed] for j in judged]
    run.log({"stability/contrasts": wandb.Table(
        columns=["contrast", "family", "seeds", "difference", "low", "high", "d_z", "p_holm", "verdict",
                 "seeds_for_80pct_power"], data=rows)})
    run.log({"stability/lr_sensitivity_png": wandb.Image(str(out_dir / "lr_sensitivity.png"))})
    run.save(str(out_dir / "STABILITY.md"), base_path=str(out_dir))
    run_dir = str(Path(run.dir).parent)
    run.finish()
    return run_dir
