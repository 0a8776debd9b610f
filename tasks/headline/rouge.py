"""ROUGE-1/2/L F1 with Porter stemming, as reported in the paper (via torchmetrics).

torchmetrics' ROUGEScore imitates the `rouge-score` package (lowercase, non-alphanumerics to
spaces, nltk's Porter stemmer on tokens longer than 3 characters); the tests compare the two.
Scores are means over examples of the per-example F1, in [0, 1].
"""

from __future__ import annotations

from torchmetrics.text.rouge import ROUGEScore

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


def make_rouge() -> ROUGEScore:
    return ROUGEScore(use_stemmer=True, rouge_keys=ROUGE_KEYS)


def rouge_f1(scores: dict) -> dict[str, float]:
    """{'rouge1': F1, ...} from a ROUGEScore result (which also holds precision and recall)."""
    return {key: float(scores[f"{key}_fmeasure"]) for key in ROUGE_KEYS}


class RougeF1(ROUGEScore):
    """The test and validation scores: `compute()` gives {'rouge1': F1, 'rouge2': ..., 'rougeL': ...}."""

    def __init__(self, **kwargs) -> None:
        super().__init__(use_stemmer=True, rouge_keys=ROUGE_KEYS, **kwargs)

    def compute(self) -> dict[str, float]:
        return rouge_f1(super().compute())
