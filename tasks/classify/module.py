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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from attnlab.attention import record_attention
from attnlab.attention.statistics import head_distance_sum, jsd_matrix
from attnlab.errors import ConfigError
from attnlab.task_module import TaskModule
from tasks.classify.figures import HopExamples, token_names
from tasks.classify.hops import lin_penalty
from tasks.classify.model import SelfAttentiveClassifier
from tasks.classify.pretrained import PretrainedEncoder


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


class ClassifyModule(TaskModule):
    """The classifier (`tasks.classify.model.SelfAttentiveClassifier`, task.module.net), the
    optimizer and the plateau schedule come injected; `penalty` is the weight of Lin's term."""

    def __init__(
        self,
        net: SelfAttentiveClassifier,
        optimizer: Callable[..., Any],
        scheduler: Callable | None,
        label_names: list[str] | None = None,
        penalty: float = 0.0,
        heatmap_max_tokens: int = 40,
        pretrained_lr: float | None = 1.0e-4,
        majority_label: int | None = None,
    ) -> None:
        super().__init__(net, optimizer, scheduler)
        if penalty < 0:
            raise ConfigError(f"task.penalty={penalty} must be >= 0 (the weight of Lin et al.'s ||AA^T - I||_F^2)")
        if net.hops.hops < 2 and penalty > 0:
            print("[classify] task.penalty with a single hop: A A^T - I has nothing to decorrelate")
        self.num_classes = num_classes = net.classifier[-1].out_features
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.metrics = torch.nn.ModuleDict({
            stage: MetricCollection({"acc": MulticlassAccuracy(num_classes, average="micro"),
                                     "macro_f1": MulticlassF1Score(num_classes, average="macro")})
            for stage in ("val", "test")})
        self.diversity = torch.nn.ModuleDict({
            f"{stage}_{name}": MeanMetric() for stage in ("val", "test") for name in ("dist", "hop_jsd")})
        self.examples: HopExamples | None = None
        # the majority class's accuracy on the same examples (the card's trivial baseline); None:
        # unknown (an old checkpoint evaluated without its datamodule)
        self.majority_label = majority_label
        self.baseline = torch.nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Class logits (B, C); the labels are batch["labels"]."""
        return self.net(batch).logits

    def task_loss(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        penalty = float(self.hparams.penalty)
        out = self.net(batch, need_weights=penalty > 0)
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
        with record_attention([("hops", self.net.hops)], first_only=False) as recorder:
            logits = self(batch)
        labels = batch["labels"]
        n = int(labels.numel())
        self.log(f"{stage}/loss", F.cross_entropy(logits, labels), batch_size=n, sync_dist=True)
        metrics = self.metrics[stage]
        metrics.update(logits, labels)
        self.log_dict({f"{stage}/{k}": v for k, v in metrics.items()}, batch_size=n)
        if self.majority_label is not None:
            self.baseline[stage].update(labels.eq(self.majority_label).float())
            self.log(f"{stage}/baseline_acc", self.baseline[stage], batch_size=n)
        records = recorder.records.get("hops", [])
        if self.net.hops.hops > 1:
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
        self.examples = HopExamples(self.num_classes, self.hparams.heatmap_max_tokens)

    def on_test_epoch_end(self) -> None:
        examples, self.examples = self.examples, None
        if examples is None or not self.trainer.is_global_zero:
            return
        label_names = self.hparams.label_names or [str(i) for i in range(self.num_classes)]
        tokenizer = getattr(getattr(self.trainer, "datamodule", None), "tokenizer", None)
        path = examples.write_png(Path(self.trainer.default_root_dir) / "hop_attention.png", label_names,
                                  token_names(tokenizer))
        if path is not None:
            print(f"[classify] hops' attention over one test sentence per class: {path}")

    def parameter_groups(self) -> list[dict]:
        """The base's groups; with encoder=pretrained, BERT's own weights at `pretrained_lr`
        (fine-tuning rate), the hops, classifier and the scheme's u at the task's rates."""
        groups = super().parameter_groups()
        rate = self.hparams.pretrained_lr
        if rate is None or not isinstance(self.net.encoder, PretrainedEncoder):
            return groups
        pretrained = {id(p) for p in self.net.encoder.pretrained_parameters()}
        split = []
        for group in groups:
            inside = [p for p in group["params"] if id(p) in pretrained]
            outside = [p for p in group["params"] if id(p) not in pretrained]
            split += [{**group, "params": outside}] if outside else []
            split += [{**group, "params": inside, "lr": float(rate)}] if inside else []
        return split

    def lr_scheduler_config(self, scheduler: Any) -> dict:
        # Lin et al.'s code divides the rate when the validation loss stops improving: a plateau
        # schedule (task.module.scheduler) steps at each validation on val/loss
        return {"scheduler": scheduler, "monitor": "val/loss"}
