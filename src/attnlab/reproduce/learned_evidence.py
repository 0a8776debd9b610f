"""What trained models say about a claim that is otherwise shown without training (mode collapse).

A task whose card enters such a claim (the probes: `clusters` asks how many clusters there are,
which a model that pulls the points toward the majority undercounts) trains each scheme the claim
compares, and the report sets their optimized metric beside the task's trivial baseline. A run
that did not learn is shown as such and left out of the comparison.
"""

from __future__ import annotations

import math

from attnlab.reproduce.plan import Plan, Run
from attnlab.reproduce.results import Results


def runs(plan: Plan, claim: str, models: tuple[str, ...]) -> list[Run]:
    return [Run(task, model, plan.seeds[0], extra) for task, extra in plan.claim_variants(claim)
            for model in models]


def _fmt(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value:.3f}"


def compare(plan: Plan, results: Results, claim: str, models: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(Markdown table lines, one sentence per variant whose runs all learned) of the trained
    evidence for `claim`; both empty when no task enters it or none was trained."""
    rows, sentences, skipped = [], [], set()
    for task, extra in plan.claim_variants(claim):
        if plan.skip_reason(task):
            skipped.add(f"{task}: not run ({plan.skip_reason(task)})")
            continue
        name, card = plan.label(task, extra), plan.cards[task]
        cells, values, learned = [], {}, True
        for model in models:
            run = Run(task, model, plan.seeds[0], extra)
            judged = results.learning(run)
            if judged is None:
                cells.append(f"failed: {results.error(run)}")
                learned = False
                continue
            values[model] = judged.metric
            learned &= judged.learned
            cells.append(_fmt(judged.metric) + ("" if judged.learned else " (did not learn)"))
        baseline = next((j.baseline for m in models if (j := results.learning(Run(task, m, plan.seeds[0], extra)))),
                        math.nan)
        rows.append(f"| {name} | `{card.optimized_metric}` | " + " | ".join(cells) + f" | {_fmt(baseline)} |")
        if learned and len(values) == len(models):
            best = max(values, key=values.get) if card.monitor_mode != "min" else min(values, key=values.get)
            sentences.append(f"{name}: " + ", ".join(f"{m.upper()} {_fmt(v)}" for m, v in values.items())
                             + f" (baseline {_fmt(baseline)}; best {best.upper()}, one seed)")
    if not rows:
        return [f"- {s}" for s in sorted(skipped)], []
    header = "| trained task | metric | " + " | ".join(m.upper() for m in models) + " | trivial baseline |"
    table = [header, "|" + "---|" * (len(models) + 3), *rows, *(f"- {s}" for s in sorted(skipped))]
    return table, sentences
