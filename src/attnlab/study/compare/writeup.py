"""compare/<time>/REPORT.md, its figures (the primary family's differences as a forest plot, the
difficulty sweeps as curves) and, with --wandb, a W&B run holding them."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from attnlab.figures import save_png
from attnlab.study.compare.analysis import (
    ACC,
    LAYER_DIAGNOSTICS,
    RUN_DIAGNOSTICS,
    Cell,
    ContrastResult,
    ProbeCheck,
)
from attnlab.study.compare.plan import MAX_NEEDED, OUTCOMES, ComparePlan, LrChoice, Power, lr_text
from attnlab.study.compare.probes import MAIN, ProbeCard, same_value
from attnlab.study.power import paired_power

FOREST = "effects.png"
OUTCOME_NAMES = {"test/acc": "accuracy", "val/acc_auc": "AUC"}


def _num(x: float, fmt: str = ".3f") -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:{fmt}}"


def _interval(low: float, high: float, fmt: str = ".3f") -> str:
    return "—" if not (math.isfinite(low) and math.isfinite(high)) else f"[{low:{fmt}}, {high:{fmt}}]"


def _row(*cells: str) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _rule(n: int) -> str:
    return "|" + "---|" * n


def _p(p: float) -> str:
    return "—" if not math.isfinite(p) else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


def _verdict(r: ContrastResult) -> str:
    v = r.result.verdict
    return f"**{v}**" if v in ("better", "worse") else v


def contrast_rows(results: list[ContrastResult], verdicts: bool = True) -> list[str]:
    head = ["probe", "contrast", "outcome", "scheme [95% CI]", "against [95% CI]",
            "difference [95% CI]", "d_z", "P(scheme > against)", "pairs (unpaired)"]
    if verdicts:
        head += ["p (Holm)", "TOST p (Holm)", "verdict", "predicted", "as predicted"]
    lines = [_row(*head), _rule(len(head))]
    for r in results:
        c = r.result
        cells = [r.probe, r.spec.name, OUTCOME_NAMES.get(r.outcome, r.outcome),
                 f"{_num(c.scheme_mean)} {_interval(*c.scheme_interval)}",
                 f"{_num(c.baseline_mean)} {_interval(*c.baseline_interval)}",
                 f"{_num(c.difference, '+.3f')} {_interval(*c.difference_interval, '+.3f')}",
                 _num(c.effect_size, '.2f'), _num(c.probability_of_improvement, '.2f'),
                 f"{c.n}" + (f" ({c.dropped})" if c.dropped else "")]
        if verdicts:
            cells += [_p(c.p_adjusted), _p(c.tost_adjusted), _verdict(r), r.spec.predicts,
                      r.as_predicted]
        lines.append(_row(*cells))
    return lines


def checks_section(cards: dict[str, ProbeCard], checks: dict[str, ProbeCheck]) -> list[str]:
    lines = ["## Does each probe test its mechanism?", "",
             ("A probe tests its mechanism when its best scheme beats the shortcut (the best "
              "simple rule that ignores the mechanism) by more than the probe's margin and its "
              "positive control (an ablation that removes the mechanism) breaks it: the schemes "
              "that use the mechanism fall at least halfway to the shortcut, or the contrasts' "
              "differences at least halve (or reverse). The negative control is a variant where theory says "
              "the schemes tie (TOST below)."), "",
             _row("probe", "mechanism", "shortcut", "best scheme", "positive control",
                  "negative control", "tests its mechanism"), _rule(7)]
    for name, check in checks.items():
        card = cards[name]
        positive = check.positive + (f": {check.positive_detail}" if check.positive_detail else "")
        if card.positive:
            positive = f"{card.positive.text} -> {positive}"
        negative = f"{card.negative.text} -> {check.negative}" if card.negative else check.negative
        lines.append(_row(name, card.mechanism, _num(check.shortcut), _num(check.best), positive,
                          negative, check.summary))
    return lines + [""]


def power_section(rows: list[Power], seeds: dict) -> list[str]:
    if not rows:
        return []
    lines = ["## Seeds and power", "",
             ("Per primary contrast and outcome: the spread (s.d.) of the pilot's paired "
              "differences, floored at 0.01, and the seeds a paired t-test needs for 80 % power at "
              "the probe's minimum effect at the family's Bonferroni level (alpha 0.05 / the "
              "family's tests; Holm is at least as powerful). Each cell ran the most its "
              "contrasts need, at most the mode's cap; the last column is the power at the seeds "
              "that ran (below 0.8: underpowered at the stated effect)."), "",
             _row("probe", "contrast", "outcome", "pilot pairs", "pilot s.d.", "s.d. used",
                  "min effect", "alpha", "seeds for 80 %", "seeds run", "power at the seeds run"),
             _rule(11)]
    for p in rows:
        scheme, against = p.contrast.split(" vs ")
        run = min(seeds.get((p.probe, MAIN, scheme), 0), seeds.get((p.probe, MAIN, against), 0))
        power = (paired_power(run, p.effect, p.sd_used, p.alpha)
                 if math.isfinite(p.sd_used) else math.nan)
        need = f">= {p.seeds}" if p.seeds >= MAX_NEEDED else str(p.seeds)
        lines.append(_row(p.probe, p.contrast, OUTCOME_NAMES.get(p.outcome, p.outcome),
                          p.pilot_pairs, _num(p.pilot_sd, ".4f"), _num(p.sd_used, ".4f"),
                          p.effect, f"{p.alpha:.2g}", need, run,
                          _num(power, ".2f") + (" (underpowered)" if power < 0.8 else "")))
    return lines + [""]


def lr_section(lrs: dict[tuple[str, str], LrChoice]) -> list[str]:
    tried = sorted({lr for choice in lrs.values() for lr in choice.means}, key=float)
    if len(tried) <= len({c.lr for c in lrs.values()}) and all(len(c.means) <= 1 for c in lrs.values()):
        return []
    lines = ["## Learning rates", "",
             ("Mean validation accuracy (best checkpoint) over the lr stage's seeds at each rate "
              "tried (the probe's own rate x 1/3, 1, 3); the best is the scheme's rate on that "
              "probe for every later run (in bold)."), "",
             _row("probe", "scheme", "rates: mean val acc", "spread (max - min)"), _rule(4)]
    for (probe, scheme), choice in lrs.items():
        parts = [(f"**{lr_text(lr)}: {_num(m)}**" if lr == choice.lr else f"{lr_text(lr)}: {_num(m)}")
                 for lr, m in sorted(choice.means.items())]
        finite = [m for m in choice.means.values() if math.isfinite(m)]
        lines.append(_row(probe, scheme, ", ".join(parts),
                          _num(max(finite) - min(finite)) if finite else "—"))
    return lines + [""]


def _cell_text(cell: Cell | None, outcome: str = ACC) -> str:
    if cell is None or not cell.n:
        return "failed" if cell and cell.failed else "—"
    return f"{_num(cell.mean(outcome))} {_interval(*cell.interval(outcome))}"


def probe_section(card: ProbeCard, cells: dict, plan: ComparePlan) -> list[str]:
    conditions = [c.name for c in plan.conditions(card)]
    schemes = plan.schemes_for(card)
    lines = [f"### {card.name} ({card.family})", "", f"Mechanism: {card.mechanism}.", ""]
    head = ["condition", "scheme", "accuracy [95% CI]", "AUC [95% CI]", "learned (k of n)", "lr"]
    lines += [_row(*head), _rule(len(head))]
    for condition in conditions:
        present = [cells[(card.name, condition, s)] for s in schemes
                   if (card.name, condition, s) in cells]
        if not present:
            continue
        base = [c.baseline for c in present if math.isfinite(c.baseline)]
        short = [c.shortcut for c in present if math.isfinite(c.shortcut)]
        lines.append(_row(condition, "*trivial baseline*", _num(np.mean(base)) if base else "—",
                          "", "", ""))
        if short:
            lines.append(_row(condition, "*shortcut*", _num(float(np.mean(short))), "", "", ""))
        for cell in present:
            learned = f"{cell.learned_count} of {cell.n}" + (
                "" if cell.learned_count == cell.n else " ⚠")
            lines.append(_row(condition, cell.scheme, _cell_text(cell), _cell_text(cell, OUTCOMES[1]),
                              learned, lr_text(cell.lr)))
    return lines + [""]


def diagnostics_section(card: ProbeCard, cells: dict, plan: ComparePlan) -> list[str]:
    present = [cells[(card.name, MAIN, s)] for s in plan.schemes_for(card)
               if (card.name, MAIN, s) in cells]
    # the schemes' own parameters (HNAS u, a sink's b) after the diagnostics every scheme has
    params = sorted({k for cell in present for k in cell.diagnostics} - set(LAYER_DIAGNOSTICS)
                    - set(RUN_DIAGNOSTICS))
    names = [*LAYER_DIAGNOSTICS, *RUN_DIAGNOSTICS, *params]
    rows = []
    for cell in present:
        values = [" / ".join(f"{v:.3g}" for v in cell.diagnostics.get(n, [])) or "—"
                  for n in names]
        rows.append(_row(cell.scheme, *values))
    if not rows:
        return []
    return [f"#### {card.name}: diagnostics (main setting, mean over runs; per layer)", "",
            _row("scheme", *names), _rule(len(names) + 1), *rows, ""]


def forest(results: list[ContrastResult], path: Path) -> Path | None:
    """The primary family's differences with their 95 % intervals, one panel per outcome."""
    if not results:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outcomes = [o for o in OUTCOMES if any(r.outcome == o for r in results)]
    rows = [r for r in results if r.outcome == outcomes[0]]
    fig, axes = plt.subplots(1, len(outcomes), figsize=(5 * len(outcomes), 0.45 * len(rows) + 1.5),
                             squeeze=False, sharey=True)
    colours = {"better": "tab:green", "worse": "tab:red", "equivalent": "tab:blue",
               "inconclusive": "grey"}
    for ax, outcome in zip(axes[0], outcomes):
        mine = [r for r in results if r.outcome == outcome]
        for i, r in enumerate(mine):
            low, high = r.result.difference_interval
            colour = colours.get(r.result.verdict, "grey")
            if math.isfinite(low):
                ax.plot([low, high], [i, i], color=colour, lw=2)
            ax.plot([r.result.difference], [i], "o", color=colour)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(mine)), [f"{r.probe}: {r.spec.name}" for r in mine], fontsize=8)
        ax.set_xlabel(f"difference in {OUTCOME_NAMES.get(outcome, outcome)} (95% CI)")
    axes[0][0].invert_yaxis()  # the table's order, top down (the panels share the y axis: once)
    axes[0][0].set_title("primary contrasts (green better, red worse, blue equivalent, grey "
                         "inconclusive)", fontsize=8, loc="left")
    fig.tight_layout()
    return save_png(fig, path, dpi=110)


def sweep_points(card: ProbeCard, plan: ComparePlan) -> list[tuple[str, dict[str, object]]]:
    """The sweep's grid as (condition, {key: value}): its points, and main at its own values
    (the grid point that is the main setting is not trained twice)."""
    points = [(c.name, dict(o.split("=", 1) for o in c.overrides))
              for c in plan.conditions(card) if c.name.startswith("sweep")]
    if not points:
        return []
    main = plan.main_setting(card)
    if all(main.get(k) is not None for k in card.sweep):
        points.append((MAIN, {k: main[k] for k in card.sweep}))
    return points


def sweep_figure(card: ProbeCard, cells: dict, plan: ComparePlan, path: Path) -> Path | None:
    """Accuracy against each swept option (the others at the main setting's value where the grid
    has it, else at the grid's first), one line per scheme with its 95 % interval."""
    points = sweep_points(card, plan)
    if not points:
        return None
    main = plan.main_setting(card)
    anchor = {k: next((v for v in grid if k in main and same_value(v, main[k])), grid[0])
              for k, grid in card.sweep.items()}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(card.sweep)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for scheme in plan.schemes_for(card):
            xs, ys, lows, highs = [], [], [], []
            for name, values in points:
                others = [same_value(values[k], anchor[k]) for k in keys if k != key]
                cell = cells.get((card.name, name, scheme))
                if not all(others) or cell is None or not cell.n:
                    continue
                low, high = cell.interval()
                xs.append(float(values[key]))
                ys.append(cell.mean())
                lows.append(low if math.isfinite(low) else cell.mean())
                highs.append(high if math.isfinite(high) else cell.mean())
            if xs:
                order = np.argsort(xs)
                xs, ys = np.array(xs)[order], np.array(ys)[order]
                ax.plot(xs, ys, "o-", label=scheme)
                ax.fill_between(xs, np.array(lows)[order], np.array(highs)[order], alpha=0.15)
        ax.set_xlabel(key.split(".")[-1])
        ax.set_ylabel("test accuracy")
        ax.set_title(card.name, fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path, dpi=100)


def write_report(out_dir: Path, plan: ComparePlan, cells: dict, lrs: dict, power: list[Power],
                 seeds: dict, primary: list[ContrastResult], negatives: list[ContrastResult],
                 explore: list[ContrastResult], checks: dict[str, ProbeCheck], meta: dict) -> Path:
    m = meta
    cards = {c.name: c for c in plan.probes()}
    lines = ["# attnlab compare: which scheme wins where, on probes built to decide it", "",
             (f"`{m['command']}`: mode **{m['mode']}**, commit {m['commit']}, {m['started']}"),
             (f"machine: {m['machine']}; load average {m['load_before']} before, {m['load_after']} "
              f"after; up to {m['jobs']} sweep(s) side by side; {m['trained']} run(s) trained, "
              f"{m['reused']} reused; wall time {m['wall_s'] / 60:.1f} min"), "",
             "## The primary family", "",
             ("Pre-registered in the probes' configs (`probe.compare.contrasts`, with the "
              "predicted direction): each contrast on the probe's main setting, on test accuracy "
              "and on the area under the validation learning curve (AUC), paired by seed. "
              "Holm within this family only (alpha 0.05): *better* / *worse* where the paired "
              "t-test rejects; else *equivalent* where the two one-sided tests (TOST) at the "
              "probe's margin reject; else *inconclusive*. Equivalence never comes from a "
              "non-rejection. d_z: the mean paired difference over its s.d.; P(scheme > "
              "against): the probability of improvement over all pairs of runs."), ""]
    lines += contrast_rows(primary) if primary else ["No primary contrast was run."]
    if primary and forest(primary, out_dir / FOREST):
        lines += ["", f"![primary contrasts]({FOREST})"]
    lines += ["", *checks_section(cards, checks)]
    if negatives:
        lines += ["## Negative controls", "",
                  ("The primary contrasts on each probe's negative control (accuracy; Holm within "
                   "these): theory says *equivalent*."), "", *contrast_rows(negatives), ""]
    lines += power_section(power, seeds)
    lines += lr_section(lrs)
    lines += ["## The probes", "",
              ("Each condition's cells: test accuracy and AUC, mean and 95 % t-interval over "
               "seeds; learned: the runs whose test answers beat the trivial baseline by an exact "
               "binomial test (p < 0.01). A cell keeps its runs that did not learn (⚠)."), ""]
    for card in cards.values():
        lines += probe_section(card, cells, plan)
        figure = sweep_figure(card, cells, plan, out_dir / f"sweep_{card.name}.png")
        if figure:
            lines += [f"![{card.name} sweep]({figure.name})", ""]
        lines += diagnostics_section(card, cells, plan)
    if explore:
        lines += ["## Exploratory", "",
                  ("Every other scheme against UNAS on each probe's main setting (accuracy): "
                   "intervals without a verdict, uncorrected."), "",
                  *contrast_rows(explore, verdicts=False), ""]
    failures = [(c.probe, c.condition, c.scheme, e) for c in cells.values() for e in c.failed]
    if failures:
        lines += ["## Runs that did not finish", ""]
        lines += [f"- {p} / {cond} / {s}: {e}" for p, cond, s, e in failures] + [""]
    lines += ["Each run's directory (metrics.json, config.yaml, csv/) is under `runs/`.", ""]
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def log_to_wandb(out_dir: Path, primary: list[ContrastResult], meta: dict) -> str:
    """One W&B run (offline unless WANDB_MODE=online) with the primary family's table, the
    figures and REPORT.md; returns its directory."""
    import wandb

    mode = "online" if os.environ.get("WANDB_MODE", "").lower() == "online" else "offline"
    run = wandb.init(project="attnlab", job_type="compare", name=f"compare-{out_dir.name}",
                     dir=str(out_dir), mode=mode,
                     config={k: v for k, v in meta.items() if k != "command"})
    columns = ["probe", "contrast", "outcome", "difference", "low", "high", "d_z", "poi",
               "p_holm", "tost_p_holm", "verdict", "predicted"]
    rows = [[r.probe, r.spec.name, r.outcome, r.result.difference, *r.result.difference_interval,
             r.result.effect_size, r.result.probability_of_improvement, r.result.p_adjusted,
             r.result.tost_adjusted, r.result.verdict, r.spec.predicts] for r in primary]
    run.log({"compare/primary": wandb.Table(columns=columns, data=rows)})
    for png in sorted(out_dir.glob("*.png")):
        run.log({f"compare/{png.stem}": wandb.Image(str(png))})
    run.save(str(out_dir / "REPORT.md"), base_path=str(out_dir))
    run_dir = str(Path(run.dir).parent)
    run.finish()
    return run_dir
