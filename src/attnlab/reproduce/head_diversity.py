"""Claim: head diversity. CODA's heads are more diverse than the Transformer's (higher average JSD
between the heads' attention distributions; CODA paper, head-diversity analysis); repulsive
attention's heads are farther apart (larger "Dist", the mean pairwise distance of the heads'
outputs; Repulsive attention paper, Table 1) than plain multi-head attention's.

Per task whose card enters this claim, UNAS (the Transformer / plain multi-head attention), CODA
and repulsive attention (SVGD) are trained (first seed), with the card's `multi_head` overrides
(VQA's fusion with 4 heads, its default has 1; classify with its Transformer encoder, its hops
are one head), and the HeadDiversity callback's test statistics read from metrics.json:
`test/avg_jsd` and `test/head_distance` (means over the multi-head layers). The tasks of the
papers, `mt` (CODA, Repulsive attention), `lm` (CODA) and `classify` (Repulsive attention), run
with --full, --gpu, or --quick --tasks mt,lm,classify.

Verdict: holds when CODA's JSD exceeds UNAS's and repulsive attention's distance exceeds UNAS's in
every task run.
"""

from __future__ import annotations

import math

from attnlab.reproduce.plan import Plan, Run
from attnlab.reproduce.results import HOLDS, NOT_AT_SCALE, ClaimResult, Results, not_run

NAME = "head_diversity"
TITLE = "Head diversity"
PAPER = "CODA paper (head JSD); Repulsive attention paper, Table 1 (Dist)"
CLAIM = "CODA: higher average JSD between heads than the Transformer; repulsive: larger head distance than MA"
MODELS = ("unas", "coda", "repulsive")


def _run(plan: Plan, task: str, model: str, extra: tuple[str, ...] = ()) -> Run:
    # the card's overrides that give the task multi-head attention to compare (and the variant's)
    return Run(task, model, plan.seeds[0], plan.cards[task].multi_head + extra)


def runs(plan: Plan) -> list[Run]:
    return [_run(plan, task, model, extra) for task, extra in plan.claim_variants(NAME) for model in MODELS]


def _fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.4g}"


def evaluate(plan: Plan, results: Results, out_dir) -> ClaimResult:
    rows, notes, coda, repulsive = [], [], [], []
    tasks = plan.claim_tasks(NAME)
    notes += [f"- {task}: not run ({plan.skip_reason(task)})" for task in tasks if plan.skip_reason(task)]
    for task, extra in plan.claim_variants(NAME):
        if plan.skip_reason(task):
            continue
        name = plan.label(task, extra)
        run = {m: _run(plan, task, m, extra) for m in MODELS}
        jsd = {m: results.metric(run[m], "test/avg_jsd") for m in MODELS}
        dist = {m: results.metric(run[m], "test/head_distance") for m in MODELS}
        notes += [f"- {name}/{m}: {results.error(run[m])}" for m in MODELS if results.get(run[m]) is None]
        if math.isnan(jsd["unas"]):
            continue
        if not math.isnan(jsd["coda"]):
            coda.append(jsd["coda"] > jsd["unas"])
        if not math.isnan(dist["repulsive"]):
            repulsive.append(dist["repulsive"] > dist["unas"])
        rows.append(f"| {name} | {_fmt(jsd['unas'])} | {_fmt(jsd['coda'])} | {_fmt(dist['unas'])} | "
                    f"{_fmt(dist['repulsive'])} |")
    checks = coda + repulsive
    if not checks:
        return not_run(NAME, TITLE, PAPER, CLAIM, "no comparison finished; " + " ".join(notes))
    table = ["| task | JSD UNAS | JSD CODA | head distance UNAS | head distance repulsive |",
             "|---|---|---|---|---|", *rows]
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM,
        ours=(f"CODA's JSD above UNAS's in {sum(coda)} of {len(coda)} tasks; repulsive attention's head distance "
              f"above UNAS's in {sum(repulsive)} of {len(repulsive)}"),
        setting="; ".join(" ".join([plan.setting_text(t), *plan.cards[t].multi_head])
                          for t in tasks if not plan.skip_reason(t)),
        seeds=str(plan.seeds[0]), verdict=HOLDS if all(checks) else NOT_AT_SCALE,
        details="\n".join(table + [""] + notes),
    )
