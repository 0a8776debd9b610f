"""Claim: explaining away (DNAS paper, Fig. 1 and its Lemma) on a trained encoder of each task.

UNAS can give a key (a lower-layer unit) almost no total attention, `sum_i w_ij < 1e-8`: it is
explained away. DNAS cannot: every valid key gets `sum_i w_ij >= 1/S` (the Lemma). Per task whose
card enters this claim, a UNAS and a DNAS model are trained (first seed) and the ExplainedAway
callback's statistics of the last validation are read per attention layer where the scheme
applies (an encoder-decoder's decoder stays UNAS in both runs and is left out; the card's
`encoder_layers` names the config key that counts the encoder's layers): the share of keys below
1e-8, the minimum column sum against 1/S, and `min * S` (>= 1 under the Lemma). Its histograms
(`explained_away.png` of each run) are copied beside the report.

Verdict: holds when the DNAS bound holds in every layer (min * S >= 1 - 1e-4) and UNAS explains
some key away (share > 0) in some layer of some task; "does not hold at this scale" when UNAS
explains nothing away (the bound itself is a theorem and holds by construction).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.reproduce.plan import Plan, Run
from attnlab.reproduce.results import (
    HOLDS,
    NOT_AT_SCALE,
    ClaimResult,
    Results,
    explained_away,
    not_run,
)

NAME = "explaining_away"
TITLE = "Explaining away"
PAPER = "DNAS paper, Fig. 1 and Lemma"
CLAIM = ("UNAS explains keys away (total attention < 1e-8); DNAS gives every key >= 1/S (Lemma), "
         "so its share below 1e-8 is 0")

MODELS = ("unas", "dnas")
LEMMA_TOLERANCE = 1e-4


def runs(plan: Plan) -> list[Run]:
    return [Run(task, model, plan.seeds[0], extra) for task, extra in plan.claim_variants(NAME)
            for model in MODELS]


def scheme_layers(record: dict, key: str | None, layers: list[int]) -> list[int]:
    """The layers where model= applies (all but a decoder's). `key`: the card's encoder_layers,
    the config key holding how many of the first attention layers (named_modules order, encoder
    first) are the encoder's; None: all of them."""
    config = Path(record.get("run_dir", "")) / "config.yaml"
    if key is None or not config.is_file():
        return layers
    count = OmegaConf.select(OmegaConf.load(config), key)
    return layers if count is None else [l for l in layers if l < int(count)]


def _fmt(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}g}"


def evaluate(plan: Plan, results: Results, out_dir: Path) -> ClaimResult:
    rows, missing, failed, figures = [], [], [], []
    unas_explains, lemma_holds, measured = False, True, False
    tasks = plan.claim_tasks(NAME)
    scores = []
    for task in tasks:
        if plan.skip_reason(task):
            missing.append(f"task {task}: not run ({plan.skip_reason(task)})")
    for task, extra in plan.claim_variants(NAME):
        if plan.skip_reason(task):
            continue
        name = plan.label(task, extra)
        stats = {}
        for model in MODELS:
            run = Run(task, model, plan.seeds[0], extra)
            record = results.get(run)
            if record is None:
                failed.append(f"{name}/{model}: {results.error(run)}")
                continue
            layers = explained_away(record)
            encoder = scheme_layers(record, plan.cards[task].encoder_layers, sorted(layers))
            stats[model] = {l: layers[l] for l in encoder}
            png = Path(record["run_dir"]) / "explained_away.png"
            if png.is_file():
                figure = f"explained_away_{name.replace(':', '_')}_{model}.png"
                shutil.copy(png, out_dir / figure)
                figures.append(figure)
        if len(stats) < 2:
            continue
        metric = plan.cards[task].optimized_metric
        scores.append(f"{name}: {metric} UNAS {_fmt(results.metric(Run(task, 'unas', plan.seeds[0], extra), metric))}, "
                      f"DNAS {_fmt(results.metric(Run(task, 'dnas', plan.seeds[0], extra), metric))}")
        for layer in sorted(set(stats["unas"]) & set(stats["dnas"])):
            u, d = stats["unas"][layer], stats["dnas"][layer]
            measured = True
            unas_explains |= u.get("share_below", 0.0) > 0
            lemma_holds &= d.get("min_col_sum_times_S", math.inf) >= 1 - LEMMA_TOLERANCE
            rows.append(f"| {name} | {layer} | {_fmt(u.get('share_below'))} | {_fmt(u.get('min_col_sum_times_S'))} | "
                        f"{_fmt(d.get('share_below'))} | {_fmt(d.get('min_col_sum'))} | {_fmt(d.get('bound_1_over_S'))} | "
                        f"{_fmt(d.get('min_col_sum_times_S'))} | {_fmt(u.get('entropy'))} | {_fmt(d.get('entropy'))} |")
    if not measured:
        why = "no UNAS/DNAS pair trained: " + "; ".join(failed + missing)
        return not_run(NAME, TITLE, PAPER, CLAIM, why)
    verdict = HOLDS if (unas_explains and lemma_holds) else NOT_AT_SCALE
    ours = (f"UNAS explains keys away in some layer: {unas_explains}; DNAS bound min col sum x S >= 1 in every "
            f"layer: {lemma_holds}")
    header = ("| task | layer | UNAS share < 1e-8 | UNAS min x S | DNAS share < 1e-8 | DNAS min col sum | 1/S | "
              "DNAS min x S | UNAS entropy | DNAS entropy |")
    table = [header, "|---|---|---|---|---|---|---|---|---|---|", *rows]
    notes = [f"what the pairs scored: {s}" for s in scores] + missing + [f"failed: {f}" for f in failed]
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM, ours=ours,
        setting="; ".join(plan.setting_text(t) for t in tasks if not plan.skip_reason(t)),
        seeds=str(plan.seeds[0]), verdict=verdict,
        details="\n".join(table + [""] + [f"- {n}" for n in notes]), figures=figures,
    )
