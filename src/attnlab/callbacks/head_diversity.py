"""`HeadDiversity`: how different the heads of each attention layer are.

On the first `max_batches` validation (and test) batches, for every attention module with at
least two heads:

- Jensen-Shannon divergence between the attention distributions of every pair of heads, per valid
  query row, averaged over rows and batches (CODA, Zheng et al. 2021, Fig. 2/4 and Table 4
  "Avg. JSD"). Natural log: identical heads give 0, heads on disjoint keys give log 2. Rows that
  need not sum to 1 (sigmoid, sink, softpick, stick-breaking) are compared as their distributions
  renormalized over their mass (`attnlab.attention.statistics.row_distributions`). Logged as
  an H x H heatmap per layer (`head_jsd.png` in the run dir, W&B image) and as the layer's mean
  over head pairs; `val/avg_jsd` (`test/avg_jsd`) is the mean over layers.
- The average pairwise L2 distance between the heads' outputs (each head's (d_v,) output before
  the output projection) at every valid query (Repulsive attention, An et al. 2020, Table 1
  "Dist"); `val/head_distance` (`test/head_distance`) is the mean over layers.

Weights are only materialized on those batches, and only in the modules it analyzes, through
`record_attention` opened around each batch (the first forward of each module in the batch);
training never pays, and other recorders (the task's own, other analyses) are unaffected.
Single-head modules (e.g. the VQA fusion with fusion_heads=1) have no pair of heads: they are
skipped (not recorded), with one message.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch

from attnlab.attention import attention_modules, record_attention
from attnlab.attention.statistics import head_distance_sum, jsd_matrix
from attnlab.figures import save_png
from attnlab.loggers import LoggerAdapter


class HeadDiversity(pl.Callback):
    def __init__(self, max_batches: int = 8, png_name: str | None = "head_jsd.png") -> None:
        self.max_batches = int(max_batches)
        self.png_name = png_name
        self._acc: dict[str, dict] = {}
        self._modules: dict[str, object] = {}
        self._recorder: record_attention | None = None
        self._warned = False

    # --- recording, shared by validation and test
    def _start(self, trainer, pl_module) -> None:
        self._acc = {}
        if trainer.sanity_checking or self.max_batches <= 0:
            return
        modules = attention_modules(pl_module)
        self._modules = {name: m for name, m in modules if m.num_heads > 1}
        single = [name for name, m in modules if m.num_heads < 2]
        if single and not self._warned and trainer.is_global_zero:
            self._warned = True
            print(f"[attnlab] head diversity: {len(single)} single-head attention module(s) skipped "
                  f"(JSD and head distance need >= 2 heads): {single}. For the VQA fusion use e.g. "
                  f"task.module.net.fusion_heads=4")

    def _open(self, trainer, batch_idx: int) -> None:
        if not trainer.sanity_checking and batch_idx < self.max_batches and self._modules:
            self._recorder = record_attention(self._modules.items()).open()

    def _collect(self) -> None:
        if self._recorder is None:
            return
        self._recorder.close()
        records, self._recorder = self._recorder.records, None
        for name, rec in records.items():
            m = self._modules[name]
            rows = rec.rows  # from the masks: rows need not sum to 1
            jsd, n = jsd_matrix(rec.weights, rows)
            dist, n_dist = head_distance_sum(rec.head_outputs, rows)
            acc = self._acc.setdefault(name, {"jsd": torch.zeros_like(jsd), "rows": 0, "dist": 0.0,
                                              "dist_rows": 0, "heads": m.num_heads})
            acc["jsd"] += jsd
            acc["rows"] += n
            acc["dist"] += dist
            acc["dist_rows"] += n_dist

    def summarize(self) -> dict[str, dict]:
        out = {}
        for name, acc in self._acc.items():
            if acc["rows"] == 0:
                continue
            h = acc["heads"]
            matrix = acc["jsd"] / acc["rows"]
            out[name] = {
                "jsd": matrix,
                "avg_jsd": float(matrix.sum() / (h * (h - 1))),
                "head_distance": acc["dist"] / max(acc["dist_rows"], 1),
            }
        return out

    def _finish(self, trainer, pl_module, stage: str) -> None:
        if trainer.sanity_checking:
            return
        summary = self.summarize()
        self._acc = {}
        if not summary:
            return
        avg_jsd = sum(s["avg_jsd"] for s in summary.values()) / len(summary)
        avg_dist = sum(s["head_distance"] for s in summary.values()) / len(summary)
        # through self.log: into callback_metrics, hence metrics.json and the sweep report
        pl_module.log(f"{stage}/avg_jsd", avg_jsd, sync_dist=True)
        pl_module.log(f"{stage}/head_distance", avg_dist, sync_dist=True)
        log = LoggerAdapter(trainer)
        names = list(summary)
        index = {name: l for l, (name, _) in enumerate(attention_modules(pl_module))}
        log.scalars({f"head_diversity/{stage}/layer{index[n]}/{k}": summary[n][k]
                     for n in names for k in ("avg_jsd", "head_distance")})
        log.table(f"head_diversity/{stage}/layers", ["layer", "module", "heads", "avg_jsd", "head_distance"],
                  [[index[n], n, int(summary[n]["jsd"].shape[0]), round(summary[n]["avg_jsd"], 5),
                    round(summary[n]["head_distance"], 5)] for n in names])
        if trainer.is_global_zero and self.png_name:  # png_name null: numbers only (probe runs)
            png = self.png_name if stage == "val" else self.png_name.replace(".png", f"_{stage}.png")
            path = self.write_png(Path(trainer.default_root_dir) / png, summary, index)
            log.image(f"head_diversity/{stage}/jsd_heatmaps", path)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._open(trainer, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._open(trainer, batch_idx)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect()

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module, "test")

    @staticmethod
    def write_png(path: Path, summary: dict, index: dict) -> Path:
        import math

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = len(summary)
        cols = min(n, 4)
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols + 1.0, 3.1 * rows), squeeze=False,
                                 constrained_layout=True)
        for ax in axes.flat[n:]:
            ax.axis("off")
        for ax, (name, s) in zip(axes.flat, summary.items()):
            im = ax.imshow(s["jsd"].numpy(), vmin=0.0, vmax=math.log(2), cmap="viridis")
            ax.set_title(f"layer {index[name]} ({name})\navg JSD {s['avg_jsd']:.3f}, dist {s['head_distance']:.2f}",
                         fontsize=7)
            ticks = range(s["jsd"].shape[0])
            ax.set_xticks(ticks)
            ax.set_yticks(ticks)
            ax.set_xlabel("head")
            ax.set_ylabel("head")
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="JSD (nats, max log 2)")
        return save_png(fig, path, dpi=100)
