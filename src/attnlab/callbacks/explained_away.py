"""`ExplainedAway`: how much total attention each key (lower-layer unit) receives.

On validation, for every attention layer: the histogram of `log sum_i w_ij` over valid keys, the
share of keys with `sum_i w_ij < threshold` (epsilon-explained-away, the seed paper's 1e-8), and the
minimum column sum next to the DNAS bound `1/S` (S = number of valid keys). DNAS guarantees
`min_j sum_i w_ij * S >= 1`; UNAS does not. Beside them the attention entropy
`-sum_j p_ij log p_ij` (nats) of each row's distribution `p_i = w_i / sum_j w_ij`, averaged over
heads and valid query rows: how sharp each layer's attention is (log S: uniform; 0: one key),
which tells a scheme that explains keys away by sharpening from one that spreads its weight; and
the unassigned mass `1 - sum_j w_ij` (mean and histogram): 0 under a normalizing scheme, the weight a
sink, softpick or stick-breaking row leaves unspent (attention sinks, the mirror image of
explaining away: a row attends nowhere rather than a key getting no attention). Both follow the
one definition in `attnlab.attention.statistics` for rows that need not sum to 1. The scalars go
through `self.log` (so into metrics.json and every logger), the histograms to W&B/TensorBoard and
a PNG in the run dir.

Weights are only materialized on the first `max_batches` validation batches of an epoch, through
`record_attention` opened around each of them; the training path never pays for it. The numbers
come from `attnlab.attention.ColumnStats` and `RowStats` (reduced across DDP processes).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytorch_lightning as pl

from attnlab.attention import ColumnStats, attention_modules, record_attention
from attnlab.attention.statistics import RowStats
from attnlab.figures import save_png
from attnlab.loggers import LoggerAdapter


class ExplainedAway(pl.Callback):
    def __init__(self, max_batches: int = 8, threshold: float = 1e-8,
                 png_name: str | None = "explained_away.png") -> None:
        self.max_batches = int(max_batches)
        self.threshold = float(threshold)
        self.png_name = png_name
        self._stats: dict[int, ColumnStats] = {}
        self._rows: dict[int, RowStats] = {}  # entropy and unassigned mass, reduced like the sums
        self._names: list[str] = []
        self._recorder: record_attention | None = None

    def _active(self, trainer, batch_idx: int) -> bool:
        return not trainer.sanity_checking and batch_idx < self.max_batches

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._stats, self._rows = {}, {}
        self._names = [name for name, _ in attention_modules(pl_module)]

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self._active(trainer, batch_idx):
            self._recorder = record_attention(pl_module).open()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self._recorder is None:
            return
        self._recorder.close()
        for l, name in enumerate(self._names):
            rec = self._recorder.records.get(name)
            if rec is None:
                continue
            stats = self._stats.get(l)
            if stats is None:
                stats = self._stats[l] = ColumnStats(threshold=self.threshold).to(pl_module.device)
            stats.update(rec.column_sums, rec.key_padding_mask, rec.query_padding_mask)
            if l not in self._rows:
                self._rows[l] = RowStats().to(pl_module.device)
            self._rows[l].update(rec.weights, rec.key_padding_mask, rec.query_padding_mask)
        self._recorder = None

    def summarize(self) -> dict[int, dict]:
        out = {}
        for l, stats in sorted(self._stats.items()):
            values = stats.compute()
            if math.isnan(float(values["explained_away"])):
                continue
            out[l] = {"log_col": stats.log_column_sums(), **{k: float(v) for k, v in values.items()}}
            if l in self._rows and self._rows[l].count > 0:
                out[l].update({k: float(v) for k, v in self._rows[l].compute().items()})
                out[l]["sinks"] = self._rows[l].unassigned_masses()
        return out

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not self._stats:
            return
        summary = self.summarize()
        log = LoggerAdapter(trainer)
        for l, s in summary.items():
            prefix = f"explained_away/layer{l}"
            for key, name in ((f"share_below_{self.threshold:g}", "explained_away"),
                              ("min_col_sum", "min_col_sum"), ("bound_1_over_S", "bound_1_over_S"),
                              ("min_col_sum_times_S", "min_col_sum_x_S")):
                pl_module.log(f"{prefix}/{key}", s[name])  # already reduced over processes
            for key in ("entropy", "unassigned_mass"):
                if key in s:
                    pl_module.log(f"{prefix}/{key}", s[key])
            log.histogram(f"{prefix}/log_col_sum", s["log_col"])
            if "sinks" in s:
                log.histogram(f"{prefix}/unassigned_mass_rows", s["sinks"])
        if trainer.is_global_zero and summary and self.png_name:  # null: numbers only
            path = self.write_png(Path(trainer.default_root_dir) / self.png_name, summary)
            log.image("explained_away/histograms", path)
        self._stats, self._rows = {}, {}

    def write_png(self, path: Path, summary: dict) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = len(summary)
        fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 1, 3), squeeze=False)
        for ax, (l, s) in zip(axes[0], sorted(summary.items())):
            ax.hist(s["log_col"].numpy(), bins=50, color="tab:blue")
            ax.axvline(math.log(self.threshold), color="tab:red", ls="--", lw=1, label="log 1e-8")
            ax.axvline(math.log(s["bound_1_over_S"]), color="tab:green", ls=":", lw=1, label="log 1/S")
            name = self._names[l] if l < len(self._names) else str(l)
            ax.set_title(f"layer {l} ({name})\nexplained away: {s['explained_away']:.1%}", fontsize=8)
            ax.set_xlabel("log sum_i w_ij")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        return save_png(fig, path, dpi=100)
