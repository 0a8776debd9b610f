"""Claim: explaining away (DNAS paper, Fig. 1, Sec. 3 and its Lemma).

The paper's statement: softmax over keys (UNAS) can leave a key that the answer needs with almost
no attention from any query (explained away by the queries' sharper matches elsewhere);
normalizing over queries first (DNAS) keeps every key in play, so a model can use it.

Judged on the probe where the mechanism engages (`unmatched_key`,
tasks/probe/generators/unmatched.py): the answer is read at the one key no other query matches,
in one layer. DNAS against UNAS over SEEDS seeds, with the probe's controls
(reproduce/probe_evidence.py): *holds* when DNAS is better and the probe tests its mechanism (its
shortcut is beaten and its positive control, no query competition, breaks it); *contradicted*
when UNAS is better or they are equivalent (TOST); *not tested* otherwise, with the reason (the
interval, or the diagnostic that shows the mechanism did not engage).

The Lemma's half (every DNAS column sum >= 1/S) holds by construction and is no evidence: it is
shown as a check, with the descriptive statistics of the tasks' trained encoders whose card
enters this claim (share of keys below 1e-8 under UNAS, DNAS's min column sum x S, entropy).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.study.compare.probes import ContrastSpec
from attnlab.study.evidence import ClaimResult, Run, not_tested
from attnlab.study.reproduce import probe_evidence
from attnlab.study.reproduce.results import explained_away

NAME = "explaining_away"
TITLE = "Explaining away"
PAPER = "DNAS paper, Fig. 1, Sec. 3 and Lemma"
CLAIM = ("UNAS can leave a key the answer needs unattended (explained away by other queries' "
         "sharper matches); DNAS keeps every key in play (column sums >= 1/S), so it can use it")

PROBE = "unmatched_key"
SPEC = ContrastSpec("dnas", "unas", "better")
MODELS = ("unas", "dnas")
LEMMA_TOLERANCE = 1e-4


def _task_variants(plan) -> list[tuple[str, tuple[str, ...]]]:
    """The tasks (and variants) whose trained encoders are described (the probe is the evidence)."""
    return [(task, extra) for task, extra in plan.claim_variants(NAME) if task != probe_evidence.TASK]


def runs(plan) -> list[Run]:
    described = [plan.run(task, model, plan.seeds[0], extra) for task, extra in _task_variants(plan)
                 for model in MODELS]
    return probe_evidence.runs(plan, PROBE, MODELS) + described


def scheme_layers(record: dict, key: str | None, layers: list[int]) -> list[int]:
    """The layers where model= applies (all but a decoder's). `key`: the card's encoder_layers,
    the config key holding how many of the first attention layers (named_modules order, encoder
    first) are the encoder's; None: all of them."""
    config = Path(record.get("run_dir", "")) / "config.yaml"
    if key is None or not config.is_file():
        return layers
    count = OmegaConf.select(OmegaConf.load(config), key)
    return layers if count is None else [l for l in layers if l < int(count)]


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}g}"


def describe_tasks(plan, results, out_dir: Path) -> tuple[list[str], list[str], bool]:
    """(table lines, notes, DNAS's bound held in every layer) of the tasks' trained encoders."""
    rows, notes, figures, lemma = [], [], [], True
    for task, extra in _task_variants(plan):
        if plan.skip_reason(task):
            notes.append(f"{task}: not run ({plan.skip_reason(task)})")
            continue
        name, stats = plan.label(task, extra), {}
        for model in MODELS:
            run = plan.run(task, model, plan.seeds[0], extra)
            record = results.get(run)
            if record is None:
                notes.append(f"{name}/{model}: {results.error(run)}")
                continue
            layers = explained_away(record)
            encoder = scheme_layers(record, plan.cards[task].encoder_layers, sorted(layers))
            stats[model] = {layer: layers[layer] for layer in encoder}
            png = Path(record["run_dir"]) / "explained_away.png"
            if png.is_file():
                figures.append(f"explained_away_{name.replace(':', '_')}_{model}.png")
                shutil.copy(png, out_dir / figures[-1])
        if len(stats) < 2:
            continue
        for layer in sorted(set(stats["unas"]) & set(stats["dnas"])):
            u, d = stats["unas"][layer], stats["dnas"][layer]
            lemma &= d.get("min_col_sum_times_S", math.inf) >= 1 - LEMMA_TOLERANCE
            rows.append(f"| {name} | {layer} | {_fmt(u.get('share_below'))} | "
                        f"{_fmt(u.get('min_col_sum_times_S'))} | {_fmt(d.get('share_below'))} | "
                        f"{_fmt(d.get('min_col_sum_times_S'))} | {_fmt(u.get('entropy'))} | "
                        f"{_fmt(d.get('entropy'))} |")
    table = [("| task | layer | UNAS share < 1e-8 | UNAS min x S | DNAS share < 1e-8 | DNAS min x S "
             "| UNAS entropy | DNAS entropy |"), "|---|---|---|---|---|---|---|---|", *rows]
    return (table if rows else []), notes, lemma


def evaluate(plan, results, out_dir: Path) -> ClaimResult:
    evidence = probe_evidence.evaluate(plan, results, PROBE, (SPEC,))
    table, notes, lemma = describe_tasks(plan, results, Path(out_dir))
    described = ["", ("Descriptive, the tasks' trained encoders (one seed; no verdict rests on "
                 f"them): DNAS's bound min col sum x S >= 1 held in every layer: {lemma} "
                 "(a theorem: it holds by construction)."), "", *table,
                 *(f"- {n}" for n in notes)] if table or notes else []
    if evidence is None:
        reason = probe_evidence.untrained(plan, PROBE)
        return not_tested(NAME, TITLE, PAPER, CLAIM, reason, details="\n".join(described))
    verdict, reason = evidence.verdict(SPEC)
    details = [(f"Evidence: the {PROBE} probe, main setting and controls, {evidence.seeds} seeds "
               "each, the probe's learning rate:"), "", *probe_evidence.cells_table(evidence),
               *described]
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM, ours=evidence.text(SPEC),
        setting=f"probe={PROBE} (main, positive and negative controls)",
        seeds=f"1-{evidence.seeds}", verdict=verdict, reason=reason, details="\n".join(details))
