"""`MLMModule`: masked-language-model pretraining of a BERT encoder whose self-attention uses the
scheme from `model=` in every layer (the seed paper's Sec. 6.2 setup).

Logs `train/loss`, `train/acc`, `val/loss`, `val/acc`, `val/ppl`, `test/acc`, `test/ppl`, where
acc is the accuracy on masked tokens and ppl the perplexity exp(mean cross-entropy) on them.
`init: bert` starts from the packaged BERT checkpoint (its config then fixes the architecture).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from attnlab.attention import AttentionSpec
from attnlab.errors import ConfigError
from tasks.common import bert_assets
from tasks.common.optim import parameter_groups, warmup_linear_decay
from tasks.mlm.masking import IGNORE
from tasks.mlm.model import BertForMLM, load_bert_weights


def bert_architecture() -> dict:
    """Encoder sizes of the packaged checkpoint, as BertForMLM keyword arguments."""
    cfg = bert_assets.bert_config()
    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError("the packaged BERT uses an activation or position embedding this encoder lacks")
    return {
        "vocab_size": cfg["vocab_size"],
        "d_model": cfg["hidden_size"],
        "num_layers": cfg["num_hidden_layers"],
        "nhead": cfg["num_attention_heads"],
        "dim_feedforward": cfg["intermediate_size"],
        "max_position": cfg["max_position_embeddings"],
        "type_vocab_size": cfg["type_vocab_size"],
        "layer_norm_eps": cfg["layer_norm_eps"],
        "pad_id": cfg["pad_token_id"],
    }


class MLMModule(pl.LightningModule):
    def __init__(
        self,
        attention: Any,
        vocab_size: int,
        pad_id: int = 0,
        max_length: int = 128,
        init: str = "random",
        d_model: int = 256,
        num_layers: int = 4,
        nhead: int = 4,
        dim_feedforward: int = 1024,
        max_position: int = 512,
        dropout: float = 0.1,
        attn_dropout: float = 0.1,
        norm_first: bool = False,
        optimizer: str = "adamw",
        lr: float = 5e-4,
        hybrid_lr: float | None = None,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        warmup: float = 0.06,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.spec = AttentionSpec.from_config(attention)
        if init not in ("random", "bert"):
            raise ConfigError(f"task.init={init!r}; use 'random' (train from scratch) or 'bert' (packaged weights)")
        if optimizer not in ("adamw", "lamb"):
            raise ConfigError(f"task.optimizer={optimizer!r}; use 'adamw' or 'lamb'")
        sizes = {"vocab_size": vocab_size, "d_model": d_model, "num_layers": num_layers, "nhead": nhead,
                     "dim_feedforward": dim_feedforward, "max_position": max_position, "pad_id": pad_id}
        if init == "bert":
            arch = bert_architecture()
            if arch["vocab_size"] != vocab_size:
                raise ConfigError(f"the tokenizer has {vocab_size} tokens but the BERT checkpoint {arch['vocab_size']}")
            print(f"[mlm] task.init=bert: {arch['num_layers']} layers, {arch['d_model']} wide, "
                  f"{arch['nhead']} heads, post-LN from the packaged config (task sizes ignored)")
            sizes, norm_first = arch, False
        if max_length > sizes["max_position"]:
            raise ConfigError(f"task.data.max_length={max_length} exceeds the {sizes['max_position']} positions")
        self.model = BertForMLM(**sizes, dropout=dropout, attn_dropout=attn_dropout, spec=self.spec,
                                norm_first=norm_first)
        if init == "bert":
            left = load_bert_weights(self.model, bert_assets.load_bert_state_dict())
            print(f"[mlm] loaded the packaged BERT weights; left at init: {', '.join(left) or 'none'}")
        num_classes = sizes["vocab_size"]
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE)
        self.val_ppl = Perplexity(ignore_index=IGNORE)
        self.test_ppl = Perplexity(ignore_index=IGNORE)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (N, vocab) and labels (N,) of the N masked tokens of the batch."""
        return self.model(batch["input_ids"], batch["labels"], batch["padding_mask"])

    def on_train_epoch_start(self) -> None:
        # New masks each epoch, deterministic per (seed, epoch, example).
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "set_epoch"):
            datamodule.set_epoch(self.current_epoch)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits, labels = self(batch)
        loss = F.cross_entropy(logits, labels)
        self.train_acc(logits, labels)
        n = int(labels.numel())
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", self.train_acc, batch_size=n)
        return loss

    def _evaluate(self, stage: str, batch: dict[str, torch.Tensor], acc, ppl) -> None:
        logits, labels = self(batch)
        loss = F.cross_entropy(logits, labels)
        acc.update(logits, labels)
        ppl.update(logits[None], labels[None])  # Perplexity wants (batch, seq, vocab)
        n = int(labels.numel())
        self.log(f"{stage}/loss", loss, batch_size=n, sync_dist=True)
        self.log(f"{stage}/acc", acc, batch_size=n, prog_bar=stage == "val")
        self.log(f"{stage}/ppl", ppl, batch_size=n)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch, self.val_acc, self.val_ppl)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch, self.test_acc, self.test_ppl)

    def configure_optimizers(self):
        hp = self.hparams
        groups = parameter_groups(self, hp.weight_decay, hp.lr, hp.hybrid_lr)
        if hp.optimizer == "lamb":
            try:
                from pytorch_optimizer import Lamb
            except ImportError:
                raise ConfigError("task.optimizer=lamb needs the package pytorch-optimizer: run `make install`")
            optimizer = Lamb(groups, lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps)
        else:
            optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(hp.warmup * total) if hp.warmup < 1 else int(hp.warmup)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(total, warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
