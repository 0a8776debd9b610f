"""Claim: SSMax's test loss beyond the training length is lower than softmax's (SSMax paper,
arXiv 2501.19399, abstract: models using SSMax "significantly improve performance in long
contexts"; softmax's attention flattens as the context grows, SSMax's scale log n keeps it
focused). Trained at the task's block size L, tested at 4L and 8L, with no positions and with
RoPE: four contrasts, one family (reproduce/length.py judges it)."""

from __future__ import annotations

from attnlab.study.reproduce import length, length_report
from attnlab.study.reproduce.length import Arm, Contrast, Registration

NAME = "length_ssmax"
TITLE = "SSMax at 4x and 8x the training length"
PAPER = "SSMax paper (arXiv 2501.19399), abstract and its long-context loss"
CLAIM = ("trained at length L, SSMax's test loss at 4L and 8L is lower than softmax's (UNAS), with "
         "no position encoding and with RoPE")

NONE, ROPE = "task.module.net.positions=none", "task.module.net.positions=rope"
REGISTRATION = Registration(
    prediction=("SSMax's test loss per token at 4x and 8x the training length is lower than "
                "UNAS's, at positions=none and at positions=rope (4 contrasts, each must hold)."),
    test=length.SUPERIORITY,
    contrasts=tuple(Contrast(Arm("ssmax", (p,)), Arm("unas", (p,)), m)
                    for p in (NONE, ROPE) for m in (4, 8)),
    margin=0.05, min_effect=0.05,
    why_margin=("exp(0.05) = 5 % in perplexity: a smaller gain is not what the paper reports as "
                "better at long context; equivalence within it contradicts 'lower'"),
)


runs, more_runs, evaluate = length_report.hooks(globals())
