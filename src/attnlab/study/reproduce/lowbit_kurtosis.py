"""Claim: the scheme with the lower hidden-state kurtosis loses less when quantized (Bondarenko et
al., NeurIPS 2023, "Quantizable Transformers", Table 2: clipped softmax and gated attention lower
the kurtosis and the W8A8 drop together; the softpick paper's quantization table). For each of
softpick, the learned sink and the head-wise gate against UNAS: the kurtosis contrast decides
which of the two is predicted to lose less test loss under quant=w4a8 (reproduce/outliers.py);
without a kurtosis verdict, or without a drop worth reducing, the pair is "not tested: premise
absent"."""

from __future__ import annotations

import numpy as np

from attnlab.study import stats
from attnlab.study.reproduce import outliers
from attnlab.study.reproduce.outliers import (
    DROP,
    GATE,
    KURTOSIS,
    QUANT,
    SINK,
    SOFTPICK,
    UNAS,
    Family,
)

NAME = "lowbit_kurtosis"
TITLE = f"Lower kurtosis, smaller {QUANT} drop"
PAPER = "Bondarenko et al. (NeurIPS 2023) Table 2; softpick paper (arXiv 2504.20966) quantization table"
CLAIM = (f"of two schemes, the one with the lower hidden-state kurtosis loses less test loss under "
         f"{QUANT} fake quantization")

PAIRS = ((SOFTPICK, UNAS), (SINK, UNAS), (GATE, UNAS))
DROP_PREMISE = 0.01  # nats: the pair's larger mean drop must reach this for a difference to matter
KURTOSES = outliers.registration(
    "the kurtosis of softpick, the learned sink and the gated UNAS against UNAS (the premise: "
    "which of each pair has the lower kurtosis).",
    KURTOSIS, PAIRS, **outliers.KURTOSIS_MARGIN)
DROPS = outliers.registration(
    f"of each pair, the one with the lower kurtosis has the smaller {QUANT} drop in test loss "
    f"(metric {DROP}: full precision minus quantized, nearer 0 is better).",
    DROP, PAIRS, margin=0.005, min_effect=0.01, unit="nats per token",
    why_margin="half a percent in perplexity: a smaller difference is no difference in robustness")
REGISTRATIONS = [KURTOSES, DROPS]


def families(plan, results, task, extra):
    kurtoses, kurtosis_powers = outliers.judge_family(plan, results, NAME, KURTOSES, task, extra)
    drops, drop_powers = outliers.judge_family(plan, results, NAME, DROPS, task, extra)
    judged = []
    for kurtosis, drop, (scheme, against) in zip(kurtoses, drops, PAIRS):
        seeds = drop_powers[drop.name].seeds
        means = [np.mean(v) if (v := outliers.arm_values(plan, results, task, extra, arm, DROP, seeds)) else 0.0
                 for arm in (scheme, against)]
        lost = max(-float(m) for m in means)
        order = kurtosis.result.verdict if kurtosis.result else stats.INCONCLUSIVE
        if lost < DROP_PREMISE:
            judged.append(outliers.premise_absent(drop, f"{QUANT} raises the test loss by at most {lost:.4f} "
                                                        f"nats in this pair, below {DROP_PREMISE}: no drop to reduce"))
        elif order == stats.BETTER:  # the scheme has the lower kurtosis: its drop is predicted smaller
            judged.append(drop)
        elif order == stats.WORSE:
            judged.append(outliers.flip(drop))
        else:
            judged.append(outliers.premise_absent(drop, f"the kurtosis of {scheme.label} and {against.label} "
                                                        f"does not differ ({kurtosis.verdict})"))
    return [Family("kurtosis", kurtoses, kurtosis_powers, premise=True), Family(f"{QUANT} drop", judged, drop_powers)]


runs, more_runs, evaluate = outliers.hooks(globals())
