"""Claim: the output gate helps at lengths beyond training (gated-attention paper, Qiu et al.
2025, arXiv 2505.06708, abstract: "we find this sparse gating mechanism mitigates 'attention
sink' and enhances long-context extrapolation performance"). Softmax attention (UNAS) with RoPE,
`model.gate=headwise` (one sigmoid gate per head and token on the attention output, the paper's
head-specific gate: attnlab/attention/gate.py) against no gate, test loss at 4x the training
length (reproduce/length.py)."""

from __future__ import annotations

from attnlab.study.reproduce import length, length_report
from attnlab.study.reproduce.length import Arm, Contrast, Registration

NAME = "length_gate"
TITLE = "Gated attention at 4x the training length"
PAPER = "gated-attention paper (arXiv 2505.06708), abstract and its context-extension results"
CLAIM = ("trained at length L, softmax attention with a head-wise output gate has a lower test "
         "loss at 4L than without it (RoPE positions)")

ROPE = "task.module.net.positions=rope"
REGISTRATION = Registration(
    prediction=("UNAS with model.gate=headwise has a lower test loss at 4x the training length "
                "than UNAS without a gate, both with positions=rope."),
    test=length.SUPERIORITY,
    contrasts=(Contrast(Arm("unas", (ROPE, "model.gate=headwise")), Arm("unas", (ROPE,)), 4),),
    margin=0.05, min_effect=0.05,
    why_margin=("exp(0.05) = 5 % in perplexity: the same unit as the other length claims; "
                "equivalence within it contradicts 'enhances'"),
)


runs, more_runs, evaluate = length_report.hooks(globals())
