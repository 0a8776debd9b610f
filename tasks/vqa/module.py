"""`VQAModule`: trains the multi-view VQA model with BCE on soft answer scores.

Logs `train/loss`, `val/loss`, `val/acc`, `test/acc` and the accuracy per question type
(`val/acc_<type>`, `test/acc_<type>`; existence/counting/attribute/comparison on the synthetic
benchmark, yes_no/number/other on VQA-v2). On the synthetic benchmark also:

- `val|test/acc_hidden` and `acc_visible`: accuracy on the questions whose answer depends on
  objects the primary view misses (only a secondary view shows them), and on the others;
- `val/baseline_acc`: the majority answer's accuracy on val (the card's trivial baseline);
- `test/prior_acc`, `test/prior_acc_<type>`: the question-only baseline of the data module
  (best training answer per question string), to read the per-type accuracies against;
- with `fusion=attention`, per fusion layer l (secondary view l + 1), over the whole test set:
  `test/explained_away_l{l}` (share of valid secondary boxes with total weight
  `sum_i w_ij < 1e-8`), `test/min_col_sum_x_S_l{l}` (>= 1 under the DNAS lemma), and per kind
  of box (`background`, `visible`: an object the primary view also sees, `hidden`: an object
  only secondary views see) `test/explained_away_<kind>_l{l}` and `test/col_sum_<kind>_l{l}`
  (mean total weight). The weights are materialized only in testing (`record_attention`
  around every test batch's forward; attnlab.attention.ColumnStats aggregates them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.attention import ColumnStats, record_attention
from attnlab.task_module import TaskModule
from tasks.vqa.metric import VQAAccuracy
from tasks.vqa.model import VQAModel
from tasks.vqa.synthetic import BOX_KINDS

# questions whose answer does not / does depend on objects that the primary view misses
VISIBILITY = ("visible", "hidden")


class VQAModule(TaskModule):
    """The network (`tasks.vqa.model.VQAModel`) and optimizer come injected (task.module.net,
    task.module.optimizer); the data's question types name the per-type accuracies."""

    def __init__(
        self,
        net: VQAModel,
        optimizer: Callable[..., Any],
        scheduler: Callable | None = None,
        question_types: Sequence[str] = (),
    ) -> None:
        super().__init__(net, optimizer, scheduler)
        self.question_types = list(question_types)
        self.val_acc = VQAAccuracy(self.question_types)
        self.test_acc = VQAAccuracy(self.question_types)
        self.val_visibility = VQAAccuracy(VISIBILITY)
        self.test_visibility = VQAAccuracy(VISIBILITY)
        self.test_columns = torch.nn.ModuleList(ColumnStats(BOX_KINDS) for _ in self._fusion_layers())

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.net(
            batch["features"], batch["box_mask"], batch["question"], batch["question_length"]
        )

    def _loss(self, logits: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # BCE over answers on soft scores, summed over the vocabulary (the VQA/Pythia "logit BCE").
        return F.binary_cross_entropy_with_logits(logits, scores) * scores.shape[1]

    def task_loss(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(self(batch), batch["scores"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["scores"]))
        return loss

    def _evaluate(
        self, batch: dict[str, torch.Tensor], metric: VQAAccuracy, visibility: VQAAccuracy,
        logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logits = self(batch) if logits is None else logits
        predicted = logits.argmax(dim=1)
        metric.update(predicted, batch["scores"], batch["question_type"])
        if "hidden" in batch:
            visibility.update(predicted, batch["scores"], batch["hidden"].long())
        return self._loss(logits, batch["scores"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss = self._evaluate(batch, self.val_acc, self.val_visibility)
        self.log("val/loss", loss, batch_size=len(batch["scores"]), sync_dist=True)

    def _fusion_layers(self) -> list:
        return list(self.net.fusion.attention) if self.net.fusion_mode == "attention" else []

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        layers = self._fusion_layers()
        with record_attention(layers) as recorder:  # every test batch, whatever callbacks record
            logits = self(batch)
        self._evaluate(batch, self.test_acc, self.test_visibility, logits)
        views = self.net.fusion.secondary_views if layers else []
        for l, (stats, view) in enumerate(zip(self.test_columns, views)):
            record = recorder.records[str(l)]
            box_kind = batch["box_kind"][:, view] if "box_kind" in batch else None
            stats.update(record.column_sums, record.key_padding_mask, record.query_padding_mask, box_kind)

    def _log_accuracy(self, stage: str, metric: VQAAccuracy, overall: bool = True) -> None:
        # compute() is already reduced over DDP processes; types without questions (NaN) are
        # left out rather than logged as a fake number.
        for name, value in metric.compute().items():
            if not torch.isnan(value) and (overall or name != "acc"):
                self.log(f"{stage}/{name}", value, prog_bar=name == "acc")
        metric.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_accuracy("val", self.val_acc)
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "majority_baseline"):
            self.log("val/baseline_acc", datamodule.majority_baseline("val"))
        self._log_accuracy("val", self.val_visibility, overall=False)

    def on_test_epoch_end(self) -> None:
        self._log_accuracy("test", self.test_acc)
        self._log_accuracy("test", self.test_visibility, overall=False)
        for l, stats in enumerate(self.test_columns):
            for name, value in stats.compute().items():
                if not torch.isnan(value):
                    self.log(f"test/{name}_l{l}", value)
            stats.reset()
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "question_prior"):
            for name, value in datamodule.question_prior("test").items():
                self.log(f"test/prior_{name}", value)
