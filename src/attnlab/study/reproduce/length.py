"""What the length claims share (length_ssmax.py, length_stickbreaking.py, length_gate.py): train
at the task's block size L, test at multiples of it (`task.eval_lengths`, the metric
`test/loss@{m}`: nats per token on windows of m x L tokens), and judge a family of paired
contrasts declared before any run.

A claim declares (`Registration`, in its module, before any run): the prediction in words; its
arms (a scheme and its overrides, e.g. `task.module.net.positions=none`); its contrasts (a
scheme arm against a baseline arm at a multiple m); the test (SUPERIORITY: the scheme's loss is
lower; NONINFERIORITY: the scheme's loss is at most `margin` above the baseline's); the margin in
nats per token; and the smallest effect its power is planned for. Lower loss is better, always.
Every run of an arm gets `RUN_EXTRA` too: the lengths, and no analysis callback that no length
claim reads. The size of the runs per mode is the task card's (`reproduce.quick` for --quick).

Seeds, from a pilot (`seeds_needed`): every arm trains seeds 1..PILOT first; the s.d. of each
contrast's paired differences over the pilot's seeds (floored at SD_FLOOR) gives the seeds its
test needs for POWER (attnlab.study.power.seeds_for_power; superiority: to detect `min_effect` at
the family's Bonferroni level, Holm's first step; non-inferiority: to show it when the two are
equal, the margin away, one-sided), capped at the mode's CAP; `more_runs` tops the contrast's
arms up to it once the pilot is in (attnlab.reproduce's second stage).

Each contrast pairs the runs by seed: a seed enters where both runs learned (the task card's
baseline, reproduce/learning.py) and report test/loss@m. Its verdict:

    SUPERIORITY      the scheme lower at Holm's level (two-sided paired t-test) -> holds;
                     higher, or equivalent within +-margin (TOST, Holm)          -> contradicted
    NONINFERIORITY   one-sided test of "higher by >= margin" rejects (Holm)      -> holds;
                     one-sided test of "higher by <= margin" rejects (Holm)      -> contradicted
    neither          not tested: underpowered, with the interval, the seeds 80 % power needs
                     and the cap
    < 2 pairs        not tested, with the reason: the runs did not learn, they report no
                     test/loss@m (missing lengths), or they were not run

The claim's verdict: contradicted when any contrast is (the claim is made for every setting of
its family: one solid counterexample refutes it), holds when every contrast holds, else not
tested with the reasons of the contrasts that were not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from attnlab.study import stats
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED, Arm, Run
from attnlab.study.power import seeds_for_power

LENGTHS = (1, 4, 8)  # multiples of the training length every length run is tested at
# every run of a length claim: the lengths; the analyses no length claim reads are off (they
# cost evaluations: about a third of a quick run)
RUN_EXTRA = (f"task.eval_lengths=[{','.join(map(str, LENGTHS))}]", "++callbacks.head_diversity=null",
             "++callbacks.explained_away=null")
METRIC = "test/loss@{m}"
SUPERIORITY, NONINFERIORITY = "superiority", "non-inferiority"
ALPHA, POWER = 0.05, 0.8
PILOT = {"quick": 3, "full": 3, "gpu": 3}  # seeds of every arm before the power computation
CAP = {"quick": 4, "full": 10, "gpu": 20}  # the most seeds an arm gets (quick: 20 min of CPU)
MAX_NEEDED = 200  # what the power computation reports beyond a cap
SD_FLOOR = 0.005  # nats: a pilot's spread below this counts as this much (3 seeds can agree by chance)


@dataclass(frozen=True)
class Contrast:
    scheme: Arm
    against: Arm
    length: int = 1  # the multiple m of the training length
    key: str = ""  # another metrics.json metric instead of test/loss@m (the outlier claims')

    @property
    def name(self) -> str:
        if self.key:
            return f"{self.scheme.label} vs {self.against.label}: {self.key}"
        return f"{self.scheme.label} vs {self.against.label} at {self.length}x"

    @property
    def metric(self) -> str:
        return self.key or METRIC.format(m=self.length)


@dataclass(frozen=True)
class Registration:
    """A claim's pre-registration: what it predicts and how it is judged, fixed before any run."""

    prediction: str
    test: str  # SUPERIORITY | NONINFERIORITY
    contrasts: tuple[Contrast, ...]  # one family: Holm across them
    margin: float  # nats per token: equivalence (superiority) or non-inferiority margin
    min_effect: float  # nats per token: what the seeds are planned to detect (superiority)
    why_margin: str
    run_extra: tuple[str, ...] = RUN_EXTRA  # what every run of the claim gets
    higher_is_better: bool = False  # the metric's direction (a loss: lower)
    unit: str = "nats per token"  # the metric's, and so the margin's and the effect's

    def __post_init__(self) -> None:
        if self.test not in (SUPERIORITY, NONINFERIORITY):
            raise ValueError(f"test {self.test!r}: use {SUPERIORITY} or {NONINFERIORITY}")
        if self.test == NONINFERIORITY and self.higher_is_better:
            raise ValueError("non-inferiority is implemented for a metric where lower is better")
        bad = [c.name for c in self.contrasts if not c.key and c.length not in LENGTHS]
        if bad:
            raise ValueError(f"contrasts {bad} are at a length not tested; use one of {LENGTHS}")

    @property
    def arms(self) -> list[Arm]:
        return list(dict.fromkeys(a for c in self.contrasts for a in (c.scheme, c.against)))

    def text(self) -> str:
        """The registration in Markdown, for the report."""
        better = "higher" if self.higher_is_better else "lower"
        direction = (f"{better} is better; the scheme's value predicted {better}" if self.test == SUPERIORITY
                     else f"lower is better; the scheme's value predicted at most {self.margin} above")
        keys = list(dict.fromkeys(c.key for c in self.contrasts if c.key))
        metric = ", ".join(keys) if keys else "test/loss@m"
        return (f"Pre-registered: {self.prediction} Test: {self.test}, paired by seed, Holm across "
                f"the {len(self.contrasts)} contrast(s); metric {metric} ({self.unit}), "
                f"{direction}; margin {self.margin} ({self.why_margin}); seeds for "
                f"{POWER:.0%} power at {self.min_effect} from a pilot of {PILOT['quick']} "
                f"seeds, capped at {CAP['quick']} (--quick), {CAP['full']} (--full), "
                f"{CAP['gpu']} (--gpu).")


# ----------------------------------------------------------------------------- runs
def run(plan, task: str, extra: tuple[str, ...], arm: Arm, seed: int,
        run_extra: tuple[str, ...] = RUN_EXTRA) -> Run:
    return plan.run(task, arm.model, seed, (*arm.overrides, *run_extra, *extra))


def variants(plan, name: str) -> list[tuple[str, tuple[str, ...]]]:
    """The (task, extra) that enter claim `name` and are trained in this mode."""
    return [(t, e) for t, e in plan.claim_variants(name) if not plan.skip_reason(t)]


def pilot_runs(plan, name: str, reg: Registration) -> list[Run]:
    return [run(plan, task, extra, arm, seed, reg.run_extra) for task, extra in plan.claim_variants(name)
            for arm in reg.arms for seed in range(1, PILOT[plan.mode] + 1)]


def value(results, r: Run, key: str) -> tuple[float, str | None]:
    """(the run's `key`, None) if it finished, learned and reports it; else (NaN, why not)."""
    record = results.get(r)
    if record is None:
        error = results.error(r) or "not run"
        return math.nan, ("did not learn" if error.startswith("did not learn") else error)
    v = record.get("metrics", {}).get(key)
    return (math.nan, f"no {key}") if v is None else (float(v), None)


def paired(results, plan, task, extra, c: Contrast, seeds: range,
           run_extra: tuple[str, ...] = RUN_EXTRA) -> tuple[dict, dict, list[str]]:
    """{seed: scheme loss}, {seed: baseline loss} of the seeds where both are there, and why each
    other seed is not."""
    a, b, why = {}, {}, []
    for seed in seeds:
        (x, wx), (y, wy) = (value(results, run(plan, task, extra, arm, seed, run_extra), c.metric)
                            for arm in (c.scheme, c.against))
        if wx is None and wy is None:
            a[seed], b[seed] = x, y
        else:
            why += [f"{arm.label} seed {seed}: {w}" for arm, w in ((c.scheme, wx), (c.against, wy)) if w]
    return a, b, why


# ----------------------------------------------------------------------------- power
@dataclass(frozen=True)
class Power:
    pairs: int  # pilot pairs the s.d. comes from
    sd: float  # the pilot's s.d. of the paired differences (NaN: fewer than 2 pairs)
    needed: int  # seeds for POWER (MAX_NEEDED: at least that many); 0: no pilot to plan on
    seeds: int  # what this mode runs: max(pilot, min(needed, cap))


def plan_seeds(d: list[float], reg: Registration, mode: str) -> Power:
    """The seeds one contrast needs from its pilot differences `d` (module docstring)."""
    pilot, cap = PILOT[mode], CAP[mode]
    if len(d) < 2:  # nothing to plan on: the verdict will say why (not learned, not run)
        return Power(len(d), math.nan, 0, pilot)
    sd = float(np.std(d, ddof=1))
    used = max(sd, SD_FLOOR)
    alpha = ALPHA / len(reg.contrasts)
    if reg.test == SUPERIORITY:
        needed = seeds_for_power(reg.min_effect, used, alpha, POWER, maximum=MAX_NEEDED)
    else:  # one-sided at alpha ~ two-sided at 2 alpha; true difference 0, the margin away
        needed = seeds_for_power(reg.margin, used, 2 * alpha, POWER, maximum=MAX_NEEDED)
    return Power(len(d), sd, needed, max(pilot, min(needed, cap)))


def seeds_needed(plan, name: str, reg: Registration, results) -> dict[tuple, Power]:
    """{(task, extra, contrast): Power} from the pilot's runs in `results`."""
    out = {}
    for task, extra in variants(plan, name):
        for c in reg.contrasts:
            a, b, _ = paired(results, plan, task, extra, c, range(1, PILOT[plan.mode] + 1), reg.run_extra)
            out[(task, extra, c)] = plan_seeds([a[s] - b[s] for s in a], reg, plan.mode)
    return out


def arm_seeds(powers: dict[tuple, Power], task, extra, arm: Arm) -> int:
    """An arm's seeds: the most any of its contrasts needs."""
    return max((p.seeds for (t, e, c), p in powers.items() if (t, e) == (task, extra)
                and arm in (c.scheme, c.against)), default=0)


def more_runs(plan, name: str, reg: Registration, results) -> list[Run]:
    """After the pilot: each arm's seeds beyond it, up to what its contrasts need."""
    powers = seeds_needed(plan, name, reg, results)
    return [run(plan, task, extra, arm, seed, reg.run_extra) for task, extra in variants(plan, name)
            for arm in reg.arms
            for seed in range(PILOT[plan.mode] + 1, arm_seeds(powers, task, extra, arm) + 1)]


# ----------------------------------------------------------------------------- verdicts
@dataclass
class Judged:
    """One contrast: its paired statistics (None: fewer than 2 pairs), verdict and reason."""

    name: str
    result: stats.Contrast | None
    verdict: str
    reason: str
    ni_interval: tuple[float, float] = (math.nan, math.nan)  # non-inferiority: the 1 - 2 alpha one


def noninferiority_p(d: np.ndarray, margin: float) -> tuple[float, float]:
    """One-sided paired t-tests on d = scheme - baseline (loss): (p of H0 mean(d) >= margin,
    p of H0 mean(d) <= margin); small first: non-inferior, small second: worse by more than the
    margin. As scipy.stats.ttest_1samp(d, margin, alternative="less" / "greater"); with
    differences that do not vary, 0 or 1 by which side of the margin they lie."""
    n = d.size
    if n < 2:
        return math.nan, math.nan
    if np.all(d == d[0]):
        return (0.0, 1.0) if d[0] < margin else (1.0, 0.0) if d[0] > margin else (1.0, 1.0)
    t = (float(d.mean()) - margin) / (float(d.std(ddof=1)) / math.sqrt(n))
    return float(special.stdtr(n - 1, t)), float(special.stdtr(n - 1, -t))


def why_untested(why: list[str], metric: str) -> str:
    """The reason a contrast has fewer than 2 pairs, from its runs' reasons."""
    if any(w.endswith(": did not learn") for w in why):
        return "the runs did not learn (" + "; ".join(w for w in why if w.endswith(": did not learn")) + ")"
    if any(w.endswith(f"no {metric}") for w in why):
        return (f"the runs report no {metric} (missing lengths: task.eval_lengths did not reach "
                "them)")
    return "not run (" + ("; ".join(why[:2]) or "no seeds") + ")"


def judge(reg: Registration, pairs: dict[str, tuple[dict, dict, list[str]]],
          powers: dict[str, Power] | None = None, mode: str = "quick") -> list[Judged]:
    """Each contrast's verdict; `pairs`: {contrast name: (scheme {seed: loss}, baseline
    {seed: loss}, why the other seeds are missing)}; `powers`: the plan's seeds per contrast,
    for the underpowered reason."""
    powers = powers or {}
    testable = {n: (a, b) for n, (a, b, _) in pairs.items() if len(stats.pair(a, b)[0]) >= 2}
    out: dict[str, Judged] = {}
    if reg.test == SUPERIORITY:
        family = stats.contrast_family({n: (a, b, reg.margin) for n, (a, b) in testable.items()},
                                       ALPHA, higher_is_better=reg.higher_is_better)
        for n, c in family.items():
            verdict = {stats.BETTER: HOLDS, stats.WORSE: CONTRADICTED,
                       stats.EQUIVALENT: CONTRADICTED}.get(c.verdict, NOT_TESTED)
            out[n] = Judged(n, c, verdict, _reason(n, c, verdict, powers.get(n), mode))
    else:
        single = {n: stats.contrast(a, b, reg.margin, ALPHA, higher_is_better=False)
                  for n, (a, b) in testable.items()}
        d = {n: np.subtract(*stats.pair(a, b)[:2]) for n, (a, b) in testable.items()}
        ps = {n: noninferiority_p(x, reg.margin) for n, x in d.items()}
        holds = dict(zip(ps, stats.holm([p[0] for p in ps.values()])))
        worse = dict(zip(ps, stats.holm([p[1] for p in ps.values()])))
        for n, c in single.items():
            verdict = HOLDS if holds[n] < ALPHA else CONTRADICTED if worse[n] < ALPHA else NOT_TESTED
            ni = stats.t_interval(d[n], 1 - 2 * ALPHA)
            out[n] = Judged(n, c, verdict, _reason(n, c, verdict, powers.get(n), mode, ni), ni)
    return [out.get(n) or Judged(n, None, NOT_TESTED, why_untested(pairs[n][2], _metric(reg, n)))
            for n in pairs]


def _metric(reg: Registration, name: str) -> str:
    return next((c.metric for c in reg.contrasts if c.name == name), "the metric")


def _reason(name: str, c: stats.Contrast, verdict: str, power: Power | None, mode: str,
            ni: tuple[float, float] | None = None) -> str:
    low, high = ni or c.difference_interval
    level = f"{1 - 2 * ALPHA:.0%}" if ni else "95%"
    text = f"{c.difference:+.3f} [{level}: {low:+.3f}, {high:+.3f}] over {c.n} seeds"
    if verdict == HOLDS:
        return ""
    if verdict == CONTRADICTED:
        return f"{name}: {text}" + (" (equivalent within the margin)" if c.verdict == stats.EQUIVALENT else "")
    need = ""
    if power is not None and power.needed:
        more = "at least " if power.needed >= MAX_NEEDED else ""
        need = (f"; {POWER:.0%} power needs {more}{power.needed} seeds (pilot s.d. {power.sd:.3f}), "
                f"the {mode} cap is {CAP[mode]}")
    return f"underpowered: {name} differs by {text}{need}"


def overall(judged: list[Judged]) -> tuple[str, str]:
    """The claim's verdict and reason from its contrasts' (module docstring)."""
    if not judged:
        return NOT_TESTED, "no contrast"
    against = [j for j in judged if j.verdict == CONTRADICTED]
    held = [j.name for j in judged if j.verdict == HOLDS]
    if against:
        also = f"; holds for {', '.join(held)}" if held else ""
        return CONTRADICTED, "; ".join(j.reason for j in against) + also
    if len(held) == len(judged):
        return HOLDS, ""
    return NOT_TESTED, "; ".join(f"{j.name}: {j.reason}" if not j.reason.startswith("underpowered")
                                 else j.reason for j in judged if j.verdict == NOT_TESTED)
