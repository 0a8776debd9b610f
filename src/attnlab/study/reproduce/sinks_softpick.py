"""Claim: softpick and a learned sink logit lower the attention-sink rate and the hidden-state
kurtosis against softmax attention (softpick paper, arXiv 2504.20966, Table 1: sink rate 0 and
lower kurtosis than softmax; Gu et al., ICLR 2025, "When attention sink emerges", section 7: a
learnable sink token or a normalization without the sum-to-one constraint removes the sink).
Two families, Holm within each: the sink rate (tested only where UNAS has sinks:
reproduce/outliers.py) and the kurtosis."""

from __future__ import annotations

from attnlab.study.reproduce import outliers
from attnlab.study.reproduce.outliers import KURTOSIS, SINK, SINK_RATE, SOFTPICK, UNAS, Family

NAME = "sinks_softpick"
TITLE = "Softpick and a learned sink against the attention sink and outliers"
PAPER = "softpick paper (arXiv 2504.20966) Table 1; Gu et al. (ICLR 2025) section 7"
CLAIM = ("softpick and a learned sink logit each give a lower sink rate and a lower hidden-state "
         "kurtosis than softmax attention")

SINK_RATES = outliers.registration(
    "softpick and the learned sink (model=sink) each have a lower sink rate (Gu et al., eps 0.3) "
    "than UNAS; tested where UNAS's own sink rate reaches the premise.",
    SINK_RATE, ((SOFTPICK, UNAS), (SINK, UNAS)), **outliers.SINK_RATE_MARGIN)
KURTOSES = outliers.registration(
    "softpick and the learned sink each have a lower mean hidden-state kurtosis (Bondarenko et al., "
    "over the layers) than UNAS.",
    KURTOSIS, ((SOFTPICK, UNAS), (SINK, UNAS)), **outliers.KURTOSIS_MARGIN)
REGISTRATIONS = [SINK_RATES, KURTOSES]


def families(plan, results, task, extra):
    rates, rate_powers = outliers.judge_family(plan, results, NAME, SINK_RATES, task, extra)
    seeds = max(p.seeds for p in rate_powers.values())
    present, why = outliers.sink_premise(plan, results, task, extra, seeds)
    if not present:
        rates = [outliers.premise_absent(j, why) for j in rates]
    kurtoses, kurtosis_powers = outliers.judge_family(plan, results, NAME, KURTOSES, task, extra)
    return [Family("sink rate", rates, rate_powers), Family("kurtosis", kurtoses, kurtosis_powers)]


runs, more_runs, evaluate = outliers.hooks(globals())
