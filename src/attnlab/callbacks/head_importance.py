"""`HeadImportance`: how much the task metric drops when one attention head is masked.

Michel et al. (2019), as in Repulsive attention (An et al. 2020, Fig. 2): after training and
testing, for attention heads of modules with at least two heads, the head's output is zeroed
(before the output projection; for modules without one, its slice of the output) and the task's
`optimized_metric` is measured on the first `max_batches` validation batches. The drop (baseline
minus masked, sign-adjusted so that positive = the head mattered) goes to `head_importance.csv`,
`head_importance.png` (layer x head map and histogram of drops), a W&B table, and
`head_importance/{base,mean_drop,max_drop}` into metrics.json.

Its cost is (heads measured + 1) validations, and one validation of a decoding task (greedy
BLEU) takes seconds: by default at most `max_heads` heads are measured, a sample drawn with
`seed` from every (layer, head), and one line says how many were left out. Full runs set
`callbacks.head_importance.max_heads=null` (every head) and `max_batches=null` (every val batch).

It is an `AfterTestAnalysis`: the runner calls `after_test` once test is done (with the tested,
i.e. best, weights). The masked evaluations use a separate quiet Trainer (no loggers, no
callbacks), so the run's logs and analyses see none of them. That Trainer evaluates a shallow
copy of the module (every parameter, buffer and submodule shared, nothing copied), so it
attaches itself to the copy and the module and the datamodule stay the run's.
"""

from __future__ import annotations

import contextlib
import copy
import csv
from pathlib import Path

import pytorch_lightning as pl
import torch

from attnlab.attention import MultiHeadAttention, attention_modules
from attnlab.callbacks.after_test import AfterTestAnalysis, analysis_progress, quiet_lightning
from attnlab.errors import ConfigError
from attnlab.figures import save_png
from attnlab.loggers import LoggerAdapter

# Lightning's name of the accelerator for a torch device type
ACCELERATORS = {"cpu": "cpu", "cuda": "gpu", "mps": "mps"}


@contextlib.contextmanager
def masked_head(module: MultiHeadAttention, head: int):
    """Zero head `head`'s output of `module` inside the block (hooks, no change to the module)."""
    width = module.out_dim // module.num_heads if module.out_proj is None else module.head_dim
    cols = slice(head * width, (head + 1) * width)

    def zero(x):
        x = x.clone()
        x[..., cols] = 0
        return x

    if module.out_proj is not None:  # its input is the concatenation of the heads, head-major
        handle = module.out_proj.register_forward_pre_hook(lambda _m, args: (zero(args[0]), *args[1:]))
    else:
        handle = module.register_forward_hook(lambda _m, _args, out: zero(out))
    try:
        yield
    finally:
        handle.remove()


class HeadImportance(pl.Callback, AfterTestAnalysis):
    def __init__(self, max_heads: int | None = 8, max_batches: int | None = 4, seed: int = 0,
                 png_name: str = "head_importance.png",
                 csv_name: str = "head_importance.csv") -> None:
        if max_heads is not None and int(max_heads) < 1:
            raise ConfigError(f"callbacks.head_importance.max_heads={max_heads}: give a number of "
                              f"heads >= 1, or null for every head")
        if max_batches is not None and int(max_batches) < 0:
            raise ConfigError(f"callbacks.head_importance.max_batches={max_batches}: give a number "
                              f"of val batches >= 0 (0 switches the analysis off), or null for "
                              f"every batch")
        self.max_heads = None if max_heads is None else int(max_heads)
        self.max_batches = None if max_batches is None else int(max_batches)
        self.seed = int(seed)
        self.png_name, self.csv_name = png_name, csv_name

    def chosen_heads(self, layers: list) -> tuple[list[tuple[int, str, MultiHeadAttention, int]],
                                                  int]:
        """(layer, name, module, head) to mask, in layer order (a seeded sample of at most
        max_heads), and the number of heads there are."""
        every = [(l, name, m, h) for l, name, m in layers for h in range(m.num_heads)]
        if self.max_heads is None or len(every) <= self.max_heads:
            return every, len(every)
        order = torch.randperm(len(every), generator=torch.Generator().manual_seed(self.seed))
        return [every[i] for i in sorted(order[: self.max_heads].tolist())], len(every)

    def _evaluator(self, trainer: pl.Trainer) -> pl.Trainer:
        # the run's device (its Trainer moved the module back to the CPU when test ended)
        device = trainer.strategy.root_device
        return pl.Trainer(
            accelerator=ACCELERATORS.get(device.type, device.type),
            devices=[device.index] if device.type == "cuda" and device.index is not None else 1,
            precision=trainer.precision, logger=False, callbacks=[], enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            limit_val_batches=1.0 if self.max_batches is None else self.max_batches,
            num_sanity_val_steps=0,
        )

    def after_test(self, trainer, module, datamodule, metric: str,
                   mode: str = "max") -> dict[str, float]:
        """Mask the chosen heads in turn; returns the summary numbers for metrics.json."""
        layers = [(l, name, m) for l, (name, m) in enumerate(attention_modules(module))
                  if m.num_heads > 1]
        if self.max_batches == 0:
            return {}
        if not layers:
            print("[attnlab] head importance: no attention module with >= 2 heads, skipped")
            return {}
        if trainer.world_size > 1:
            print("[attnlab] head importance: skipped under multi-process training; run it on one "
                  "device")
            return {}
        heads, total = self.chosen_heads(layers)
        batches = ("every val batch" if self.max_batches is None
                   else f"{self.max_batches} val batch(es)")
        measured = f"{len(heads)} of {total} heads"
        sampled = (f" (a sample, seed {self.seed}; callbacks.head_importance.max_heads=null "
                   f"measures all)") if len(heads) < total else ""
        print(f"[attnlab] head importance: {measured}{sampled}, {metric} on {batches} each")
        view = copy.copy(module)  # shares every weight; the evaluator attaches to it, not to module
        loader = datamodule.val_dataloader() if datamodule is not None else None

        def score() -> float:
            results = evaluator.validate(view, dataloaders=loader, verbose=False)
            if not results or metric not in results[0]:
                raise KeyError(f"head importance: validation did not log {metric}")
            return float(results[0][metric])

        sign = 1.0 if mode == "max" else -1.0
        rows = []
        with quiet_lightning(), analysis_progress(trainer, "head importance: unmasked",
                                                  len(heads) + 1) as advance:
            evaluator = self._evaluator(trainer)
            base = score()
            for l, name, m, h in heads:
                advance(f"head importance: layer {l} head {h}")
                with masked_head(m, h):
                    value = score()
                rows.append({"layer": l, "module": name, "head": h, metric: value,
                             "drop": sign * (base - value)})
            advance("head importance")
        drops = [r["drop"] for r in rows]
        summary = {"head_importance/base": base,
                   "head_importance/mean_drop": sum(drops) / len(drops),
                   "head_importance/max_drop": max(drops)}
        if trainer.is_global_zero:
            out_dir = Path(trainer.default_root_dir)
            self.write_csv(out_dir / self.csv_name, rows, metric)
            path = self.write_png(out_dir / self.png_name, rows, layers, metric)
            log = LoggerAdapter(trainer)
            log.scalars(summary)
            log.table("head_importance/table", ["layer", "module", "head", metric, "drop"],
                      [[r["layer"], r["module"], r["head"], round(r[metric], 5), round(r["drop"], 5)]
                       for r in rows])
            log.histogram("head_importance/drops", torch.tensor(drops))
            log.image("head_importance/plot", path)
            print(f"[attnlab] head importance ({metric}, {measured}): base {base:.4f}, "
                  f"mean drop {summary['head_importance/mean_drop']:.4f}, max drop "
                  f"{summary['head_importance/max_drop']:.4f} -> {out_dir / self.csv_name}")
        return summary

    @staticmethod
    def write_csv(path: Path, rows: list[dict], metric: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["layer", "module", "head", metric, "drop"])
            writer.writeheader()
            writer.writerows(rows)

    @staticmethod
    def write_png(path: Path, rows: list[dict], layers: list, metric: str) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        max_heads = max(m.num_heads for _, _, m in layers)
        grid = torch.full((len(layers), max_heads), float("nan"))
        position = {l: i for i, (l, _, _) in enumerate(layers)}
        for r in rows:
            grid[position[r["layer"]], r["head"]] = r["drop"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 0.35 * len(layers) + 2.5))
        lim = max(float(grid.nan_to_num(0).abs().max()), 1e-6)  # white = no drop
        cmap = plt.get_cmap("coolwarm").with_extremes(bad="lightgrey")  # heads left out (max_heads)
        im = ax1.imshow(grid.numpy(), cmap=cmap, aspect="auto", vmin=-lim, vmax=lim)
        ax1.set_yticks(range(len(layers)), [f"{l} {name}" for l, name, _ in layers], fontsize=6)
        ax1.set_xlabel("head")
        unmeasured = int(grid.isnan().sum()) - sum(max_heads - m.num_heads for _, _, m in layers)
        ax1.set_title(f"drop of {metric} when the head is masked"
                      + (f" (grey: {unmeasured} not measured)" if unmeasured else ""), fontsize=8)
        fig.colorbar(im, ax=ax1)
        ax2.hist([r["drop"] for r in rows], bins=20, color="tab:blue")
        ax2.axvline(0, color="grey", lw=1)
        ax2.set_xlabel(f"drop of {metric}")
        ax2.set_ylabel("heads")
        fig.tight_layout()
        return save_png(fig, path, dpi=100)
