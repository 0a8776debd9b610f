"""Claim: a head-wise sigmoid gate on the attention output lowers the attention-sink rate
(gated-attention paper, Qiu et al. 2025, arXiv 2505.06708: the gate "mitigates 'attention sink'",
the first token's attention share falling from 46.7 % to 4.8 %). UNAS with `model.gate=headwise`
against UNAS; tested only where UNAS has sinks (reproduce/outliers.py)."""

from __future__ import annotations

from attnlab.study.reproduce import outliers
from attnlab.study.reproduce.outliers import GATE, SINK_RATE, UNAS, Family

NAME = "sinks_gate"
TITLE = "The output gate against the attention sink"
PAPER = "gated-attention paper (arXiv 2505.06708), abstract and its sink analysis"
CLAIM = "softmax attention with a head-wise output gate has a lower sink rate than without it"

SINK_RATES = outliers.registration(
    "UNAS with model.gate=headwise has a lower sink rate (Gu et al., eps 0.3) than UNAS without a "
    "gate; tested where UNAS's own sink rate reaches the premise.",
    SINK_RATE, ((GATE, UNAS),), **outliers.SINK_RATE_MARGIN)
REGISTRATIONS = [SINK_RATES]


def families(plan, results, task, extra):
    rates, powers = outliers.judge_family(plan, results, NAME, SINK_RATES, task, extra)
    present, why = outliers.sink_premise(plan, results, task, extra, max(p.seeds for p in powers.values()))
    if not present:
        rates = [outliers.premise_absent(j, why) for j in rates]
    return [Family("sink rate", rates, powers)]


runs, more_runs, evaluate = outliers.hooks(globals())
