"""`LMModule`: causal language modelling with a decoder-only Transformer (`tasks.lm.model`) whose
self-attention uses the `model=` scheme in every layer (CODA Table 1; Repulsive attention).

- train: mean cross entropy of the next token over each training block.
- val / test: over the scored targets of the sliding windows only (`score_mask`: each token of
  the split exactly once, with at least `block_size - eval_stride` tokens of context), summed
  over the split and divided once: `{stage}/loss` (nats per token), `{stage}/ppl` = exp(loss),
  `{stage}/bpt` (bits per token) and `{stage}/tokens` (how many were scored). With a word-level
  vocabulary (Wikitext, PTB, plain text) a token is a word, so ppl is the word-level perplexity
  the papers report; with the Debian default's WordPiece it is per word piece.
- `forward(batch)` returns the scored tokens' (logits (N, V), labels (N,)), which the Calibration
  callback reads (ECE over next-token predictions).
- end of test: greedy and top-k continuations of a few test prompts, with the KV-cached decoding
  of `tasks.common.decoding.sample` (cached keys/values; cascades carried row by row), into `predictions.txt`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor
from torchmetrics import Metric

from attnlab.attention import AttentionSpec
from attnlab.errors import ConfigError
from tasks.common.decoding import sample
from tasks.common.incremental import cacheable
from tasks.common.optim import parameter_groups, warmup_linear_decay
from tasks.lm.model import TransformerLM

OPTIMIZERS = ("adamw", "nag")
SCHEDULES = ("linear", "cosine")


class TokenNLL(Metric):
    """Sum of -log p over scored tokens and their number (summed over DDP processes)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll: Tensor) -> None:
        self.nll += nll.detach().double().sum()
        self.tokens += nll.numel()

    def compute(self) -> tuple[float, int]:
        """(mean -log p, number of tokens) of everything seen (on every process)."""
        return float(self.nll / self.tokens.clamp(min=1)), int(self.tokens)


def warmup_cosine(total: int, warmup: int, min_ratio: float):
    """LambdaLR factor: linear warmup, then a half cosine from 1 down to `min_ratio` at `total`
    (fairseq's cosine schedule with one period, as transformer_lm_wiki103 trains)."""
    total, warmup = max(1, int(total)), max(0, int(warmup))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class LMModule(pl.LightningModule):
    def __init__(
        self,
        attention: Any,
        vocab_size: int,
        pad_id: int = 0,
        eos_id: int = 1,
        unk_id: int = 2,
        word_level: bool = True,
        block_size: int = 128,
        d_model: int = 256,
        nhead: int = 4,
        num_layers: int = 4,
        dim_feedforward: int = 1024,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        activation: str = "gelu",
        norm_first: bool = True,
        final_norm: bool | None = None,
        max_positions: int | None = None,
        positions: str = "learned",
        scale_embedding: bool = True,
        adaptive_cutoffs: Sequence[int] | None = None,
        adaptive_factor: float = 4.0,
        adaptive_dropout: float = 0.0,
        token_order: Sequence[int] | None = None,
        checkpoint: bool = False,
        optimizer: str = "adamw",
        lr: float = 1e-3,
        hybrid_lr: float | None = None,
        betas: Sequence[float] = (0.9, 0.98),
        eps: float = 1e-8,
        momentum: float = 0.99,
        weight_decay: float = 0.01,
        schedule: str = "linear",
        warmup: float = 0.05,
        min_lr: float = 0.0,
        sample_prompts: int = 4,
        prompt_length: int = 16,
        sample_length: int = 32,
        top_k: int = 10,
        temperature: float = 1.0,
        sample_seed: int = 0,
        predictions_file: str = "predictions.txt",
    ) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"task.module.optimizer={optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if schedule not in SCHEDULES:
            raise ConfigError(f"task.module.schedule={schedule!r}; use one of {', '.join(SCHEDULES)}")
        attention = AttentionSpec.from_config(attention).to_dict()  # plain dict: checkpoints load without Hydra
        max_positions = int(max_positions or block_size)
        if max_positions < block_size:
            raise ConfigError(f"task.module.max_positions={max_positions} < task.data.block_size={block_size}")
        # token_order (ids by training frequency, for the adaptive bands) lives in the model's
        # state (a buffer), not in the hyper-parameters: 30k+ ids would flood configs and loggers
        self.save_hyperparameters(ignore=["token_order"])
        self.model = TransformerLM(
            vocab_size, pad_id, attention, d_model=d_model, nhead=nhead, num_layers=num_layers,
            dim_feedforward=dim_feedforward, dropout=dropout, attention_dropout=attention_dropout,
            activation=activation, norm_first=norm_first, final_norm=final_norm, max_positions=max_positions,
            positions=positions, scale_embedding=scale_embedding, adaptive_cutoffs=adaptive_cutoffs,
            adaptive_factor=adaptive_factor, adaptive_dropout=adaptive_dropout, token_order=token_order,
            checkpoint=checkpoint,
        )
        self.val_nll = TokenNLL()
        self.test_nll = TokenNLL()

    # -- steps -------------------------------------------------------------------------------

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Logits (N, V) and labels (N,) of the N scored targets of the batch."""
        hidden = self.model(batch["input_ids"], batch["padding_mask"])
        scored = batch["score_mask"]
        return self.model.logits(hidden[scored]), batch["target_ids"][scored]

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        hidden = self.model(batch["input_ids"], batch["padding_mask"])
        scored = batch["score_mask"]
        # nll without materializing full logits where the output layer allows (adaptive softmax)
        nll = self.model.nll(hidden[scored], batch["target_ids"][scored])
        loss = nll.mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=nll.numel())
        return loss

    def _evaluate(self, batch: dict[str, Tensor], metric: TokenNLL) -> None:
        logits, labels = self(batch)
        metric.update(torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none"))

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_nll)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_nll)

    def _log_split(self, stage: str, metric: TokenNLL) -> None:
        loss, tokens = metric.compute()  # synced over processes by torchmetrics
        metric.reset()
        if tokens == 0:
            return
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/ppl", math.exp(min(loss, 700.0)), prog_bar=stage == "val")
        self.log(f"{stage}/bpt", loss / math.log(2))
        self.log(f"{stage}/tokens", float(tokens))

    def on_validation_epoch_end(self) -> None:
        self._log_split("val", self.val_nll)

    def on_test_epoch_end(self) -> None:
        self._log_split("test", self.test_nll)
        if self.hparams.sample_prompts > 0 and self.trainer.is_global_zero:
            self.write_samples()

    # -- samples -----------------------------------------------------------------------------

    def write_samples(self) -> Path | None:
        """Greedy and top-k continuations of test prompts -> predictions.txt in the run dir."""
        hp = self.hparams
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "prompts"):
            print("[lm] no datamodule with prompts: samples skipped")
            return None
        length = min(hp.prompt_length, self.model.max_positions - hp.sample_length)
        prompts = datamodule.prompts("test", hp.sample_prompts, max(length, 1)).to(self.device)
        if prompts.numel() == 0:
            return None
        greedy = sample(self.model, prompts, max_new_tokens=hp.sample_length)
        generator = torch.Generator(device=self.device).manual_seed(int(hp.sample_seed))
        top_k = sample(self.model, prompts, max_new_tokens=hp.sample_length, top_k=hp.top_k,
                       temperature=hp.temperature, generator=generator)
        decoding = "KV cache" if cacheable(self.model.layers, cascades=True) else "prefix re-run (this transform cannot be cached)"
        header = (f"# {len(prompts)} test prompts of {prompts.shape[1] - 1} tokens, {hp.sample_length} new tokens "
                  f"each; greedy and top-{hp.top_k} (temperature {hp.temperature}, seed {hp.sample_seed}); "
                  f"decoding: {decoding}")
        blocks = [header]

        def text(ids: list[int]) -> str:  # one line per sample: segment ends shown as <eos>
            return datamodule.decode(ids).replace("\n", " <eos> ")

        for p, g, k in zip(prompts.tolist(), greedy.tolist(), top_k.tolist()):
            blocks.append(f"prompt: {text(p[1:])}\ngreedy: {text(g)}\ntop-{hp.top_k}: {text(k)}")
        path = Path(self.trainer.default_root_dir) / hp.predictions_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
        print(f"[lm] wrote {len(prompts)} greedy / top-{hp.top_k} samples to {path}\n{blocks[1]}", flush=True)
        return path

    # -- optimization ------------------------------------------------------------------------

    def configure_optimizers(self):
        hp = self.hparams
        groups = parameter_groups(self.model, hp.weight_decay, hp.lr, hp.hybrid_lr)
        if hp.optimizer == "nag":  # fairseq's transformer_lm_wiki103: Nesterov momentum 0.99
            optimizer = torch.optim.SGD(groups, lr=hp.lr, momentum=hp.momentum, nesterov=True)
        else:
            optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(hp.warmup * total) if hp.warmup < 1 else int(hp.warmup)
        if hp.schedule == "cosine":
            factor = warmup_cosine(total, warmup, hp.min_lr / hp.lr)
        else:
            factor = warmup_linear_decay(total, warmup)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
