"""`VQAModule`: trains the multi-view VQA model with BCE on soft answer scores.

Logs `train/loss`, `val/loss`, `val/acc`, `test/acc` and the accuracy per question type
(`val/acc_<type>`, `test/acc_<type>`; existence/counting/attribute/comparison on the synthetic
benchmark, yes_no/number/other on VQA-v2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionSpec
from tasks.vqa.metric import VQAAccuracy
from tasks.vqa.model import VQAModel


class VQAModule(pl.LightningModule):
    def __init__(
        self,
        attention: Any,
        vocab_size: int,
        num_answers: int,
        feature_dim: int,
        num_views: int,
        question_types: Sequence[str] = (),
        fusion: str = "attention",
        primary_view: int = 0,
        fusion_heads: int = 1,
        fusion_dropout: float = 0.1,
        embed_dim: int = 64,
        hidden_dim: int = 128,
        attention_dim: int = 128,
        glimpses: int = 2,
        rnn: str = "gru",
        dropout: float = 0.2,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.spec = AttentionSpec.from_config(attention)
        self.model = VQAModel(
            self.spec,
            vocab_size=vocab_size,
            num_answers=num_answers,
            feature_dim=feature_dim,
            num_views=num_views,
            fusion=fusion,
            primary_view=primary_view,
            fusion_heads=fusion_heads,
            fusion_dropout=fusion_dropout,
            embed_dim=embed_dim,
            hidden_dim=hidden_dim,
            attention_dim=attention_dim,
            glimpses=glimpses,
            rnn=rnn,
            dropout=dropout,
        )
        self.question_types = list(question_types)
        self.val_acc = VQAAccuracy(self.question_types)
        self.test_acc = VQAAccuracy(self.question_types)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(
            batch["features"], batch["box_mask"], batch["question"], batch["question_length"]
        )

    def _loss(self, logits: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # BCE over answers on soft scores, summed over the vocabulary (the VQA/Pythia "logit BCE").
        return F.binary_cross_entropy_with_logits(logits, scores) * scores.shape[1]

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(self(batch), batch["scores"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["scores"]))
        return loss

    def _evaluate(self, batch: dict[str, torch.Tensor], metric: VQAAccuracy) -> torch.Tensor:
        logits = self(batch)
        metric.update(logits.argmax(dim=1), batch["scores"], batch["question_type"])
        return self._loss(logits, batch["scores"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss = self._evaluate(batch, self.val_acc)
        self.log("val/loss", loss, batch_size=len(batch["scores"]), sync_dist=True)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_acc)

    def _log_accuracy(self, stage: str, metric: VQAAccuracy) -> None:
        # compute() is already reduced over DDP processes; types without questions (NaN) are
        # left out rather than logged as a fake number.
        for name, value in metric.compute().items():
            if not torch.isnan(value):
                self.log(f"{stage}/{name}", value, prog_bar=name == "acc")
        metric.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_accuracy("val", self.val_acc)

    def on_test_epoch_end(self) -> None:
        self._log_accuracy("test", self.test_acc)

    def configure_optimizers(self):
        # No weight decay on vectors (biases, LayerNorm, the HNAS logit of u): decay would pull u
        # towards 0.5 and bias the measurement of where HNAS wants to go.
        matrices = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        vectors = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        groups = [
            {"params": matrices, "weight_decay": self.hparams.weight_decay},
            {"params": vectors, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=self.hparams.lr)
