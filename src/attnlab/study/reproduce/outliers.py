"""What the sink, outlier and low-bit claims share (sinks_softpick.py, sinks_gate.py,
lowbit_kurtosis.py): the same runs of the causal LM, the metrics its end of training records
(attnlab.diagnostics via the OutlierDiagnostics callback; `quant=` via attnlab.evaluation), and
the judgement of reproduce/length.py (pre-registered contrasts paired by seed, seeds from a pilot
for 80 % power, Holm within a family), plus the two premises these claims rest on:

- **a sink to remove.** A claim that a scheme lowers the sink rate is only tested where softmax
  attention (UNAS) has sinks: when UNAS's mean sink rate over its seeds is below PREMISE, each
  sink-rate contrast is "not tested: premise absent" with the measured rate (Gu et al. saw no
  sink at 60M parameters and 100M tokens; a CPU-sized LM has none either; a pretrained softmax
  model has them: `python -m attnlab.diagnose` on the packaged MiniLM).
- **a kurtosis difference.** "The low-bit drop is smaller for the scheme with the lower
  kurtosis" is tested for a pair only once their kurtosis contrast has a verdict: lower for the
  scheme (then its quantization drop is predicted smaller) or higher (then the baseline's is);
  a kurtosis contrast without a verdict leaves the drop contrast "not tested: premise absent".

Every run: the task card's quick size, the test split scored again under QUANT after the
ordinary test, none of the analyses these claims do not read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from attnlab.study import stats
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED, ClaimResult, not_tested
from attnlab.study.reproduce import length
from attnlab.study.reproduce.length import Arm, Contrast, Judged, Registration
from attnlab.study.reproduce.length_report import contrast_row

QUANT = "w4a8"  # Bondarenko et al.'s W8A8 barely moves a small model; 4-bit weights show a drop
SINK_RATE, KURTOSIS = "diagnostics/sink_rate", "diagnostics/kurtosis"
DROP = f"test/loss@{QUANT}/drop"  # full-precision minus quantized test loss: <= 0, nearer 0 is better
RUN_EXTRA = (f"quant={QUANT}", "++callbacks.head_diversity=null", "++callbacks.explained_away=null")
PREMISE = 0.05  # UNAS's sink rate must reach this share of heads for a sink claim to be tested
UNAS = Arm("unas")
SOFTPICK, SINK, GATE = Arm("softpick"), Arm("sink"), Arm("unas", ("model.gate=headwise",))
SINK_RATE_MARGIN = {"margin": 0.05, "min_effect": 0.1, "unit": "share of heads",
                    "why_margin": "5 % of the heads: a smaller change is no change in the sink rate"}
KURTOSIS_MARGIN = {"margin": 0.25, "min_effect": 0.5, "unit": "a Gaussian's is 3",
                   "why_margin": "a quarter of a Gaussian's 3: below it the tails are alike"}


def registration(prediction: str, metric: str, pairs: tuple[tuple[Arm, Arm], ...], **margins) -> Registration:
    """A superiority family on one metrics.json metric (lower is better unless it is DROP)."""
    return Registration(prediction=prediction, test=length.SUPERIORITY,
                        contrasts=tuple(Contrast(a, b, key=metric) for a, b in pairs),
                        run_extra=RUN_EXTRA, higher_is_better=metric == DROP, **margins)


def arm_values(plan, results, task, extra, arm: Arm, metric: str, seeds: int) -> list[float]:
    xs = [length.value(results, length.run(plan, task, extra, arm, s, RUN_EXTRA), metric)[0]
          for s in range(1, seeds + 1)]
    return [x for x in xs if math.isfinite(x)]


def judge_family(plan, results, name: str, reg: Registration, task, extra) -> tuple[list[Judged], dict]:
    """The contrasts of one family, each over the seeds its arms ran, and their powers."""
    powers = length.seeds_needed(plan, name, reg, results)
    pairs, by_name = {}, {}
    for c in reg.contrasts:
        n = min(length.arm_seeds(powers, task, extra, a) for a in (c.scheme, c.against))
        pairs[c.name] = length.paired(results, plan, task, extra, c, range(1, n + 1), RUN_EXTRA)
        by_name[c.name] = powers[(task, extra, c)]
    return length.judge(reg, pairs, by_name, plan.mode), by_name


def premise_absent(judged: Judged, why: str) -> Judged:
    """Not tested for want of the premise; a contrast without pairs keeps its own reason (did not
    learn, not run)."""
    if judged.result is None:
        return judged
    return replace(judged, verdict=NOT_TESTED, reason=f"premise absent: {why}")


def sink_premise(plan, results, task, extra, seeds: int) -> tuple[bool, str]:
    """Whether UNAS has sinks to remove, and its measured sink rate in words."""
    rates = arm_values(plan, results, task, extra, UNAS, SINK_RATE, seeds)
    if not rates:
        return False, "no UNAS run measured a sink rate"
    mean = float(np.mean(rates))
    return mean >= PREMISE, (f"UNAS's sink rate is {mean:.3f} (Gu et al.'s eps 0.3, mean over "
                             f"{len(rates)} seed(s)), below {PREMISE}: no sink to remove at this size; "
                             f"a pretrained softmax model has them (`python -m attnlab.diagnose` on "
                             f"the packaged MiniLM)")


@dataclass
class Family:
    """One family's judged contrasts as the report shows them; a premise's (lowbit_kurtosis's
    kurtosis) is shown but does not enter the claim's verdict."""

    title: str
    judged: list[Judged]
    powers: dict
    premise: bool = False


def evaluate(plan, results, claim: dict) -> ClaimResult:
    """`claim`: the claim module's globals; its `families(plan, results, task, extra)` gives
    [Family] for each trained task variant. The claim's verdict is over every contrast that is not
    a premise (length.overall)."""
    families = claim["families"]
    name = claim["NAME"]
    tasks = plan.claim_variants(name)
    skipped = [f"{t}: not run ({plan.skip_reason(t)})" for t, _ in tasks if plan.skip_reason(t)]
    trained = length.variants(plan, name)
    texts = "\n\n".join(r.text() for r in claim["REGISTRATIONS"])
    if not trained:
        return not_tested(name, claim["TITLE"], claim["PAPER"], claim["CLAIM"],
                          "; ".join(skipped) or "no task enters this claim", details=texts)
    judged, details, ours, seeds = [], [texts, ""], [], set()
    for task, extra in trained:
        details += [f"**{plan.label(task, extra)}** ({plan.setting_text(task)} {' '.join(RUN_EXTRA)}):", ""]
        for f in families(plan, results, task, extra):
            family, powers = f.judged, f.powers
            judged += [] if f.premise else family
            seeds |= {p.seeds for p in powers.values()}
            header = "| contrast | scheme | baseline | difference [95% CI] | d_z | p (Holm) | seeds | verdict |"
            details += [f"*{f.title}*" + (" (a premise: not part of the verdict)" if f.premise else ""), "",
                        header, "|---|---|---|---|---|---|---|---|",
                        *(row(j, powers.get(j.name)) for j in family), ""]
            ours += [f"{j.name}: {j.result.scheme_mean:.3f} vs {j.result.baseline_mean:.3f}, "
                     f"{j.result.difference:+.3f} [{j.result.difference_interval[0]:+.3f}, "
                     f"{j.result.difference_interval[1]:+.3f}] ({j.verdict})"
                     if j.result else f"{j.name}: {j.verdict}" for j in family if not f.premise]
    verdict, reason = length.overall(judged)
    return ClaimResult(name=name, title=claim["TITLE"], source=claim["PAPER"], paper=claim["CLAIM"],
                       ours="; ".join(ours),
                       setting="; ".join([plan.setting_text(t) + " " + " ".join(RUN_EXTRA) for t, _ in trained]
                                         + skipped),
                       seeds=f"1-{max(seeds, default=0)} (pilot {length.PILOT[plan.mode]}, cap {length.CAP[plan.mode]})",
                       verdict=verdict, reason=reason, details="\n".join(details))


def row(j: Judged, power) -> str:
    """The length claims' contrast row, with the reason of a verdict that has one."""
    text = contrast_row(j, power)
    if j.result is None or not j.reason:
        return text
    return text[: -len(" |")] + f": {j.reason} |"


def flip(judged: Judged) -> Judged:
    """A drop contrast whose prediction runs the other way (the baseline has the lower kurtosis,
    so the baseline's drop is predicted smaller): a scheme drop judged worse holds, better or
    equivalent contradicts."""
    c = judged.result
    if c is None or judged.verdict == NOT_TESTED:
        return judged
    if c.verdict == stats.WORSE:
        return replace(judged, verdict=HOLDS, reason="")
    return replace(judged, verdict=CONTRADICTED,
                   reason=f"{judged.name}: the baseline has the lower kurtosis but not the smaller drop "
                          f"({c.difference:+.4f} [{c.difference_interval[0]:+.4f}, {c.difference_interval[1]:+.4f}])")


def hooks(claim: dict):
    """`runs`, `more_runs` and `evaluate` of an outlier claim module (its globals: NAME,
    REGISTRATIONS, `families`, ...), what the reproduce registry calls on every claim."""
    name, regs = claim["NAME"], claim["REGISTRATIONS"]

    def runs(plan) -> list:
        return [r for reg in regs for r in length.pilot_runs(plan, name, reg)]

    def more_runs(plan, results) -> list:
        return [r for reg in regs for r in length.more_runs(plan, name, reg, results)]

    def evaluate_claim(plan, results, out_dir) -> ClaimResult:
        return evaluate(plan, results, claim)

    return runs, more_runs, evaluate_claim
