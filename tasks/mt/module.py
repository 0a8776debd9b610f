"""`TranslationModule`: the sequence-to-sequence loops (`tasks.common.seq2seq_module`) trained and
scored as fairseq trains `transformer_iwslt_de_en` (CODA Table 2, Repulsive attention Table 2).

- net:   `tasks.common.seq2seq.Seq2SeqTransformer` in fairseq's shape (sinusoidal positions,
         scaled embeddings, post-LN, ReLU, no LM-head transform, every embedding shared with the
         output projection, Xavier initialization: conf/task/mt.yaml); the encoder uses the scheme
         from `model=`, the decoder's self- and cross-attention `spec.for_decoder(...)`
- train: label-smoothed cross entropy; Adam(W) with fairseq's inverse-sqrt warmup schedule
- val / test: the loss per target token, sacrebleu BLEU / chrF of greedy (val) and beam (test)
         translations on detokenized text (sacrebleu's signature printed and logged), and
         `predictions.tsv` (source, reference, hypothesis) in the run directory
- val:   also `val/baseline_bleu`: the copy baseline (the German source as its own translation),
         BLEU on the same decoded examples as val/bleu (the card's trivial baseline)
- decoding lengths follow fairseq's `max_len_a * source length + max_len_b`, per batch (its
  longest source), within the decoder's positions
"""

from __future__ import annotations

import math

from torch import Tensor

from attnlab.loggers import LoggerAdapter
from tasks.common.seq2seq_module import Seq2SeqModule
from tasks.mt import tokenizer as bpe
from tasks.mt.metrics import TranslationScores


class TranslationModule(Seq2SeqModule):
    progress_score = "bleu"

    def __init__(self, *args, tokenizer_file: str, max_len_a: float = 1.2, max_len_b: int = 10,
                 bleu_tokenize: str = "13a", unk_id: int = bpe.UNK_ID, **options) -> None:
        super().__init__(*args, unk_id=unk_id, **options)
        self.copy_scores = TranslationScores(tokenize=bleu_tokenize)  # the copy baseline on val
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # the joint BPE the data were encoded with
            self._tokenizer = bpe.load(self.hparams.tokenizer_file)
        return self._tokenizer

    def make_scores(self) -> TranslationScores:
        return TranslationScores(tokenize=self.hparams.bleu_tokenize)

    def detokenize(self, rows: list[list[int]]) -> list[str]:
        return bpe.decode(self.tokenizer, rows)

    def decode_length(self, src: Tensor) -> int:
        hp = self.hparams
        longest = int(src.ne(self.net.pad_id).sum(1).max())
        return math.ceil(hp.max_len_a * longest + hp.max_len_b)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        if batch_idx < self.hparams.val_decode_batches:
            self.copy_scores.update(list(batch[self.source_key]), batch[self.reference_key])

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.hparams.val_decode_batches > 0:
            self.log("val/baseline_bleu", self.copy_scores.compute()["bleu"])
            self.copy_scores.reset()

    def on_test_scores(self, scores: dict[str, float]) -> None:
        signature = self.test_scores.signature()
        if self.trainer.is_global_zero:
            print(f"[mt] test BLEU {scores['bleu']:.2f} ({signature['bleu']}), "
                  f"chrF {scores['chrf']:.2f} ({signature['chrf']})", flush=True)
            LoggerAdapter(self.trainer).table(
                "test/sacrebleu_signature", ["metric", "score", "signature"],
                [[k, round(scores[k], 4), signature[k]] for k in ("bleu", "chrf")])
