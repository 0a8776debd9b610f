"""Claim: stick-breaking attention with no position encoding is at least as good as softmax with
RoPE at 4x the training length (stick-breaking paper, arXiv 2410.17980, abstract: as "a drop-in
replacement for current softmax+RoPE attention systems ... stick-breaking attention performs
competitively with current methods on length generalisation", trained at 2^11 and tested at
2^14). A non-inferiority test with a pre-registered margin (reproduce/length.py)."""

from __future__ import annotations

from attnlab.study.reproduce import length, length_report
from attnlab.study.reproduce.length import Arm, Contrast, Registration

NAME = "length_stickbreaking"
TITLE = "Stick-breaking without positions vs softmax with RoPE at 4x"
PAPER = "stick-breaking paper (arXiv 2410.17980), abstract and its length-generalisation results"
CLAIM = ("trained at length L, stick-breaking with no position encoding is at least as good as "
         "softmax (UNAS) with RoPE at 4L")

REGISTRATION = Registration(
    prediction=("stick-breaking's test loss at 4x the training length, positions=none, is at most "
                "0.05 nats per token above UNAS's with positions=rope (non-inferiority)."),
    test=length.NONINFERIORITY,
    contrasts=(Contrast(Arm("stickbreaking", ("task.module.net.positions=none",)),
                        Arm("unas", ("task.module.net.positions=rope",)), 4),),
    margin=0.05, min_effect=0.05,
    why_margin=("exp(0.05) = 5 % in perplexity: 'performs competitively' allows a loss this much "
                "higher and no more; the same unit as the SSMax claim's margin"),
)


runs, more_runs, evaluate = length_report.hooks(globals())
