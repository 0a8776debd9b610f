"""`Calibration`: expected calibration error, overconfidence error and a reliability diagram.

For classification tasks (VQA answers; also MLM's masked tokens), on every validation and test
batch: the confidence of the predicted class and whether it was right, binned into `n_bins` bins
of equal width in [0, 1] (`binning: width`, Guo et al. 2017) or of equal mass (`binning: mass`):

    ECE = sum_b |B_b|/N |acc(B_b) - conf(B_b)|
    OE  = sum_b |B_b|/N conf(B_b) max(conf(B_b) - acc(B_b), 0)     (Thulasidasan et al. 2019)

as in Repulsive attention (An et al. 2020, App. C.4). Logged as `val/ece`, `val/oe`, `test/ece`,
`test/oe` (metrics.json) with a reliability diagram `reliability_<stage>.png` (W&B image).

No task code is needed: the callback reads what the LightningModule's forward (`self(batch)`)
returns during evaluation, through a forward hook:
- `(logits (N, C), labels (N,))`, as the MLM module does (label -100 = ignored), or
- logits `(B, C)`, with the targets in the batch (`target_keys`; the last element of a tuple batch):
  integer labels (B,) -> softmax confidence, right = argmax == label; soft scores / multi-hot
  (B, C) -> sigmoid confidence of the argmax answer (BCE models such as VQA), right = its score
  (VQA accuracy of the predicted answer). `probabilities` forces softmax or sigmoid.
Anything else (e.g. sequence logits of the headline task) is not classification: skipped with
one message.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.figures import save_png
from attnlab.loggers import LoggerAdapter

TARGET_KEYS = ("scores", "labels", "label", "targets", "target", "y")


def bin_statistics(confidence: Tensor, correct: Tensor, n_bins: int = 15, binning: str = "width") -> dict:
    """Per bin: count, mean confidence, mean correctness (empty bins have count 0)."""
    confidence, correct = confidence.double().flatten(), correct.double().flatten()
    if binning == "width":  # bin k holds [k/n, (k+1)/n); 1.0 goes to the last bin
        index = (confidence * n_bins).floor().clamp(0, n_bins - 1).long()
    elif binning == "mass":  # equal numbers of predictions, by rank of confidence
        order = confidence.argsort()
        index = torch.empty_like(order)
        index[order] = torch.arange(len(order)) * n_bins // max(len(order), 1)
    else:
        raise ConfigError(f"calibration binning={binning!r}: use width or mass")
    count = torch.zeros(n_bins, dtype=torch.float64).scatter_add_(0, index, torch.ones_like(confidence))
    conf = torch.zeros(n_bins, dtype=torch.float64).scatter_add_(0, index, confidence)
    acc = torch.zeros(n_bins, dtype=torch.float64).scatter_add_(0, index, correct)
    nonzero = count.clamp(min=1)
    return {"count": count, "confidence": conf / nonzero, "accuracy": acc / nonzero}


def calibration_errors(confidence: Tensor, correct: Tensor, n_bins: int = 15, binning: str = "width") -> dict:
    stats = bin_statistics(confidence, correct, n_bins, binning)
    weight = stats["count"] / stats["count"].sum().clamp(min=1)
    gap = stats["confidence"] - stats["accuracy"]
    return {
        "ece": float((weight * gap.abs()).sum()),
        "oe": float((weight * stats["confidence"] * gap.clamp(min=0)).sum()),
        "bins": stats,
    }


def predictions(output, batch, probabilities: str = "auto", target_keys: Sequence[str] = TARGET_KEYS):
    """(confidence (N,), correct (N,)) from a forward output and its batch, or a reason string."""
    if (isinstance(output, (tuple, list)) and len(output) == 2 and all(isinstance(t, Tensor) for t in output)
            and output[0].dim() == 2 and output[1].dim() == 1 and not output[1].is_floating_point()):
        logits, target = output
    elif isinstance(output, Tensor) and output.dim() == 2:
        logits, target = output, None
        if isinstance(batch, dict):
            target = next((batch[k] for k in target_keys if k in batch), None)
        elif isinstance(batch, (tuple, list)) and batch and isinstance(batch[-1], Tensor):
            target = batch[-1]
        if target is None:
            return f"no targets in the batch (looked for {', '.join(target_keys)})"
    else:
        shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        return f"the model's forward returns {shape}, not (batch, classes) logits"
    logits = logits.detach().float()
    target = target.detach()
    if target.shape[0] != logits.shape[0]:
        return f"targets {tuple(target.shape)} do not match logits {tuple(logits.shape)}"
    pred = logits.argmax(-1)
    if target.is_floating_point() and target.shape == logits.shape:  # soft scores / multi-hot
        probs = torch.sigmoid(logits) if probabilities in ("auto", "sigmoid") else logits.softmax(-1)
        conf = probs.gather(1, pred[:, None]).squeeze(1)
        correct = target.float().gather(1, pred[:, None]).squeeze(1).clamp(0, 1)
        return conf, correct
    if target.dim() == 1 and not target.is_floating_point():
        keep = target != -100
        probs = logits.sigmoid() if probabilities == "sigmoid" else logits.softmax(-1)
        conf = probs.gather(1, pred[:, None]).squeeze(1)
        return conf[keep], (pred == target).float()[keep]
    return f"targets of shape {tuple(target.shape)} are neither labels (N,) nor scores (N, C)"


class Calibration(pl.Callback):
    def __init__(self, n_bins: int = 15, binning: str = "width", probabilities: str = "auto",
                 target_keys: Sequence[str] = TARGET_KEYS, png_name: str = "reliability.png") -> None:
        if binning not in ("width", "mass"):
            raise ConfigError(f"calibration binning={binning!r}: use width or mass")
        if probabilities not in ("auto", "softmax", "sigmoid"):
            raise ConfigError(f"calibration probabilities={probabilities!r}: use auto, softmax or sigmoid")
        self.n_bins, self.binning, self.probabilities = int(n_bins), binning, probabilities
        self.target_keys, self.png_name = tuple(target_keys), png_name
        self._output = None
        self._handle = None
        self._conf: list[Tensor] = []
        self._correct: list[Tensor] = []
        self._skipped = False

    def _start(self, trainer, pl_module) -> None:
        self._conf, self._correct, self._output = [], [], None
        if trainer.sanity_checking or self._skipped or self._handle is not None:
            return

        def keep(_module, _args, output):
            self._output = output

        self._handle = pl_module.register_forward_hook(keep)

    def _collect(self, trainer, batch) -> None:
        output, self._output = self._output, None
        if self._handle is None or output is None:
            return
        found = predictions(output, batch, self.probabilities, self.target_keys)
        if isinstance(found, str):
            self._skipped = True
            self._stop()
            if trainer.is_global_zero:
                print(f"[attnlab] calibration: skipped, not a classification output ({found})")
            return
        self._conf.append(found[0].cpu())
        self._correct.append(found[1].cpu())

    def _stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _finish(self, trainer, pl_module, stage: str) -> None:
        self._stop()
        if trainer.sanity_checking or not self._conf:
            return
        conf, correct = torch.cat(self._conf), torch.cat(self._correct)
        self._conf, self._correct = [], []
        if conf.numel() == 0:
            return
        result = calibration_errors(conf, correct, self.n_bins, self.binning)
        pl_module.log(f"{stage}/ece", result["ece"], sync_dist=True)
        pl_module.log(f"{stage}/oe", result["oe"], sync_dist=True)
        if trainer.is_global_zero:
            path = Path(trainer.default_root_dir) / self.png_name.replace(".png", f"_{stage}.png")
            self.write_png(path, result, stage, int(conf.numel()))
            LoggerAdapter(trainer).image(f"calibration/{stage}/reliability", path)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, batch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, batch)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module, "test")

    def write_png(self, path: Path, result: dict, stage: str, n: int) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        bins = result["bins"]
        filled = bins["count"] > 0
        centers = bins["confidence"][filled].numpy()
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        width = 1.0 / self.n_bins if self.binning == "width" else 0.03
        ax.bar(centers, bins["accuracy"][filled].numpy(), width=width, color="tab:blue", edgecolor="k",
               alpha=0.8, label="accuracy")
        ax.bar(centers, (bins["confidence"] - bins["accuracy"])[filled].numpy(), bottom=bins["accuracy"][filled].numpy(),
               width=width, color="tab:red", alpha=0.3, label="gap to confidence")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
               title=f"{stage}: ECE {result['ece']:.4f}, OE {result['oe']:.4f} (n={n}, {self.binning} bins)")
        ax.title.set_fontsize(8)
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        return save_png(fig, path, dpi=100)
