"""What the two head-diversity claims share (reproduce/coda_diversity.py: CODA's head JSD;
reproduce/repulsive_diversity.py: repulsive attention's head distance): a scheme's measure of
head diversity against UNAS's, per task whose card enters the claim (with the card's
`multi_head` overrides) and per seed (a probe's variants get probe_evidence.SEEDS seeds, the
tasks plan.seeds), from the HeadDiversity callback's test statistics in metrics.json.

Each (task, seed) whose two runs learned is one paired measurement; the verdict is an exact
sign test across them (one-sided binomial at 1/2): *holds* when the scheme's diversity is higher
in significantly many (p < 0.05), *contradicted* when lower in significantly many, *not tested*
otherwise: underpowered, with k of n (at least 5 measurements, all in one direction, are needed),
or no pair learned.
"""

from __future__ import annotations

import math

from scipy import stats as scipy_stats

from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED, ClaimResult, Run, not_tested
from attnlab.study.reproduce import probe_evidence

ALPHA = 0.05


def seeds(plan, task: str) -> tuple[int, ...]:
    if task == probe_evidence.TASK:
        return tuple(range(1, probe_evidence.SEEDS[plan.mode] + 1))
    return plan.seeds


def _run(plan, task: str, model: str, seed: int, extra: tuple[str, ...]) -> Run:
    return plan.run(task, model, seed, (*plan.cards[task].multi_head, *extra))


def runs(plan, claim: str, scheme: str) -> list[Run]:
    return [_run(plan, task, model, seed, extra) for task, extra in plan.claim_variants(claim)
            for seed in seeds(plan, task) for model in ("unas", scheme)]


def sign_test(higher: int, n: int) -> tuple[float, float]:
    """(p of "higher in so many or more", p of "lower in so many or more"), exact, at 1/2."""
    if n == 0:
        return math.nan, math.nan
    return (float(scipy_stats.binom.sf(higher - 1, n, 0.5)),
            float(scipy_stats.binom.cdf(higher, n, 0.5)))


def judge(higher: int, n: int) -> tuple[str, str]:
    """(verdict, reason) of `higher` of `n` paired measurements in the claimed direction."""
    if n == 0:
        return NOT_TESTED, "no task has a pair of runs that both learned"
    up, down = sign_test(higher, n)
    if up < ALPHA:
        return HOLDS, ""
    if down < ALPHA:
        return CONTRADICTED, ""
    return NOT_TESTED, (f"underpowered: higher in {higher} of {n} measurements (sign test p "
                        f"{up:.2f}; at least 5 of 5 in one direction are needed)")


def evaluate(plan, results, claim: dict, scheme: str, metric: str) -> ClaimResult:
    """`claim`: the claim module's globals (NAME, TITLE, PAPER, CLAIM); `metric`: the
    metrics.json key."""
    rows, notes, higher, n = [], [], 0, 0
    tasks = plan.claim_tasks(claim["NAME"])
    notes += [f"- {t}: not run ({plan.skip_reason(t)})" for t in tasks if plan.skip_reason(t)]
    for task, extra in plan.claim_variants(claim["NAME"]):
        if plan.skip_reason(task):
            continue
        name = plan.label(task, extra)
        for seed in seeds(plan, task):
            pair = {m: _run(plan, task, m, seed, extra) for m in ("unas", scheme)}
            missing = [m for m, r in pair.items() if results.get(r) is None]
            if missing:
                notes += [f"- {name} seed {seed} / {m}: {results.error(pair[m])}" for m in missing]
                continue
            ours, base = results.metric(pair[scheme], metric), results.metric(pair["unas"], metric)
            if math.isnan(ours) or math.isnan(base):
                notes.append(f"- {name} seed {seed}: no {metric}")
                continue
            n += 1
            higher += ours > base
            rows.append(f"| {name} | {seed} | {base:.4g} | {ours:.4g} | "
                        f"{'higher' if ours > base else 'not higher'} |")
    verdict, reason = judge(higher, n)
    if n == 0:
        return not_tested(claim["NAME"], claim["TITLE"], claim["PAPER"], claim["CLAIM"], reason,
                          details="\n".join(notes))
    table = [f"| task | seed | UNAS {metric} | {scheme} {metric} | |", "|---|---|---|---|---|", *rows]
    up, _ = sign_test(higher, n)
    return ClaimResult(
        name=claim["NAME"], title=claim["TITLE"], source=claim["PAPER"], paper=claim["CLAIM"],
        ours=(f"{scheme}'s {metric} above UNAS's in {higher} of {n} paired measurements (sign "
              f"test p {up:.3g})"),
        setting="; ".join(" ".join([plan.setting_text(t), *plan.cards[t].multi_head])
                          for t in tasks if not plan.skip_reason(t)),
        seeds="; ".join(f"{t}: {', '.join(map(str, seeds(plan, t)))}" for t in tasks
                        if not plan.skip_reason(t)),
        verdict=verdict, reason=reason, details="\n".join(table + [""] + notes))
