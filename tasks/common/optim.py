"""Optimizer parameter groups and learning-rate schedules (BERT's, fairseq's inverse square root),
shared by the text tasks."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

from attnlab.attention import scheme_parameters


def parameter_groups(model: nn.Module, weight_decay: float, lr: float,
                     hybrid_lr: float | None = None) -> list[dict]:
    """AdamW/LAMB groups: decayed matrices, undecayed vectors, and the normalizers' own
    parameters (HNAS's u logits, found by type: `attnlab.attention.scheme_parameters`).

    No weight decay on vectors (biases, LayerNorms) nor on the u logits: decay would pull u
    towards 0.5 and bias where HNAS puts its weight.

    `hybrid_lr` (None: `lr`) is the learning rate of the u logits. Adam moves a parameter by at
    most about lr per step whatever its gradient's scale: at lr 1e-3 with warmup and decay a
    logit moves < 0.3 in a 500-step CPU run (u from 0.5 to at most 0.57), while the paper's 125k
    steps allow ~100. A larger hybrid_lr gives the few mixing logits room to move in a short run.
    """
    hybrid = [p for _, p in scheme_parameters(model) if p.requires_grad]
    ids = {id(p) for p in hybrid}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in ids]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    if hybrid:
        groups.append({"params": hybrid, "weight_decay": 0.0, "lr": lr if hybrid_lr is None else hybrid_lr})
    return groups


def warmup_linear_decay(total: int, warmup: int) -> Callable[[int], float]:
    """BERT's schedule as a LambdaLR factor: linear warmup over `warmup` steps, then linear decay to 0."""
    total, warmup = max(1, int(total)), max(0, int(warmup))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """fairseq's `inverse_sqrt` schedule as a LambdaLR factor: linear warmup from 0 over `warmup`
    updates, then lr * sqrt(warmup / step). Update s (0-based) gets factor(s), as fairseq's
    scheduler with its default warmup_init_lr of 0 (the first update runs at lr 0)."""
    warmup = max(1, int(warmup))

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        return math.sqrt(warmup / step)

    return factor
