"""`TranslationModule`: a Transformer encoder-decoder trained as fairseq trains
`transformer_iwslt_de_en` (CODA Table 2, Repulsive attention Table 2).

- model: `tasks.common.seq2seq.Seq2SeqTransformer` in fairseq's shape (sinusoidal positions
  scaled embeddings, post-LN, ReLU, no LM-head transform, every embedding shared with the output
  projection, Xavier initialization); the encoder uses the scheme from `model=`, the decoder's
  self- and cross-attention `spec.for_decoder(...)` (coda / realformer / entmax in every stack,
  dnas / hnas / sinkhorn in the encoder only)
- train: label-smoothed cross entropy of the target tokens; Adam(W) with fairseq's inverse-sqrt
  warmup schedule
- val:   loss on every batch; sacrebleu BLEU / chrF of greedy translations of the first
         `val_decode_batches` batches (decoding is the slow part on CPU)
- test:  loss, beam search (`beam_size`, GNMT length penalty `length_penalty`) over the test set,
         test/bleu and test/chrf on detokenized text (sacrebleu's signature printed and logged),
         `predictions.tsv` (source, reference, hypothesis) in the run directory

`forward(batch)` returns (logits (N, V), labels (N,)) of the batch's N target tokens, which the
Calibration callback reads (ECE of the next-token predictions under teacher forcing).
Decoding lengths follow fairseq's `max_len_a * source length + max_len_b`, per batch (its
longest source), within the decoder's positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention import AttentionSpec
from attnlab.loggers import LoggerAdapter
from tasks.common.decoding import beam_search, greedy_decode, strip_generated
from tasks.common.optim import inverse_sqrt, parameter_groups
from tasks.common.predictions import run_file, write_predictions
from tasks.common.seq2seq import Seq2SeqTransformer
from tasks.mt import tokenizer as bpe
from tasks.mt.metrics import TranslationScores


class TranslationModule(pl.LightningModule):
    def __init__(
        self,
        attention,
        vocab_size: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        tokenizer_file: str,
        unk_id: int = bpe.UNK_ID,
        max_source_positions: int = 128,
        max_target_positions: int = 128,
        decoder_attention="unas",
        d_model: int = 512,
        nhead: int = 4,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 1024,
        dropout: float = 0.3,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        positions: str = "sinusoidal",
        lr: float = 5e-4,
        hybrid_lr: float | None = None,
        betas: Sequence[float] = (0.9, 0.98),
        eps: float = 1e-8,
        weight_decay: float = 1e-4,
        warmup_steps: int = 4000,
        label_smoothing: float = 0.1,
        val_decode_batches: int = 4,
        beam_size: int = 5,
        length_penalty: float = 1.0,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
        bleu_tokenize: str = "13a",
        predictions_file: str = "predictions.tsv",
    ) -> None:
        super().__init__()
        # The spec as a plain dict: checkpoints then load without Hydra objects.
        attention = AttentionSpec.from_config(attention).to_dict()
        decoder_attention = AttentionSpec.from_config(decoder_attention).to_dict()
        self.save_hyperparameters()
        self.model = Seq2SeqTransformer(
            vocab_size,
            pad_id,
            attention=attention,
            decoder_attention=decoder_attention,
            d_model=d_model,
            nhead=nhead,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation=activation,
            max_source_positions=max_source_positions,
            max_target_positions=max_target_positions,
            layer_norm_eps=1e-5,  # torch's and fairseq's LayerNorm default
            norm_first=norm_first,
            positions=positions,
            lm_head=False,
            weight_init="fairseq",
        )
        self.val_scores = TranslationScores(tokenize=bleu_tokenize)
        self.test_scores = TranslationScores(tokenize=bleu_tokenize)
        self._tokenizer = None
        self._predictions: list[tuple[str, str, str]] = []

    # -- helpers -----------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # the joint BPE the data were encoded with
            self._tokenizer = bpe.load(self.hparams.tokenizer_file)
        return self._tokenizer

    def ids_to_text(self, generated: Tensor) -> list[str]:
        rows = strip_generated(generated, self.hparams.eos_id, self.hparams.pad_id)
        return bpe.decode(self.tokenizer, rows)

    def _decode_kwargs(self, src: Tensor) -> dict:
        hp = self.hparams
        longest = int(src.ne(hp.pad_id).sum(1).max())
        # fairseq's max_len_a * |source| + max_len_b; the start token takes one decoder position
        max_length = min(math.ceil(hp.max_len_a * longest + hp.max_len_b), self.model.max_target_positions - 1)
        return {"bos_id": hp.bos_id, "eos_id": hp.eos_id, "pad_id": hp.pad_id, "max_length": max(max_length, 1)}

    def forward(self, batch: dict) -> tuple[Tensor, Tensor]:
        """Teacher-forced logits (N, V) and labels (N,) of the N non-padding target tokens."""
        return self.model.target_logits(batch["src_ids"], batch["tgt_ids"])

    def _loss(self, logits: Tensor, labels: Tensor, smoothing: float) -> Tensor:
        return F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)

    # -- loops -------------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        logits, labels = self(batch)
        loss = self._loss(logits, labels, self.hparams.label_smoothing)
        self.log("train/loss", loss, prog_bar=True, batch_size=int(labels.numel()))
        return loss

    def _evaluate(self, stage: str, batch: dict) -> None:
        # The teacher-forced pass first: analyses record the first forward of each attention
        # module in a batch (encoder, decoder self- and cross-attention over the whole target).
        logits, labels = self(batch)
        n = int(labels.numel())
        # the loss without smoothing: the model's cross entropy (perplexity = exp)
        self.log(f"{stage}/loss", self._loss(logits, labels, 0.0), batch_size=n, sync_dist=True,
                 prog_bar=stage == "val")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate("val", batch)
        if batch_idx < self.hparams.val_decode_batches:
            src = batch["src_ids"]
            generated = greedy_decode(self.model, src, src.eq(self.hparams.pad_id), **self._decode_kwargs(src))
            self.val_scores.update(self.ids_to_text(generated), batch["references"])

    def on_validation_epoch_end(self) -> None:
        if self.hparams.val_decode_batches > 0:
            scores = self.val_scores.compute()
            self.log("val/bleu", scores["bleu"], prog_bar=True)
            self.log("val/chrf", scores["chrf"])
            self.val_scores.reset()

    def on_test_epoch_start(self) -> None:
        self._predictions = []

    def test_step(self, batch: dict, batch_idx: int) -> None:
        hp = self.hparams
        self._evaluate("test", batch)
        src = batch["src_ids"]
        generated = beam_search(self.model, src, src.eq(hp.pad_id), beam_size=hp.beam_size,
                                length_penalty=hp.length_penalty, **self._decode_kwargs(src))
        hypotheses = self.ids_to_text(generated)
        self.test_scores.update(hypotheses, batch["references"])
        self._predictions.extend(zip(batch["sources"], batch["references"], hypotheses))

    def on_test_epoch_end(self) -> None:
        scores = self.test_scores.compute()
        self.log("test/bleu", scores["bleu"])
        self.log("test/chrf", scores["chrf"])
        signature = self.test_scores.signature()
        self.test_scores.reset()
        if self.trainer.is_global_zero:
            print(f"[mt] test BLEU {scores['bleu']:.2f} ({signature['bleu']}), "
                  f"chrF {scores['chrf']:.2f} ({signature['chrf']})", flush=True)
            LoggerAdapter(self.trainer).table("test/sacrebleu_signature", ["metric", "score", "signature"],
                                              [[k, round(scores[k], 4), signature[k]] for k in ("bleu", "chrf")])
        path = run_file(self.trainer, self.hparams.predictions_file)
        count = write_predictions(path, self._predictions)
        print(f"[mt] wrote {count} test translations to {path}", flush=True)

    # -- optimization ------------------------------------------------------------------------

    def configure_optimizers(self):
        hp = self.hparams
        # fairseq's Adam decouples its weight decay (AdamW); vectors and HNAS's u are not decayed
        groups = parameter_groups(self.model, hp.weight_decay, hp.lr, hp.hybrid_lr)
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt(hp.warmup_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
