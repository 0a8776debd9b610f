"""`HeadlineModule`: the sequence-to-sequence loops (`tasks.common.seq2seq_module`) scored by ROUGE.

- net:   `tasks.headline.network.HeadlineTransformer` (BERT style; random or from BERT)
- val:   the training loss (label smoothed) per example; ROUGE-1/2/L F1 of greedy decodes, and
         the lead baseline (the first `lead_words` words of the article) on the same examples
         as val/lead_rouge1, val/lead_rouge2, val/lead_rougeL (the card's trivial baseline)
- test:  beam search, test/rouge1, test/rouge2, test/rougeL, `predictions.tsv` (source,
         reference, prediction), and the lead baseline on the same examples as test/lead_rouge*
- both:  {val,test}/distinct_ratio, distinct headlines written / articles decoded: a model that
         writes one headline whatever the article (its first plateau) scores ~0 here
- decoding stops after `max_decode_length` tokens
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from tasks.common.bert_assets import UNK_ID
from tasks.common.seq2seq_module import Seq2SeqModule
from tasks.headline.baseline import lead
from tasks.headline.rouge import RougeF1


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


class HeadlineModule(Seq2SeqModule):
    source_key = "articles"
    reference_key = "headlines"
    predictions_header = ("source", "reference", "prediction")
    progress_score = "rougeL"

    def __init__(self, *args, max_decode_length: int = 20, lead_words: int = 8,
                 unk_id: int = UNK_ID, **options) -> None:
        super().__init__(*args, unk_id=unk_id, **options)
        self.lead_scores = RougeF1()  # the lead baseline on the same test examples
        self.val_lead_scores = RougeF1()  # ... and on the decoded val examples
        self._decoded: list[str] = []  # this evaluation's outputs, for distinct_ratio
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # the same packaged WordPiece vocabulary as the data
            from tasks.common.bert_assets import load_tokenizer

            self._tokenizer = load_tokenizer(None)
        return self._tokenizer

    def make_scores(self) -> RougeF1:
        return RougeF1()

    def detokenize(self, rows: list[list[int]]) -> list[str]:
        return self.tokenizer.decode_batch(rows, skip_special_tokens=True)

    def decode_length(self, src: Tensor) -> int:
        return self.hparams.max_decode_length

    def decode(self, batch: dict, beam: bool) -> list[str]:
        outputs = super().decode(batch, beam)
        self._decoded.extend(outputs)
        return outputs

    def _log_distinct(self, stage: str) -> None:
        if self._decoded:
            self.log(f"{stage}/distinct_ratio", len(set(self._decoded)) / len(self._decoded))
        self._decoded = []

    def on_validation_epoch_start(self) -> None:
        self._decoded = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        if batch_idx < self.hparams.val_decode_batches and self.hparams.lead_words > 0:
            leads = [lead(article, self.hparams.lead_words) for article in batch["articles"]]
            self.val_lead_scores.update(leads, batch["headlines"])

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.hparams.val_decode_batches > 0 and self.hparams.lead_words > 0:
            for key, value in self.val_lead_scores.compute().items():
                self.log(f"val/lead_{key}", value)
            self.val_lead_scores.reset()
        self._log_distinct("val")

    def log_eval_loss(self, stage: str, batch: dict) -> None:
        # As the task has always reported it: val/loss is the training loss averaged over
        # examples, and test has none (the beam search stays the first forward that the test
        # analyses record), so numbers stay comparable with earlier runs.
        if stage == "val":
            self.log("val/loss", self.loss(batch), prog_bar=True, batch_size=len(batch["headlines"]))

    def test_step(self, batch: dict, batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        if self.hparams.lead_words > 0:
            leads = [lead(article, self.hparams.lead_words) for article in batch["articles"]]
            self.lead_scores.update(leads, batch["headlines"])

    def on_test_epoch_start(self) -> None:
        super().on_test_epoch_start()
        self._decoded = []

    def on_test_scores(self, scores: dict[str, float]) -> None:
        self._log_distinct("test")
        if self.hparams.lead_words > 0:
            for key, value in self.lead_scores.compute().items():
                self.log(f"test/lead_{key}", value)
            self.lead_scores.reset()
