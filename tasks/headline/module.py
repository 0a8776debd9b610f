"""`HeadlineModule`: training, validation (loss + greedy ROUGE) and test (beam search ROUGE).

- train: teacher-forced cross-entropy of the next headline token (optional label smoothing)
- val:   loss on every batch; ROUGE-1/2/L F1 of greedy decodes on the first
         `val_decode_batches` batches (decoding is the slow part on CPU)
- test:  beam search over the test set (or a seeded random `max_test_examples` of it), test/rouge1,
         test/rouge2, test/rougeL, `predictions.tsv` (source, reference, prediction) in the run
         directory, and the lead baseline (first `lead_words` words of the article) on the same
         examples as test/lead_rouge1, test/lead_rouge2, test/lead_rougeL
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention import AttentionSpec
from attnlab.errors import ConfigError
from tasks.common.decoding import beam_search, greedy_decode, strip_generated
from tasks.common.optim import parameter_groups, warmup_linear_decay
from tasks.common.predictions import run_file, write_predictions
from tasks.common.seq2seq import Seq2SeqTransformer
from tasks.headline.baseline import lead
from tasks.headline.rouge import ROUGE_KEYS, make_rouge, rouge_f1

INITS = ("random", "bert")


def sequence_loss(
    logits: Tensor, targets: Tensor, pad_id: int, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy over the non-padding target tokens. logits (..., V), targets (...)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
    )


class HeadlineModule(pl.LightningModule):
    def __init__(
        self,
        attention,
        vocab_size: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        unk_id: int = 100,
        output_vocab: Sequence[int] | None = None,
        output_vocab_size: int | None = None,
        decoder_attention="unas",
        init: str = "random",
        d_model: int = 128,
        nhead: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        dim_feedforward: int = 512,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        norm_first: bool = False,
        max_source_positions: int = 128,
        max_target_positions: int = 64,
        lr: float = 5e-4,
        hybrid_lr: float | None = None,
        weight_decay: float = 0.01,
        warmup_steps: int = 100,
        label_smoothing: float = 0.1,
        val_decode_batches: int = 2,
        max_decode_length: int = 32,
        beam_size: int = 4,
        length_penalty: float = 0.6,
        lead_words: int = 8,
        predictions_file: str = "predictions.tsv",
    ) -> None:
        super().__init__()
        if init not in INITS:
            raise ConfigError(f"task.init={init!r}; use one of {', '.join(INITS)}")
        # The spec as a plain dict: checkpoints then load without Hydra objects.
        attention = AttentionSpec.from_config(attention).to_dict()
        decoder_attention = AttentionSpec.from_config(decoder_attention).to_dict()
        # The output vocabulary's ids live in the model's state (a buffer), not in the hparams;
        # its size is enough to rebuild the model from a checkpoint.
        if output_vocab is not None:
            output_vocab = sorted({int(t) for t in output_vocab})
            output_vocab_size = len(output_vocab)
        self.save_hyperparameters(ignore=["output_vocab"])
        sizes = {
            "d_model": d_model,
            "nhead": nhead,
            "num_encoder_layers": num_encoder_layers,
            "num_decoder_layers": num_decoder_layers,
            "dim_feedforward": dim_feedforward,
            "dropout": dropout,
            "norm_first": norm_first,
        }
        if init == "bert":
            from tasks.headline.bert_init import bert_sizes

            # The checkpoint fixes the architecture: its sizes, and BERT's post-LN layers.
            sizes = bert_sizes(dict(sizes, norm_first=False), max_source_positions, max_target_positions)
        self.model = Seq2SeqTransformer(
            vocab_size,
            pad_id,
            attention=attention,
            decoder_attention=decoder_attention,
            max_source_positions=max_source_positions,
            max_target_positions=max_target_positions,
            attention_dropout=attention_dropout,
            output_vocab_size=output_vocab_size,
            **sizes,
        )
        if output_vocab is not None:
            self.model.set_output_vocab(output_vocab)
        if init == "bert":
            from tasks.headline.bert_init import load_bert_into

            load_bert_into(self.model)
        self.val_rouge = make_rouge()
        self.test_rouge = make_rouge()
        self.lead_rouge = make_rouge()  # the lead baseline on the same test examples
        self._tokenizer = None
        self._predictions: list[tuple[str, str, str]] = []

    # -- helpers -----------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # the same packaged WordPiece vocabulary as the data
            from tasks.common.bert_assets import load_tokenizer

            self._tokenizer = load_tokenizer(None)
        return self._tokenizer

    def ids_to_text(self, generated: Tensor) -> list[str]:
        rows = strip_generated(generated, self.hparams.eos_id, self.hparams.pad_id)
        return self.tokenizer.decode_batch(rows, skip_special_tokens=True)

    def _decode_kwargs(self) -> dict:
        hp = self.hparams
        # The start token takes one decoder position.
        max_length = min(hp.max_decode_length, self.model.max_target_positions - 1)
        return {
            "bos_id": hp.bos_id,
            "eos_id": hp.eos_id,
            "pad_id": hp.pad_id,
            "max_length": max_length,
        }

    def _loss(self, batch: dict) -> Tensor:
        # The real target positions only; a target token outside the output vocabulary (unseen
        # in training headlines) counts as [UNK].
        logits, labels = self.model.target_logits(batch["src_ids"], batch["tgt_ids"], self.hparams.unk_id)
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.hparams.label_smoothing)

    # -- loops -------------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["headlines"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        size = len(batch["headlines"])
        self.log("val/loss", self._loss(batch), prog_bar=True, batch_size=size)
        if batch_idx < self.hparams.val_decode_batches:
            src = batch["src_ids"]
            generated = greedy_decode(
                self.model, src, src.eq(self.hparams.pad_id), **self._decode_kwargs()
            )
            self.val_rouge.update(self.ids_to_text(generated), batch["headlines"])

    def on_validation_epoch_end(self) -> None:
        if self.hparams.val_decode_batches > 0:
            scores = rouge_f1(self.val_rouge.compute())
            for key in ROUGE_KEYS:
                self.log(f"val/{key}", scores[key], prog_bar=key == "rougeL")
            self.val_rouge.reset()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        hp = self.hparams
        src = batch["src_ids"]
        generated = beam_search(
            self.model,
            src,
            src.eq(hp.pad_id),
            beam_size=hp.beam_size,
            length_penalty=hp.length_penalty,
            **self._decode_kwargs(),
        )
        predictions = self.ids_to_text(generated)
        self.test_rouge.update(predictions, batch["headlines"])
        if hp.lead_words > 0:
            self.lead_rouge.update([lead(a, hp.lead_words) for a in batch["articles"]], batch["headlines"])
        self._predictions.extend(zip(batch["articles"], batch["headlines"], predictions))

    def on_test_epoch_start(self) -> None:
        self._predictions = []

    def on_test_epoch_end(self) -> None:
        scores = rouge_f1(self.test_rouge.compute())
        for key in ROUGE_KEYS:
            self.log(f"test/{key}", scores[key])
        self.test_rouge.reset()
        if self.hparams.lead_words > 0:
            lead_scores = rouge_f1(self.lead_rouge.compute())
            for key in ROUGE_KEYS:
                self.log(f"test/lead_{key}", lead_scores[key])
            self.lead_rouge.reset()
        self.write_predictions(self.predictions_path())

    def predictions_path(self) -> Path:
        """`predictions.tsv` in the run directory (one file per process when several run)."""
        return run_file(self.trainer, self.hparams.predictions_file)

    def write_predictions(self, path: Path) -> None:
        write_predictions(path, self._predictions, header=("source", "reference", "prediction"))
        print(f"[headline] wrote {len(self._predictions)} test predictions to {path}", flush=True)

    # -- optimization ------------------------------------------------------------------------

    def configure_optimizers(self):
        hp = self.hparams
        groups = parameter_groups(self.model, hp.weight_decay, hp.lr, hp.hybrid_lr)
        optimizer = torch.optim.AdamW(groups, lr=hp.lr)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmup_linear_decay(total, min(int(hp.warmup_steps), total))
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
