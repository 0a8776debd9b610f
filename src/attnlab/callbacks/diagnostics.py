"""`OutlierDiagnostics`: attention sinks and activation outliers per layer, at the end of test.

On the first `max_batches` test batches it records every layer's attention weights (through
`record_attention`) and hidden state, and reports per layer and for the model the numbers
`attnlab.diagnostics` defines: sink rate (eps 0.3 and 0.2), share of exactly-zero weights,
kurtosis (Bondarenko's, and pooled), largest and median |activation|. They go through
`self.log` (`diagnostics/layer{l}/<name>`, `diagnostics/<name>`: into metrics.json and every
logger), the per-head sink importances and per-sequence kurtoses to W&B as histograms, and
`diagnostics.json` and `diagnostics.png` into the run dir. `python -m attnlab.diagnose` runs the
same on any checkpoint or local `transformers` model.

A layer is a transformer layer (`TransformerEncoderLayer` / `TransformerDecoderLayer`): its
attention is its self-attention (the first attention module in it), its hidden state its output
(the residual stream after it, what the papers measure). An attention module outside such a layer
(VQA's fusion, classify's hops) is a layer of its own whose hidden state is the module's output.
The hidden states are read with forward hooks that the callback adds around each recorded batch
and removes after it (observation only, as Bondarenko's `attach_act_hooks`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import pytorch_lightning as pl
from torch import Tensor, nn

from attnlab.attention import attention_modules, record_attention
from attnlab.attention.layers import TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.diagnostics import EPSILONS, LayerOutliers, check_options, summarize
from attnlab.figures import save_png
from attnlab.files import atomic_write_text
from attnlab.loggers import LoggerAdapter

PREFIX = "diagnostics"


def model_layers(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module]]:
    """[(name, attention module, module whose output is the layer's hidden state)] in order."""
    modules = dict(model.named_modules())
    layers, seen = [], set()
    for name, attention in attention_modules(model):
        full = next(n for n, m in modules.items() if m is attention)
        parent = modules.get(full.rsplit(".", 1)[0]) if "." in full else None
        if isinstance(parent, (TransformerEncoderLayer, TransformerDecoderLayer)):
            if id(parent) in seen:  # a decoder layer's cross-attention: its self-attention counts
                continue
            seen.add(id(parent))
            layers.append((name, attention, parent))
        else:
            layers.append((name, attention, attention))
    return layers


def first_tensor(output) -> Tensor | None:
    """A module's output as one (B, S, E) tensor: itself, a tuple's first, a carry's `x`."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    x = getattr(output, "x", None)
    return x if isinstance(x, Tensor) else None


@contextmanager
def capture_outputs(modules: list[nn.Module]):
    """{index: the first output of modules[index]} of the forwards inside the block."""
    seen: dict[int, Tensor] = {}
    handles = []
    for i, module in enumerate(modules):
        def hook(mod, args, output, i=i):
            if i not in seen and (x := first_tensor(output)) is not None:
                seen[i] = x.detach().float()
        handles.append(module.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


class OutlierDiagnostics(pl.Callback):
    def __init__(self, max_batches: int = 8, key: str | int = "first",
                 epsilons: Sequence[float] = EPSILONS, json_name: str | None = "diagnostics.json",
                 png_name: str | None = "diagnostics.png") -> None:
        if int(max_batches) < 1:
            raise ValueError(f"max_batches={max_batches} records nothing; use 1 or more")
        check_options(key, epsilons)  # at the start of the run, not after its training
        self.max_batches, self.key = int(max_batches), key
        self.epsilons = tuple(float(e) for e in epsilons)
        self.json_name, self.png_name = json_name, png_name
        self.results: dict = {}
        self._reset()

    def _reset(self) -> None:
        self._layers, self._metrics, self._recorder, self._capture, self._hidden = [], {}, None, None, None

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        self._reset()
        self._layers = model_layers(pl_module)
        self._metrics = {l: LayerOutliers(self.key, self.epsilons).to(pl_module.device)
                         for l in range(len(self._layers))}

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx < self.max_batches and self._layers:
            self._recorder = record_attention([(n, a) for n, a, _ in self._layers]).open()
            self._capture = capture_outputs([block for _, _, block in self._layers])
            self._hidden = self._capture.__enter__()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self._recorder is None:
            return
        self._recorder.close()
        self._capture.__exit__(None, None, None)
        for l, (name, _, _) in enumerate(self._layers):
            rec = self._recorder.records.get(name)
            if rec is not None:
                self._metrics[l].update(rec.weights, self._hidden.get(l), rec.key_padding_mask,
                                        rec.query_padding_mask, rec.causal)
        self._recorder = self._capture = self._hidden = None

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        layers = {l: m.compute() for l, m in self._metrics.items() if m.heads > 0}
        if not layers:
            return
        model = summarize(layers)
        for l, values in layers.items():
            for key, value in values.items():
                pl_module.log(f"{PREFIX}/layer{l}/{key}", value)  # already reduced over processes
        for key, value in model.items():
            pl_module.log(f"{PREFIX}/{key}", value)
        log = LoggerAdapter(trainer)
        for l, metric in self._metrics.items():
            for key, values in metric.distributions().items():
                if values.numel():
                    log.histogram(f"{PREFIX}/layer{l}/{key}_hist", values)
        names = {l: self._layers[l][0] for l in layers}
        self.results = {"key": self.key, "epsilons": list(self.epsilons), "model": model,
                        "layers": {str(l): {"name": names[l], **v} for l, v in layers.items()}}
        if trainer.is_global_zero:
            out = Path(trainer.default_root_dir)
            if self.json_name:
                atomic_write_text(out / self.json_name, json.dumps(self.results, indent=2) + "\n")
            if self.png_name:
                log.image(f"{PREFIX}/layers", write_png(out / self.png_name, self.results))


def write_png(path: Path, results: dict) -> Path:
    """Per layer: sink rate (both eps), zero share, kurtosis and top-1 / median |activation|."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = results["layers"]
    x = [int(l) for l in layers]
    panels = [("sink rate", [k for k in next(iter(layers.values())) if k.startswith("sink_rate")]),
              ("exactly-zero weights", ["zero_share"]), ("kurtosis", ["kurtosis", "pooled_kurtosis"]),
              ("|activation|", ["max_abs", "median_abs"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (title, keys) in zip(axes, panels):
        for key in keys:
            values = [layers[str(l)].get(key) for l in x]
            if any(v is not None for v in values):
                ax.plot(x, [float("nan") if v is None else v for v in values], marker="o", label=key)
        if title == "|activation|":
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("layer")
        ax.legend(fontsize=7)
    fig.suptitle(f"sinks and outliers (sink key: {results['key']})", fontsize=9)
    fig.tight_layout()
    return save_png(fig, path)
