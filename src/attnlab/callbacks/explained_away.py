"""`ExplainedAway`: how much total attention each key (lower-layer unit) receives.

On validation, for every attention layer: the histogram of `log sum_i w_ij` over valid keys, the
share of keys with `sum_i w_ij < threshold` (epsilon-explained-away, the seed paper's 1e-8), and the
minimum column sum next to the DNAS bound `1/S` (S = number of valid keys). DNAS guarantees
`min_j sum_i w_ij * S >= 1`; UNAS does not. A PNG of the histograms goes to the run dir.

Weights are only materialized while this callback records (the first `max_batches` validation
batches of an epoch); the training path never pays for it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytorch_lightning as pl
import torch

from attnlab.attention import attention_modules
from attnlab.callbacks.recording import set_recording
from attnlab.loggers import LoggerAdapter

LOG_FLOOR = 1e-30  # log of an exactly-zero column sum is shown at log(1e-30)


def column_statistics(weights: torch.Tensor, key_padding_mask=None, query_padding_mask=None) -> dict:
    """Column sums of (B, H, S_q, S_k) weights over valid queries, for valid keys only.

    Returns log column sums (flat), the minimum column sum, the number of valid keys of the example
    holding that minimum, and the minimum of `col_sum * S_valid` (>= 1 under the DNAS lemma).
    """
    w = weights.float()
    B, H, _, S_k = w.shape
    if query_padding_mask is not None:
        w = w.masked_fill(query_padding_mask[:, None, :, None], 0.0)
    col = w.sum(dim=2)  # (B, H, S_k)
    valid = torch.ones(B, S_k, dtype=torch.bool, device=w.device)
    if key_padding_mask is not None:
        valid = ~key_padding_mask
    n_valid = valid.sum(-1).clamp(min=1).float()  # (B,)
    valid_bhk = valid[:, None, :].expand(B, H, S_k)
    if query_padding_mask is not None:  # an example without any valid query attends nowhere
        has_query = (~query_padding_mask).any(-1)
        valid_bhk = valid_bhk & has_query[:, None, None]
    if not valid_bhk.any():
        return {"log_col": torch.empty(0), "min": math.nan, "S_at_min": math.nan, "min_times_S": math.nan}
    vals = col[valid_bhk]
    scaled = (col * n_valid[:, None, None])[valid_bhk]
    flat_idx = torch.nonzero(valid_bhk)[vals.argmin()]
    return {
        "log_col": vals.clamp(min=LOG_FLOOR).log().cpu(),
        "min": float(vals.min()),
        "S_at_min": float(n_valid[flat_idx[0]]),
        "min_times_S": float(scaled.min()),
    }


class ExplainedAway(pl.Callback):
    def __init__(self, max_batches: int = 8, threshold: float = 1e-8, png_name: str = "explained_away.png") -> None:
        self.max_batches = int(max_batches)
        self.threshold = float(threshold)
        self.png_name = png_name
        self._stats: dict[int, list[dict]] = {}
        self._names: list[str] = []

    def _modules(self, pl_module):
        return attention_modules(pl_module)

    def _set_recording(self, pl_module, on: bool) -> None:
        set_recording(pl_module, "explained_away", on)  # other analyses may record too

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._stats = {}
        self._set_recording(pl_module, not trainer.sanity_checking and self.max_batches > 0)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking or batch_idx >= self.max_batches:  # later: others' recordings
            return
        modules = self._modules(pl_module)
        self._names = [name for name, _ in modules]
        for l, (_, m) in enumerate(modules):
            rec = getattr(m, "recorded", None)
            if rec is None:
                continue
            self._stats.setdefault(l, []).append(
                column_statistics(rec["weights"], rec.get("key_padding_mask"), rec.get("query_padding_mask"))
            )
        if batch_idx + 1 >= self.max_batches:
            self._set_recording(pl_module, False)

    def summarize(self) -> dict[int, dict]:
        out = {}
        for l, batches in self._stats.items():
            log_col = torch.cat([b["log_col"] for b in batches])
            if log_col.numel() == 0:
                continue
            at_min = min((b for b in batches if not math.isnan(b["min"])), key=lambda b: b["min"])
            out[l] = {
                "log_col": log_col,
                "share": float((log_col < math.log(self.threshold)).float().mean()),
                "min_col_sum": at_min["min"],
                "bound": 1.0 / at_min["S_at_min"],
                "min_col_sum_times_S": min(b["min_times_S"] for b in batches),
            }
        return out

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._set_recording(pl_module, False)
        if trainer.sanity_checking or not self._stats:
            return
        summary = self.summarize()
        log = LoggerAdapter(trainer)
        metrics = {}
        for l, s in summary.items():
            prefix = f"explained_away/layer{l}"
            metrics[f"{prefix}/share_below_{self.threshold:g}"] = s["share"]
            metrics[f"{prefix}/min_col_sum"] = s["min_col_sum"]
            metrics[f"{prefix}/bound_1_over_S"] = s["bound"]
            metrics[f"{prefix}/min_col_sum_times_S"] = s["min_col_sum_times_S"]
            log.histogram(f"{prefix}/log_col_sum", s["log_col"])
        log.scalars(metrics)
        if trainer.is_global_zero:
            path = self.write_png(Path(trainer.default_root_dir) / self.png_name, summary)
            log.image("explained_away/histograms", path)
        self._stats = {}

    def write_png(self, path: Path, summary: dict) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = len(summary)
        fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 1, 3), squeeze=False)
        for ax, (l, s) in zip(axes[0], sorted(summary.items())):
            ax.hist(s["log_col"].numpy(), bins=50, color="tab:blue")
            ax.axvline(math.log(self.threshold), color="tab:red", ls="--", lw=1, label="log 1e-8")
            ax.axvline(math.log(s["bound"]), color="tab:green", ls=":", lw=1, label="log 1/S")
            name = self._names[l] if l < len(self._names) else str(l)
            ax.set_title(f"layer {l} ({name})\nexplained away: {s['share']:.1%}", fontsize=8)
            ax.set_xlabel("log sum_i w_ij")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
