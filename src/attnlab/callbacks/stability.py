"""`StabilityMonitor`: what a training run's stability looks like, step by step.

Every training step: `train/grad_norm` (the L2 norm of every gradient together, before the
optimizer step and any clipping) and the count of loss spikes so far, `train/loss_spikes`: a
step whose loss exceeds `spike_factor` (2) times the median of the last `window` (50) finite
losses (with at least 10 of them). A non-finite loss is a **divergence**: `train/diverged` turns
1, the step is recorded, training stops there (validation and test then run on the best
checkpoint so far), and the run's metrics.json gets `stability: {"diverged": true, ...}`: a
result of the run, not a crash. The summary also keeps `initial_loss`, the loss of the first
step (the model at initialization: Wortsman et al.'s l_0, which caps a rate's loss in the LR
sensitivity of `attnlab.compare --stability`). Every `every_n_steps` steps (and the first), on that step's batch:
`train/max_attn_logit/layer{l}` (the largest q.k / sqrt(d) of layer l over its heads and valid
pairs, the attention-logit growth of Wortsman et al., ICLR 2024) and the attention entropy of each
head, `train/attn_entropy/layer{l}/head{h}` (nats, attnlab.attention.statistics: rows that need
not sum to 1 renormalized), from `record_attention` opened around that batch only; these two go to
the loggers (W&B, CSV, TensorBoard) and not into metrics.json.
"""

from __future__ import annotations

import math
import statistics

import pytorch_lightning as pl
import torch

from attnlab.attention import attention_modules, record_attention
from attnlab.attention.statistics import attention_entropy
from attnlab.loggers import LoggerAdapter

MIN_HISTORY = 10  # finite losses before a spike can be called


def grad_norm(module: torch.nn.Module) -> float:
    """sqrt(sum of every squared gradient entry), float64."""
    total = sum(float(p.grad.detach().double().pow(2).sum()) for p in module.parameters() if p.grad is not None)
    return math.sqrt(total)


class StabilityMonitor(pl.Callback):
    def __init__(self, every_n_steps: int | None = 25, spike_factor: float = 2.0, window: int = 50) -> None:
        if every_n_steps is not None and int(every_n_steps) < 1:
            raise ValueError(f"every_n_steps={every_n_steps}: use >= 1, or null for no attention statistics")
        if float(spike_factor) <= 1 or int(window) < MIN_HISTORY:
            raise ValueError(f"spike_factor={spike_factor} must exceed 1 and window={window} be >= {MIN_HISTORY}")
        self.every_n_steps = None if every_n_steps is None else int(every_n_steps)
        self.spike_factor, self.window = float(spike_factor), int(window)
        self.losses: list[float] = []
        self.spikes = 0
        self.diverged_at: int | None = None
        self.initial_loss: float | None = None
        self._recorder = None
        self._step = 0  # the global step of the batch in flight (batch end sees it advanced)

    # the state a resumed run continues from
    def state_dict(self) -> dict:
        return {"losses": self.losses[-self.window:], "spikes": self.spikes, "diverged_at": self.diverged_at,
                "initial_loss": self.initial_loss}

    def load_state_dict(self, state: dict) -> None:
        self.losses, self.spikes = list(state["losses"]), int(state["spikes"])
        self.diverged_at = state["diverged_at"]
        self.initial_loss = state.get("initial_loss")  # absent in checkpoints written before it

    def summary(self) -> dict:
        return {"diverged": self.diverged_at is not None, "diverged_at_step": self.diverged_at,
                "loss_spikes": self.spikes, "spike_factor": self.spike_factor, "window": self.window,
                "initial_loss": self.initial_loss}

    def is_spike(self, loss: float) -> bool:
        """`loss` against the median of the last `window` finite losses before it."""
        history = self.losses[-self.window:]
        return len(history) >= MIN_HISTORY and loss > self.spike_factor * statistics.median(history)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        pl_module.log("train/grad_norm", grad_norm(pl_module), on_step=True, on_epoch=False)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = self._step = trainer.global_step
        if self.every_n_steps is not None and step % self.every_n_steps == 0:
            self._recorder = record_attention(pl_module).open()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._recorder is not None:
            self._recorder.close()
            self._log_attention(trainer, pl_module, self._recorder.records)
            self._recorder = None
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        value = float(loss.detach())
        if self._step == 0 and self.initial_loss is None:
            self.initial_loss = value
        if not math.isfinite(value):
            self.diverged_at = self._step
            pl_module.log("train/diverged", 1.0, on_step=True, on_epoch=False)
            print(f"[attnlab] the loss is {value} at step {self._step}: diverged; training stops "
                  f"(recorded as the run's result, metrics.json `stability`)")
            trainer.should_stop = True
            return
        if self.is_spike(value):
            self.spikes += 1
        self.losses = (self.losses + [value])[-self.window:]
        pl_module.log("train/loss_spikes", float(self.spikes), on_step=True, on_epoch=False)
        pl_module.log("train/diverged", 0.0, on_step=True, on_epoch=False)

    def _log_attention(self, trainer, pl_module, records: dict) -> None:
        """Straight to the loggers (not metrics.json: a resumed run would lack the steps before)."""
        values = {}
        for l, (name, _) in enumerate(attention_modules(pl_module)):
            record = records.get(name)
            if record is None:
                continue
            if record.max_logit is not None:
                values[f"train/max_attn_logit/layer{l}"] = float(record.max_logit.max())
            if record.rows.any():
                per_head = attention_entropy(record.weights, record.rows).mean(0)  # (H,)
                values.update({f"train/attn_entropy/layer{l}/head{h}": v for h, v in enumerate(per_head.tolist())})
        if values and trainer.is_global_zero:
            LoggerAdapter(trainer).scalars(values, step=self._step)
