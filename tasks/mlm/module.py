"""`MLMModule`: masked-language-model pretraining of a BERT encoder whose self-attention uses the
scheme from `model=` in every layer (the seed paper's Sec. 6.2 setup).

Logs `train/loss`, `train/acc`, `val/loss`, `val/acc`, `val/ppl`, `test/acc`, `test/ppl`, where
acc is the accuracy on masked tokens and ppl the perplexity exp(mean cross-entropy) on them, and
`val/baseline_acc`, `test/baseline_acc`: the unigram prediction's accuracy on the same masked
tokens (always the most frequent training word piece; the card's trivial baseline).
`init: bert` starts from the packaged BERT checkpoint (its config then fixes the architecture).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from attnlab.task_module import TaskModule
from tasks.mlm.masking import IGNORE
from tasks.mlm.model import BertForMLM


class MLMModule(TaskModule):
    """The encoder (`tasks.mlm.model.BertForMLM`, task.module.net), the optimizer (AdamW, or LAMB
    as the paper) and BERT's warmup + linear decay come injected."""

    def __init__(self, net: BertForMLM, optimizer: Callable[..., Any], scheduler: Callable | None,
                 unigram_id: int | None = None) -> None:
        super().__init__(net, optimizer, scheduler)
        # the datamodule's most frequent training word piece (None: no baseline, e.g. an old
        # checkpoint evaluated without its datamodule)
        self.unigram_id = unigram_id
        self.val_baseline = MeanMetric()
        self.test_baseline = MeanMetric()
        num_classes = net.encoder.embeddings.word_embeddings.num_embeddings  # BERT's vocabulary with init=bert
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE)
        self.val_ppl = Perplexity(ignore_index=IGNORE)
        self.test_ppl = Perplexity(ignore_index=IGNORE)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (N, vocab) and labels (N,) of the N masked tokens of the batch."""
        return self.net(batch["input_ids"], batch["labels"], batch["padding_mask"])

    def on_train_epoch_start(self) -> None:
        # New masks each epoch, deterministic per (seed, epoch, example).
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "set_epoch"):
            datamodule.set_epoch(self.current_epoch)

    def task_loss(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits, labels = self(batch)
        loss = F.cross_entropy(logits, labels)
        self.train_acc(logits, labels)
        n = int(labels.numel())
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", self.train_acc, batch_size=n)
        return loss

    def _evaluate(self, stage: str, batch: dict[str, torch.Tensor], acc, ppl, baseline) -> None:
        logits, labels = self(batch)
        loss = F.cross_entropy(logits, labels)
        acc.update(logits, labels)
        ppl.update(logits[None], labels[None])  # Perplexity wants (batch, seq, vocab)
        n = int(labels.numel())
        self.log(f"{stage}/loss", loss, batch_size=n, sync_dist=True)
        self.log(f"{stage}/acc", acc, batch_size=n, prog_bar=stage == "val")
        self.log(f"{stage}/ppl", ppl, batch_size=n)
        if self.unigram_id is not None and n:
            baseline.update(labels.eq(self.unigram_id).float())
            self.log(f"{stage}/baseline_acc", baseline, batch_size=n)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch, self.val_acc, self.val_ppl, self.val_baseline)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch, self.test_acc, self.test_ppl, self.test_baseline)
