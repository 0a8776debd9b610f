"""`HybridWeights`: the HNAS mix `u` of every layer and head over training.

Logs `hnas/u/layer{l}/head{h}` and the per-layer mean `hnas/u/layer{l}` every N steps, one chart
with a line per layer at the end (W&B), and writes `hnas_u.png` (the trajectories) to the run dir.
Layer `l` is the position of the module among the model's HNAS attention modules.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from attnlab.attention import hybrid_u_per_layer
from attnlab.loggers import LoggerAdapter


class HybridWeights(pl.Callback):
    def __init__(self, every_n_steps: int = 25, png_name: str = "hnas_u.png") -> None:
        self.every_n_steps = max(1, int(every_n_steps))
        self.png_name = png_name
        self.steps: list[int] = []
        self.values: list[list[list[float]]] = []  # [record][layer][head]
        self.layer_names: list[str] = []

    def _record(self, trainer, pl_module) -> None:
        layers = hybrid_u_per_layer(pl_module)
        step = int(trainer.global_step)
        if not layers or (self.steps and self.steps[-1] == step):
            return
        self.layer_names = list(layers)
        u = [values.tolist() for values in layers.values()]
        self.steps.append(step)
        self.values.append(u)
        metrics = {}
        for l, heads in enumerate(u):
            metrics[f"hnas/u/layer{l}"] = sum(heads) / len(heads)
            if len(heads) > 1:
                metrics.update({f"hnas/u/layer{l}/head{h}": v for h, v in enumerate(heads)})
        LoggerAdapter(trainer).scalars(metrics, step=step)

    def on_train_start(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._record(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module)
        if not self.steps or not trainer.is_global_zero:
            return
        n_layers = len(self.values[-1])
        means = {
            f"layer{l}": [sum(rec[l]) / len(rec[l]) for rec in self.values] for l in range(n_layers)
        }
        log = LoggerAdapter(trainer)
        log.line_series("hnas/u_per_layer", self.steps, means, title="HNAS u per layer", xname="step")
        path = self.write_png(Path(trainer.default_root_dir) / self.png_name)
        log.image("hnas/u_trajectories", path)

    def write_png(self, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n_layers = len(self.values[-1])
        fig, ax = plt.subplots(figsize=(7, 4))
        colors = plt.cm.viridis([l / max(1, n_layers - 1) for l in range(n_layers)])
        for l in range(n_layers):
            n_heads = len(self.values[-1][l])
            for h in range(n_heads if n_heads > 1 else 0):
                ax.plot(self.steps, [rec[l][h] for rec in self.values], color=colors[l], alpha=0.2, lw=0.8)
            mean = [sum(rec[l]) / len(rec[l]) for rec in self.values]
            ax.plot(self.steps, mean, color=colors[l], lw=2, label=f"layer {l}")
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set(xlabel="training step", ylabel="u (weight of DNAS)", ylim=(0, 1),
               title="HNAS hybrid weights (thin: heads, thick: layer mean)")
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    # the trajectory survives a resume
    def state_dict(self) -> dict:
        return {"steps": self.steps, "values": self.values}

    def load_state_dict(self, state_dict: dict) -> None:
        self.steps = list(state_dict.get("steps", []))
        self.values = list(state_dict.get("values", []))
