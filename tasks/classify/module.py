"""`ClassifyModule`: Lin et al. (2017)'s self-attentive sentence classifier, the scheme of `model=`
in its attention hops (and in the encoder layers of `encoder=transformer`).

Loss: cross-entropy, plus `penalty` x Lin's ||A A^T - I||_F^2 (`task.penalty`; 0 = off; the
paper's MA+P baseline). Logs `train/loss`, `train/acc`, `train/penalty`; `val|test/loss`, `acc`,
`macro_f1` (torchmetrics; the Debian sections are unbalanced), and the hops' diversity:
`dist`, Repulsive attention's "Dist", the mean pairwise L2 distance between the rows of M (the
hops' representations), and `hop_jsd`, the mean Jensen-Shannon divergence between the hops'
distributions, both averaged over sentences (SNLI: premises and hypotheses). They are read from
the hops' `record_attention` records, so they cost a recorder on evaluation batches only.
`forward(batch)` returns the class logits (the labels are in the batch), which is what the
Calibration callback reads. After test, `hop_attention.png` in the run dir shows the hops'
attention over one test sentence per class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from attnlab.attention import AttentionSpec, record_attention
from attnlab.callbacks.head_diversity import head_distance_sum, jsd_matrix
from attnlab.errors import ConfigError
from tasks.classify.figures import HopExamples, token_names
from tasks.classify.hops import lin_penalty
from tasks.classify.model import SelfAttentiveClassifier
from tasks.common.optim import parameter_groups

OPTIMIZERS = ("adam", "sgd")


def hop_diversity(weights: Tensor, head_outputs: Tensor) -> tuple[float, float, int]:
    """Sums over the batch's sentences of the mean pairwise L2 distance between the rows of M and
    of the mean pairwise JSD between the hops' distributions (mean over heads), and the number of
    sentences. weights (B, H, r, n) and head_outputs (B, H, r, d) as recorded from a HopAttention
    with r >= 2 hops."""
    b, h, r, _ = head_outputs.shape
    rows = torch.ones(1, b, dtype=torch.bool)
    # each sentence as one "query" whose r hops are the "heads": the head-diversity measures apply
    m = head_outputs.transpose(1, 2).reshape(b, r, -1)
    dist, _ = head_distance_sum(m.transpose(0, 1)[None], rows)
    jsd = sum(float(jsd_matrix(weights[:, head].transpose(0, 1)[None], rows)[0].sum()) for head in range(h))
    return dist, jsd / (h * r * (r - 1)), b


class ClassifyModule(pl.LightningModule):
    def __init__(
        self,
        attention: Any,
        vocab_size: int,
        num_classes: int,
        label_names: list[str] | None = None,
        pad_id: int = 0,
        pair: bool = False,
        max_length: int = 128,
        encoder: str = "lstm",
        penalty: float = 0.0,
        embed_dim: int = 300,
        hidden_dim: int = 300,
        lstm_layers: int = 1,
        d_model: int = 256,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 1024,
        hops: int = 30,
        attention_unit: int = 350,
        hop_heads: int = 1,
        fc_dim: int = 3000,
        activation: str = "relu",
        dropout: float = 0.5,
        optimizer: str = "adam",
        lr: float = 1e-3,
        hybrid_lr: float | None = None,
        weight_decay: float = 0.0,
        lr_plateau_factor: float | None = 0.2,
        heatmap_max_tokens: int = 40,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if penalty < 0:
            raise ConfigError(f"task.penalty={penalty} must be >= 0 (the weight of Lin et al.'s ||AA^T - I||_F^2)")
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"task.module.optimizer={optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if hops < 2 and penalty > 0:
            print("[classify] task.penalty with a single hop: A A^T - I has nothing to decorrelate")
        self.spec = AttentionSpec.from_config(attention)
        self.model = SelfAttentiveClassifier(
            self.spec, vocab_size, num_classes, pad_id=pad_id, pair=pair, max_length=max_length, encoder=encoder,
            embed_dim=embed_dim, hidden_dim=hidden_dim, lstm_layers=lstm_layers, d_model=d_model, nhead=nhead,
            num_layers=num_layers, dim_feedforward=dim_feedforward, hops=hops, attention_unit=attention_unit,
            hop_heads=hop_heads, fc_dim=fc_dim, activation=activation, dropout=dropout)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.metrics = torch.nn.ModuleDict({
            stage: MetricCollection({"acc": MulticlassAccuracy(num_classes, average="micro"),
                                     "macro_f1": MulticlassF1Score(num_classes, average="macro")})
            for stage in ("val", "test")})
        self.diversity = torch.nn.ModuleDict({
            f"{stage}_{name}": MeanMetric() for stage in ("val", "test") for name in ("dist", "hop_jsd")})
        self.examples: HopExamples | None = None

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Class logits (B, C); the labels are batch["labels"]."""
        return self.model(batch).logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        penalty = float(self.hparams.penalty)
        out = self.model(batch, need_weights=penalty > 0)
        labels = batch["labels"]
        loss = F.cross_entropy(out.logits, labels)
        n = int(labels.numel())
        if out.hop_weights:
            p = torch.stack([lin_penalty(a) for a in out.hop_weights]).mean()
            self.log("train/penalty", p.detach(), batch_size=n)
            loss = loss + penalty * p
        self.train_acc(out.logits.detach(), labels)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", self.train_acc, batch_size=n)
        return loss

    def _evaluate(self, stage: str, batch: dict[str, Tensor]) -> None:
        # the hops' records (one per sentence of a pair) give A and M for the diversity numbers
        with record_attention([("hops", self.model.hops)], first_only=False) as recorder:
            logits = self(batch)
        labels = batch["labels"]
        n = int(labels.numel())
        self.log(f"{stage}/loss", F.cross_entropy(logits, labels), batch_size=n, sync_dist=True)
        metrics = self.metrics[stage]
        metrics.update(logits, labels)
        self.log_dict({f"{stage}/{k}": v for k, v in metrics.items()}, batch_size=n)
        records = recorder.records.get("hops", [])
        if self.hparams.hops > 1:
            for record in records:
                dist, jsd, count = hop_diversity(record.weights, record.head_outputs)
                self.diversity[f"{stage}_dist"].update(dist / count, weight=count)
                self.diversity[f"{stage}_hop_jsd"].update(jsd / count, weight=count)
            self.log(f"{stage}/dist", self.diversity[f"{stage}_dist"], batch_size=n)
            self.log(f"{stage}/hop_jsd", self.diversity[f"{stage}_hop_jsd"], batch_size=n)
        if stage == "test" and self.examples is not None and records:
            self.examples.add(batch["input_ids"], batch["lengths"], labels, logits.argmax(-1), records[0].weights)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch)

    def on_test_epoch_start(self) -> None:
        self.examples = HopExamples(self.hparams.num_classes, self.hparams.heatmap_max_tokens)

    def on_test_epoch_end(self) -> None:
        examples, self.examples = self.examples, None
        if examples is None or not self.trainer.is_global_zero:
            return
        label_names = self.hparams.label_names or [str(i) for i in range(self.hparams.num_classes)]
        tokenizer = getattr(getattr(self.trainer, "datamodule", None), "tokenizer", None)
        path = examples.write_png(Path(self.trainer.default_root_dir) / "hop_attention.png", label_names,
                                  token_names(tokenizer))
        if path is not None:
            print(f"[classify] hops' attention over one test sentence per class: {path}")

    def configure_optimizers(self):
        hp = self.hparams
        groups = parameter_groups(self, hp.weight_decay, hp.lr, hp.hybrid_lr)
        if hp.optimizer == "sgd":
            optimizer = torch.optim.SGD(groups, lr=hp.lr, momentum=0.9)
        else:
            optimizer = torch.optim.AdamW(groups, lr=hp.lr)
        if hp.lr_plateau_factor is None:
            return optimizer
        # Lin et al.'s code divides the rate by 5 when the validation loss stops improving
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=hp.lr_plateau_factor,
                                                               patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss"}}
