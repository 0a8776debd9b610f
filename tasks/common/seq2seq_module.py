"""`Seq2SeqModule`: the training, validation and test loops of the sequence-to-sequence tasks
(headline, mt), around an injected `tasks.common.seq2seq.Seq2SeqTransformer` (`net`).

- train: label-smoothed cross entropy of the real target tokens (`label_smoothing`)
- val:   the loss on every batch; the task's scores of greedy decodes of the first
         `val_decode_batches` batches (decoding is the slow part on CPU)
- test:  beam search (`beam_size`, GNMT `length_penalty`) over the test set, the task's scores,
         and `predictions.tsv` (source, reference, output) in the run directory

A task is a thin subclass that says only what differs:

    make_scores()          a torchmetrics Metric: update(outputs, references), compute() -> {name: score}
                           (called in __init__, after the hyper-parameters are saved)
    detokenize(rows)       token id rows (special tokens stripped) -> texts
    decode_length(src)     the longest output for a batch (clamped to the decoder's positions here)
    log_eval_loss(...)     how the evaluation loss is reported (default: per token, val and test)
    on_test_scores(...)    what goes next to the test scores (mt: sacrebleu's signature)
    source_key, reference_key, predictions_header, progress_score

`forward(batch)` returns the logits (N, C) and labels (N,) of the batch's N real target tokens
(the Calibration callback reads it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

from attnlab.config_schema import NONNEGATIVE, POSITIVE_INT, Rule
from attnlab.task_module import TaskModule
from tasks.common.decoding import beam_search, greedy_decode, strip_generated
from tasks.common.predictions import run_file, write_predictions
from tasks.common.seq2seq import Seq2SeqTransformer


class Seq2SeqModule(TaskModule):
    source_key = "sources"  # the batch's texts, for predictions.tsv and the scores
    reference_key = "references"
    predictions_header = ("source", "reference", "hypothesis")
    progress_score = ""  # the score shown on the progress bar
    # ranges of the seq2seq tasks' own options, checked before any work (attnlab.config_schema)
    option_rules: ClassVar[dict[str, Rule]] = {"beam_size": Rule(POSITIVE_INT.ok, "an integer >= 1 (1: greedy)", "4"),
                    # the val scores come from these batches only: 0 would log none to monitor
                    "val_decode_batches": Rule(POSITIVE_INT.ok, "an integer >= 1", "2"),
                    "label_smoothing": Rule(NONNEGATIVE.ok, "a number >= 0", "0.1")}

    def __init__(
        self,
        net: Seq2SeqTransformer,
        optimizer: Callable[..., Any],
        scheduler: Callable | None,
        *,
        bos_id: int,  # the special tokens' ids: datamodule.model_kwargs()
        eos_id: int,
        unk_id: int | None = None,
        label_smoothing: float = 0.1,
        # no defaults where headline and mt differ: each task's YAML is their home
        val_decode_batches: int,
        beam_size: int,
        length_penalty: float,
        predictions_file: str = "predictions.tsv",
    ) -> None:
        super().__init__(net, optimizer, scheduler)
        self.val_scores = self.make_scores()
        self.test_scores = self.make_scores()
        self._predictions: list[tuple[str, str, str]] = []

    # -- what a task says --------------------------------------------------------------------

    def make_scores(self) -> Metric:
        raise NotImplementedError

    def detokenize(self, rows: list[list[int]]) -> list[str]:
        raise NotImplementedError

    def decode_length(self, src: Tensor) -> int:
        raise NotImplementedError

    def on_test_scores(self, scores: dict[str, float]) -> None:
        """Called on every process after the test scores are logged."""

    def log_eval_loss(self, stage: str, batch: dict) -> None:
        """The model's cross entropy per target token (perplexity = exp), without smoothing.

        It runs first in the step: analyses record the first forward of each attention module in
        a batch, which is then the teacher-forced pass over the whole target."""
        logits, labels = self(batch)
        loss = F.cross_entropy(logits.float(), labels)
        self.log(f"{stage}/loss", loss, batch_size=int(labels.numel()), sync_dist=True,
                 prog_bar=stage == "val")

    # -- model -------------------------------------------------------------------------------

    def forward(self, batch: dict) -> tuple[Tensor, Tensor]:
        """Teacher-forced logits (N, C) and labels (N,) of the N non-padding target tokens; a
        token outside a restricted output vocabulary counts as [UNK]."""
        return self.net.target_logits(batch["src_ids"], batch["tgt_ids"], self.hparams.unk_id)

    def loss(self, batch: dict, label_smoothing: float | None = None) -> Tensor:
        """Mean cross entropy of the batch's target tokens (default: the training smoothing).

        Not through `forward`: what Calibration reads there is the evaluation loss's pass only
        (`log_eval_loss`), so a task whose loss is not a classification output stays without."""
        logits, labels = self.net.target_logits(batch["src_ids"], batch["tgt_ids"], self.hparams.unk_id)
        if label_smoothing is None:
            label_smoothing = self.hparams.label_smoothing
        return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)

    def decode(self, batch: dict, beam: bool) -> list[str]:
        """Greedy (beam=False) or beam-search outputs of the batch, as text."""
        hp, src = self.hparams, batch["src_ids"]
        pad_id = self.net.pad_id
        # the start token takes one decoder position
        length = max(1, min(self.decode_length(src), self.net.max_target_positions - 1))
        limits = {"bos_id": hp.bos_id, "eos_id": hp.eos_id, "pad_id": pad_id, "max_length": length}
        if beam:
            generated = beam_search(self.net, src, src.eq(pad_id), beam_size=hp.beam_size,
                                    length_penalty=hp.length_penalty, **limits)
        else:
            generated = greedy_decode(self.net, src, src.eq(pad_id), **limits)
        return self.detokenize(strip_generated(generated, hp.eos_id, pad_id))

    # -- loops -------------------------------------------------------------------------------

    def task_loss(self, batch: dict, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch[self.reference_key]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log_eval_loss("val", batch)
        if batch_idx < self.hparams.val_decode_batches:
            self.val_scores.update(self.decode(batch, beam=False), batch[self.reference_key])

    def on_validation_epoch_end(self) -> None:
        if self.hparams.val_decode_batches > 0:
            self._log_scores("val", self.val_scores)

    def on_test_epoch_start(self) -> None:
        self._predictions = []

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.log_eval_loss("test", batch)
        outputs = self.decode(batch, beam=True)
        references = batch[self.reference_key]
        self.test_scores.update(outputs, references)
        self._predictions.extend(zip(batch[self.source_key], references, outputs))

    def on_test_epoch_end(self) -> None:
        self.on_test_scores(self._log_scores("test", self.test_scores))
        path = self.predictions_path()
        count = write_predictions(path, self._predictions, header=self.predictions_header)
        print(f"[{type(self).__name__}] wrote {count} test predictions to {path}", flush=True)

    def _log_scores(self, stage: str, metric: Metric) -> dict[str, float]:
        scores = metric.compute()
        for key, value in scores.items():
            self.log(f"{stage}/{key}", value, prog_bar=stage == "val" and key == self.progress_score)
        metric.reset()
        return scores

    def predictions_path(self) -> Path:
        """`predictions.tsv` in the run directory (one file per process when several run)."""
        return run_file(self.trainer, self.hparams.predictions_file)
