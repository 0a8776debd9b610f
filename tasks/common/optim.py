"""Learning-rate schedules as LambdaLR factors (BERT's, cosine, fairseq's inverse square root), and
the scheduler factories the task configs name as `task.module.scheduler` partials.

A factory takes the optimizer and, when it needs the run's length, `total_steps` (TaskModule
passes `trainer.estimated_stepping_batches`); `warmup` is a share of the steps when < 1, else a
number of steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_steps(warmup: float, total: int) -> int:
    # a warmup longer than the run (a short run of a paper's recipe) spans the run
    return int(warmup * total) if warmup < 1 else min(int(warmup), total)


def warmup_linear_decay(total: int, warmup: int) -> Callable[[int], float]:
    """BERT's schedule as a LambdaLR factor: linear warmup over `warmup` steps, then linear decay to 0."""
    total, warmup = max(1, int(total)), max(0, int(warmup))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def warmup_cosine(total: int, warmup: int, min_ratio: float) -> Callable[[int], float]:
    """LambdaLR factor: linear warmup, then a half cosine from 1 down to `min_ratio` at `total`
    (fairseq's cosine schedule with one period, as transformer_lm_wiki103 trains)."""
    total, warmup = max(1, int(total)), max(0, int(warmup))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

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


def linear_schedule(optimizer: Optimizer, total_steps: int, warmup: float) -> LambdaLR:
    """`warmup_linear_decay` over the run (task.module.scheduler: BERT's); `warmup` has no default:
    each task's YAML gives its own (headline 100 steps, mlm 6 %, lm 5 %)."""
    total = max(1, int(total_steps))
    return LambdaLR(optimizer, warmup_linear_decay(total, warmup_steps(warmup, total)))


def cosine_schedule(optimizer: Optimizer, total_steps: int, warmup: float = 0.0,
                    min_lr: float = 0.0) -> LambdaLR:
    """`warmup_cosine` over the run, down to `min_lr` (a rate: divided by the optimizer's lr)."""
    total = max(1, int(total_steps))
    ratio = min_lr / optimizer.defaults["lr"]
    return LambdaLR(optimizer, warmup_cosine(total, warmup_steps(warmup, total), ratio))


def inverse_sqrt_schedule(optimizer: Optimizer, warmup: int) -> LambdaLR:
    """`inverse_sqrt` (task.module.scheduler: fairseq's), warmup in steps."""
    return LambdaLR(optimizer, inverse_sqrt(warmup))
