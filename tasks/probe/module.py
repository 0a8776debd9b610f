"""`ProbeModule`: trains a probe's encoder (`tasks.probe.network.ProbeEncoder`) by cross-entropy.

A sequence-level probe (clusters' count, retrieval's tuple, ListOps' value) is answered at
position 0; a per-position probe (recall's values, coverage's counts) at every asked position
(targets IGNORE elsewhere). Logs `train/loss`; `val|test/loss`, `acc` (accuracy over the asked
answers, the optimized metric `val/acc`), `seq_acc` (sequences whose every asked answer is right;
equal to `acc` for a sequence-level probe) and `baseline_acc`, the trivial baseline's accuracy on
the same split (tasks/probe/datamodule.py: majority class or chance), so that a report can tell a
run that learned from one that did not. `forward(batch)` returns the asked answers' logits and
labels, which the calibration callback reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from attnlab.errors import ConfigError
from attnlab.task_module import TaskModule
from tasks.probe.data import IGNORE, SEQUENCE_CLASS, TOKEN_CLASS
from tasks.probe.network import ProbeEncoder

STAGES = ("val", "test")


class ProbeModule(TaskModule):
    """`target_kind`, `baselines` ({split: accuracy}) and `baseline_name` come from the data."""

    def __init__(
        self,
        net: ProbeEncoder,
        optimizer: Callable[..., Any],
        scheduler: Callable | None = None,
        hybrid_lr: float | None = None,
        target_kind: str = SEQUENCE_CLASS,
        baselines: Mapping[str, float] | None = None,
        baseline_name: str = "chance",
    ) -> None:
        super().__init__(net, optimizer, scheduler, hybrid_lr)
        if target_kind not in (SEQUENCE_CLASS, TOKEN_CLASS):
            raise ConfigError(f"a probe run trains a class target, not {target_kind!r}")
        self.target_kind = target_kind
        self.baselines = dict(baselines or {})
        self.scores = torch.nn.ModuleDict({
            f"{stage}_{name}": MeanMetric() for stage in STAGES for name in ("acc", "seq_acc")})

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Logits (N, C) and labels (N,) of the batch's N asked answers (what calibration reads,
        so evaluation goes through here too)."""
        logits = self.net(batch["inputs"], batch["padding_mask"])
        targets = batch["targets"]
        if self.target_kind == SEQUENCE_CLASS:
            return logits[:, 0], targets
        asked = targets != IGNORE
        return logits[asked], targets[asked]

    def task_loss(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits, labels = self(batch)
        loss = F.cross_entropy(logits, labels)
        self.log("train/loss", loss, prog_bar=True, batch_size=int(labels.numel()))
        return loss

    def _evaluate(self, stage: str, batch: dict[str, Tensor]) -> None:
        logits, labels = self(batch)
        right = logits.argmax(-1) == labels
        n = int(labels.numel())
        self.log(f"{stage}/loss", F.cross_entropy(logits, labels), batch_size=n, sync_dist=True)
        self.scores[f"{stage}_acc"].update(right.double().mean(), weight=n)
        if self.target_kind == TOKEN_CLASS:  # the asked answers back in their sequences
            asked = batch["targets"] != IGNORE
            wrong = torch.zeros_like(asked)
            wrong[asked] = ~right
            right = ~wrong.any(dim=1)
        self.scores[f"{stage}_seq_acc"].update(right.double().mean(), weight=len(right))
        for name in ("acc", "seq_acc"):
            self.log(f"{stage}/{name}", self.scores[f"{stage}_{name}"], batch_size=n,
                     prog_bar=name == "acc")

    def _log_baseline(self, stage: str) -> None:
        if stage in self.baselines:  # a constant of the split, logged beside the metric
            self.log(f"{stage}/baseline_acc", float(self.baselines[stage]))

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch)

    def on_validation_epoch_end(self) -> None:
        self._log_baseline("val")

    def on_test_epoch_end(self) -> None:
        self._log_baseline("test")
