"""Loss against position at lengths the model never trained at (`task.eval_lengths`).

For each multiple m of the training block (block_size tokens), the test split is scored in
consecutive windows of m * block_size tokens (`LMDataModule.length_loader`), every token once.
A scored token's position is its place in its window, the number of tokens before it that the
model saw; bucket b holds positions [b * block_size, (b + 1) * block_size), so bucket 0 is what
the model trained on and the others are new positions. `LengthCurves` sums -log p (float32
log-probabilities, summed in float64) and the tokens per (length, bucket), sums them over
processes, and gives the metrics and the plot papers show (loss against position, one line per
length; fla's `evals/ppl.py` buckets its perplexity the same way).

Metrics: `test/loss@{m}` (nats per token), `test/ppl@{m}`, `test/tokens@{m}`, and per bucket
`test/loss@{m}/bucket{b}` (only buckets that hold a token) and `test/tokens@{m}/bucket{b}`
(every bucket; they sum to `test/tokens@{m}`, the test split's token count).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from attnlab.figures import save_png

PNG_NAME = "length_generalization.png"


class LengthCurves:
    """Per (length, bucket) sums of -log p and token counts, on `device` until `reduce`."""

    def __init__(self, lengths: Sequence[int], block_size: int, device: torch.device | str = "cpu") -> None:
        self.lengths = [int(m) for m in lengths]
        self.block_size = int(block_size)
        # a window of m blocks has m buckets
        self.nll = {m: torch.zeros(m, dtype=torch.float64, device=device) for m in self.lengths}
        self.tokens = {m: torch.zeros(m, dtype=torch.long, device=device) for m in self.lengths}

    def update(self, multiple: int, nll: Tensor, positions: Tensor) -> None:
        """Add the scored tokens of a batch of multiple-block windows: their -log p and their
        positions in their windows."""
        buckets = positions // self.block_size
        self.nll[multiple] += torch.bincount(buckets, weights=nll.detach().double(), minlength=multiple)
        self.tokens[multiple] += torch.bincount(buckets, minlength=multiple)

    def reduce(self, sum_over_processes: Callable[[Tensor], Tensor]) -> None:
        """Sum every process's counts (each process scored its own windows: EvaluationShards);
        two collectives, the same on every process."""
        nll = sum_over_processes(torch.cat([self.nll[m] for m in self.lengths]))
        tokens = sum_over_processes(torch.cat([self.tokens[m] for m in self.lengths]))
        self.nll = dict(zip(self.lengths, nll.cpu().split(self.lengths)))
        self.tokens = dict(zip(self.lengths, tokens.cpu().split(self.lengths)))

    def bucket_losses(self, multiple: int) -> list[float | None]:
        """Mean -log p per bucket (None: no token at those positions)."""
        return [float(n / t) if t else None for n, t in zip(self.nll[multiple], self.tokens[multiple])]

    def metrics(self, stage: str = "test") -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.lengths:
            total = int(self.tokens[m].sum())
            if total == 0:
                continue
            loss = float(self.nll[m].sum()) / total
            out[f"{stage}/loss@{m}"] = loss
            out[f"{stage}/ppl@{m}"] = math.exp(min(loss, 700.0))
            out[f"{stage}/tokens@{m}"] = float(total)
            for b, (bucket_loss, count) in enumerate(zip(self.bucket_losses(m), self.tokens[m].tolist())):
                if bucket_loss is not None:
                    out[f"{stage}/loss@{m}/bucket{b}"] = bucket_loss
                out[f"{stage}/tokens@{m}/bucket{b}"] = float(count)
        return out

    def write_png(self, path: Path, title: str = "") -> Path:
        """Loss against position (each bucket at its centre, in tokens), one line per length; a
        log2 position axis once the longest window holds 4 blocks or more."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
        for m in self.lengths:
            points = [((b + 0.5) * self.block_size, loss)
                      for b, loss in enumerate(self.bucket_losses(m)) if loss is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", markersize=3,
                        label=f"{m}x ({m * self.block_size} tokens)")
        if max(self.lengths) >= 4:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())  # 128, not 2^7
        ax.axvline(self.block_size, color="grey", linestyle="--", linewidth=1)
        ax.annotate("trained", (self.block_size, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize=8, color="grey")
        ax.set(xlabel="position in the window (tokens, bucket centres)", ylabel="loss (nats per token)",
               title=title or f"test loss by position; trained at {self.block_size} tokens")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8, title="window", title_fontsize=8)
        ax.grid(alpha=0.3)
        return save_png(fig, path)
