"""`SchemeParameters`: what the schemes' own parameters do over training, whatever the scheme
(HNAS's mix u, a sink's b, SSMax's c, diff's lambda, the output gate, ...), as each scheme module
reports them (`SchemeModule.reported`).

For each reported quantity `<scheme>_<name>` (e.g. `hnas_u`) it logs `<scheme>/<name>/layer{l}`
(the layer mean) and `<scheme>/<name>/layer{l}/head{h}` every N steps, one chart with a line per
layer at the end (W&B), and writes `<scheme>_<name>.png` (the trajectories) to the run dir.
Layer `l` is the position of the attention module among those reporting that quantity.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from attnlab.attention import scheme_values
from attnlab.attention.schemes import reported_label
from attnlab.figures import save_png
from attnlab.fsdp import full_parameters
from attnlab.loggers import LoggerAdapter


class SchemeParameters(pl.Callback):
    def __init__(self, every_n_steps: int = 25) -> None:
        self.every_n_steps = max(1, int(every_n_steps))
        # {quantity: {"steps": [...], "values": [record][layer][head]}}
        self.history: dict[str, dict[str, list]] = {}

    def _record(self, trainer, pl_module) -> None:
        step = int(trainer.global_step)
        metrics = {}
        with full_parameters(pl_module):  # under FSDP each rank holds a shard of them
            reported = scheme_values(pl_module)
        for key, layers in reported.items():
            history = self.history.setdefault(key, {"steps": [], "values": []})
            if history["steps"] and history["steps"][-1] == step:
                continue
            values = [v.tolist() for v in layers.values()]
            history["steps"].append(step)
            history["values"].append(values)
            prefix = key.replace("_", "/", 1)  # hnas_u -> hnas/u
            for l, heads in enumerate(values):
                metrics[f"{prefix}/layer{l}"] = sum(heads) / len(heads)
                if len(heads) > 1:
                    metrics.update({f"{prefix}/layer{l}/head{h}": v for h, v in enumerate(heads)})
        if metrics:
            LoggerAdapter(trainer).scalars(metrics, step=step)

    def on_train_start(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._record(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module)
        if not trainer.is_global_zero:
            return
        log = LoggerAdapter(trainer)
        for key, history in self.history.items():
            steps, values = history["steps"], history["values"]
            prefix = key.replace("_", "/", 1)
            means = {f"layer{l}": [sum(rec[l]) / len(rec[l]) for rec in values]
                     for l in range(len(values[-1]))}
            log.line_series(f"{prefix}_per_layer", steps, means, title=f"{key} per layer",
                            xname="step")
            path = self.write_png(key, Path(trainer.default_root_dir) / f"{key}.png")
            log.image(f"{prefix}_trajectories", path)

    def write_png(self, key: str, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps, values = self.history[key]["steps"], self.history[key]["values"]
        n_layers = len(values[-1])
        fig, ax = plt.subplots(figsize=(7, 4))
        colors = plt.cm.viridis([l / max(1, n_layers - 1) for l in range(n_layers)])
        for l in range(n_layers):
            n_heads = len(values[-1][l])
            for h in range(n_heads if n_heads > 1 else 0):
                ax.plot(steps, [rec[l][h] for rec in values], color=colors[l], alpha=0.2, lw=0.8)
            mean = [sum(rec[l]) / len(rec[l]) for rec in values]
            ax.plot(steps, mean, color=colors[l], lw=2, label=f"layer {l}")
        ax.set(xlabel="training step", ylabel=reported_label(key),
               title=f"{key} (thin: heads, thick: layer mean)")
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        return save_png(fig, path, dpi=110)

    # the trajectories survive a resume
    def state_dict(self) -> dict:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        if "history" in state_dict:
            self.history = {k: {"steps": list(h["steps"]), "values": list(h["values"])}
                            for k, h in state_dict["history"].items()}
        elif state_dict.get("steps"):  # a checkpoint of the HNAS-only callback before it
            self.history = {"hnas_u": {"steps": list(state_dict["steps"]),
                                       "values": list(state_dict["values"])}}
