"""The length claims' report: each contrast's row, each arm's loss at every length, the plot
of loss against length, and `evaluate` (the claim's verdict from `length`'s judgement)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.study import stats
from attnlab.study.evidence import ClaimResult, not_tested
from attnlab.study.reproduce import length
from attnlab.study.reproduce.length import (
    CAP,
    LENGTHS,
    METRIC,
    PILOT,
    RUN_EXTRA,
    Arm,
    Judged,
    Power,
    Registration,
    arm_seeds,
    judge,
    overall,
    paired,
    run,
    seeds_needed,
    value,
    variants,
)


def _fmt(x: float, spec: str = ".3f") -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, spec)


def arm_losses(plan, results, task, extra, arm: Arm, seeds: int, m: int) -> list[float]:
    """An arm's test/loss@m over its seeds 1..`seeds` that learned and report it."""
    xs = [value(results, run(plan, task, extra, arm, s), METRIC.format(m=m))[0]
          for s in range(1, seeds + 1)]
    return [x for x in xs if math.isfinite(x)]


def arm_table(plan, results, task, extra, reg: Registration, powers) -> list[str]:
    """Markdown: each arm's mean test loss [95% CI] at every length, over its seeds that learned."""
    lines = ["| arm | seeds | " + " | ".join(f"test/loss@{m}" for m in LENGTHS) + " |",
             "|---|---|" + "---|" * len(LENGTHS)]
    for arm in reg.arms:
        n = arm_seeds(powers, task, extra, arm)
        cells = []
        for m in LENGTHS:
            xs = arm_losses(plan, results, task, extra, arm, n, m)
            low, high = stats.t_interval(xs) if len(xs) > 1 else (math.nan, math.nan)
            cells.append(f"{_fmt(float(np.mean(xs)))} [{_fmt(low)}, {_fmt(high)}] ({len(xs)})" if xs else "—")
        lines.append(f"| {arm.label} | {n} | " + " | ".join(cells) + " |")
    return lines


def plot(plan, results, task, extra, reg, powers, path: Path) -> Path:
    """Mean test loss against the length multiple, one line per arm, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.figures import save_png

    fig, ax = plt.subplots(figsize=(5, 3.4), constrained_layout=True)
    for arm in reg.arms:
        n = arm_seeds(powers, task, extra, arm)
        means, lows, highs = [], [], []
        for m in LENGTHS:
            xs = arm_losses(plan, results, task, extra, arm, n, m)
            mean = float(np.mean(xs)) if xs else math.nan
            low, high = stats.t_interval(xs) if len(xs) > 1 else (mean, mean)
            means.append(mean), lows.append(mean - low), highs.append(high - mean)
        ax.errorbar(LENGTHS, means, yerr=[lows, highs], marker="o", capsize=3, label=arm.label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(LENGTHS, [f"{m}x" for m in LENGTHS])
    ax.set_xlabel("test length (multiple of the training length)")
    ax.set_ylabel("test loss (nats / token)")
    ax.legend(fontsize=7)
    return save_png(fig, path)


def contrast_row(j: Judged, power: Power | None) -> str:
    c = j.result
    seeds = ("—" if power is None else f"{power.pairs} pilot pairs, s.d. {_fmt(power.sd)}, needs "
             f"{power.needed or '—'}, ran {power.seeds}")
    if c is None:
        return f"| {j.name} | — | — | — | — | — | {seeds} | **{j.verdict}**: {j.reason} |"
    low, high = c.difference_interval
    ni = "" if not math.isfinite(j.ni_interval[0]) else (
        f"; 90%: [{j.ni_interval[0]:+.3f}, {j.ni_interval[1]:+.3f}]")
    return (f"| {j.name} | {_fmt(c.scheme_mean)} | {_fmt(c.baseline_mean)} | {c.difference:+.3f} "
            f"[{low:+.3f}, {high:+.3f}]{ni} | {_fmt(c.effect_size, '.2f')} | "
            f"{_fmt(c.p_adjusted, '.3g')} | {seeds} | **{j.verdict}** |")


def hooks(claim: dict):
    """`runs`, `more_runs` and `evaluate` of a length claim module (its globals: NAME,
    REGISTRATION, ...), what the reproduce registry calls on every claim."""
    name, reg = claim["NAME"], claim["REGISTRATION"]

    def runs(plan) -> list:
        return length.pilot_runs(plan, name, reg)

    def more_runs(plan, results) -> list:
        return length.more_runs(plan, name, reg, results)

    def evaluate_claim(plan, results, out_dir):
        return evaluate(plan, results, out_dir, claim)

    return runs, more_runs, evaluate_claim


def evaluate(plan, results, out_dir: Path, claim: dict) -> ClaimResult:
    """`claim`: the claim module's globals (NAME, TITLE, PAPER, CLAIM, REGISTRATION)."""
    name, reg = claim["NAME"], claim["REGISTRATION"]
    tasks = plan.claim_variants(name)
    skipped = [f"{t}: not run ({plan.skip_reason(t)})" for t, _ in tasks if plan.skip_reason(t)]
    trained = variants(plan, name)
    if not trained:
        return not_tested(name, claim["TITLE"], claim["PAPER"], claim["CLAIM"],
                          "; ".join(skipped) or "no task enters this claim",
                          details=reg.text())
    powers = seeds_needed(plan, name, reg, results)
    judged, details, figures, ours = [], [reg.text(), ""], [], []
    for task, extra in trained:
        label = plan.label(task, extra)
        pairs, by_name = {}, {}
        for c in reg.contrasts:
            power = powers[(task, extra, c)]
            n = min(arm_seeds(powers, task, extra, a) for a in (c.scheme, c.against))
            key = c.name if len(trained) == 1 else f"{label}: {c.name}"
            pairs[key] = paired(results, plan, task, extra, c, range(1, n + 1))
            by_name[key] = power
        family = judge(reg, pairs, by_name, plan.mode)
        judged += family
        details += [f"**{label}** ({plan.setting_text(task)}):", "",
                    ("| contrast | scheme loss | baseline loss | difference [95% CI] | d_z | "
                     "p (Holm) | seeds | verdict |"), "|---|---|---|---|---|---|---|---|",
                    *(contrast_row(j, by_name[j.name]) for j in family), "",
                    *arm_table(plan, results, task, extra, reg, powers), ""]
        details += [f"- {n}: {w}" for n, (_, _, why) in pairs.items() for w in why]
        figures.append(plot(plan, results, task, extra, reg, powers,
                            Path(out_dir) / f"{name}_{label.replace(':', '_')}.png").name)
        ours += [f"{j.name}: {j.result.difference:+.3f} [{j.result.difference_interval[0]:+.3f}, "
                 f"{j.result.difference_interval[1]:+.3f}] nats, d_z {_fmt(j.result.effect_size, '.2f')}"
                 if j.result else f"{j.name}: no pair" for j in family]
    verdict, reason = overall(judged)
    seeds = sorted({p.seeds for p in powers.values()})
    return ClaimResult(
        name=name, title=claim["TITLE"], source=claim["PAPER"], paper=claim["CLAIM"],
        ours="; ".join(ours),
        setting="; ".join([plan.setting_text(t) + " " + " ".join(RUN_EXTRA[:1]) for t, _ in trained]
                          + skipped),
        seeds=f"1-{max(seeds)} (pilot {PILOT[plan.mode]}, cap {CAP[plan.mode]})",
        verdict=verdict, reason=reason, details="\n".join(details), figures=figures)
