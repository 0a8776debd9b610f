"""Corpus BLEU and chrF of detokenized translations, exactly as `sacrebleu` computes them.

`TranslationScores` is a torchmetrics `Metric`: each `update(hypotheses, references)` adds the
segments' sufficient statistics (BLEU's n-gram matches and totals and lengths, chrF's character
n-gram counts) from sacrebleu itself, and `compute()` turns their sums into the corpus scores
with sacrebleu's own formula. Sums are what DDP all-reduces, so the score over several
processes is the score of the whole corpus, not a mean of per-process scores; on one process
it is `sacrebleu.corpus_bleu(hypotheses, [references])` to the last digit (tested).

`signature()` gives sacrebleu's signature strings (tokenizer, smoothing, version, ...), which a
paper table needs next to the number: "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sacrebleu.metrics import BLEU, CHRF
from torchmetrics import Metric

from attnlab.errors import ConfigError


class TranslationScores(Metric):
    """BLEU and chrF (0-100) of a corpus, one reference per segment.

    `tokenize`: sacrebleu's BLEU tokenizer; "13a" (default) for detokenized text, "none" for
    text that is tokenized already (the papers' IWSLT14 BLEU is on Moses-tokenized, lower-cased
    text: tokenize="none" on that text gives fairseq's tokenized BLEU). `lowercase`: case-insensitive BLEU.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, tokenize: str = "13a", lowercase: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        if tokenize not in BLEU.TOKENIZERS:
            raise ConfigError(
                f"BLEU tokenize={tokenize!r} is not one of sacrebleu's: {', '.join(BLEU.TOKENIZERS)}; "
                f"13a for detokenized text, none for text that is tokenized already"
            )
        # force: no "forgot to detokenize?" warning when the text is tokenized on purpose
        self.bleu = BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenize == "none")
        self.chrf = CHRF()
        for name, metric in (("bleu_stats", self.bleu), ("chrf_stats", self.chrf)):
            # the width of the statistics vector (this also tells sacrebleu nrefs=1, which its
            # signature needs)
            width = len(metric._extract_corpus_statistics(["a"], [["a"]])[0])
            self.add_state(name, torch.zeros(width, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("segments", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str], references: Sequence[str]) -> None:
        hypotheses, references = list(hypotheses), list(references)
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
        if not hypotheses:
            return
        for state, metric in ((self.bleu_stats, self.bleu), (self.chrf_stats, self.chrf)):
            stats = metric._extract_corpus_statistics(hypotheses, [references])
            state += torch.tensor(stats, dtype=torch.float64, device=state.device).sum(0)
        self.segments += len(hypotheses)

    def compute(self) -> dict[str, float]:
        """{"bleu": ..., "chrf": ...}; both 0 before any segment."""
        if int(self.segments) == 0:
            return {"bleu": 0.0, "chrf": 0.0}
        # sacrebleu's statistics are integer counts; float64 holds them exactly
        bleu = self.bleu._compute_score_from_stats([int(x) for x in self.bleu_stats.tolist()])
        chrf = self.chrf._compute_score_from_stats([int(x) for x in self.chrf_stats.tolist()])
        return {"bleu": float(bleu.score), "chrf": float(chrf.score)}

    def signature(self) -> dict[str, str]:
        return {"bleu": str(self.bleu.get_signature()), "chrf": str(self.chrf.get_signature())}
