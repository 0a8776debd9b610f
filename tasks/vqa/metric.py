"""VQA accuracy (Antol et al. 2015; the VQA-v2 evaluation) as a torchmetrics `Metric`.

An answer's accuracy on one question is `min(#annotators who gave it / 3, 1)`, averaged over the
10 subsets of 9 annotators (leave one out). Answers are compared after the official
normalization: lower-case, punctuation removed, number words to digits, articles dropped,
contractions restored.

One deliberate difference from the official script: it normalizes only when the 10 ground-truth
answers disagree; here both sides are always normalized, so "Two" and "2" always match.

Two ways to feed the metric:
- strings (`update(["2", ...], [[10 answers], ...])`): the official computation, per question;
- precomputed scores (`update(pred_index, answer_scores)`): `answer_scores[n, a]` is the VQA
  accuracy of answer `a` on question `n`, computed once at data time with `answer_scores()`.
  Training uses this path: it is exact for predictions from the answer vocabulary and costs a
  gather instead of string work.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

# --- official answer normalization -----------------------------------------------------------

_NUMBER_WORDS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
_ARTICLES = {"a", "an", "the"}
_PUNCTUATION = [
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
]
# A period is removed unless a digit follows it ("3.5" keeps it); this is what the official
# pattern does in practice.
_PERIOD = re.compile(r"\.(?!\d)")
# "1,000": when a digit-comma-digit occurs, punctuation is deleted rather than replaced by a space.
_DIGIT_COMMA_DIGIT = re.compile(r"\d,\d")

# Contractions in their written form. Annotators often drop (some of) the apostrophes; every such
# variant maps back to the written form.
_CONTRACTIONS = [
    "ain't",
    "aren't",
    "can't",
    "could've",
    "couldn't",
    "couldn't've",
    "didn't",
    "doesn't",
    "don't",
    "hadn't",
    "hadn't've",
    "hasn't",
    "haven't",
    "he'd",
    "he'd've",
    "he'll",
    "he's",
    "how'd",
    "how'll",
    "how's",
    "i'd",
    "i'd've",
    "i'll",
    "i'm",
    "i've",
    "isn't",
    "it'd",
    "it'd've",
    "it'll",
    "it's",
    "let's",
    "ma'am",
    "mightn't",
    "mightn't've",
    "might've",
    "mustn't",
    "must've",
    "needn't",
    "not've",
    "o'clock",
    "oughtn't",
    "shan't",
    "she'd",
    "she'd've",
    "she'll",
    "she's",
    "should've",
    "shouldn't",
    "shouldn't've",
    "somebody'd",
    "somebody'd've",
    "somebody'll",
    "somebody's",
    "someone'd",
    "someone'd've",
    "someone'll",
    "someone's",
    "something'd",
    "something'd've",
    "something'll",
    "that's",
    "there'd",
    "there'd've",
    "there're",
    "there's",
    "they'd",
    "they'd've",
    "they'll",
    "they're",
    "they've",
    "wasn't",
    "we'd",
    "we'd've",
    "we'll",
    "we're",
    "we've",
    "weren't",
    "what'll",
    "what're",
    "what's",
    "what've",
    "when's",
    "where'd",
    "where's",
    "where've",
    "who'd",
    "who'd've",
    "who'll",
    "who's",
    "who've",
    "why'll",
    "why're",
    "why's",
    "won't",
    "would've",
    "wouldn't",
    "wouldn't've",
    "y'all",
    "y'all'd've",
    "you'd",
    "you'd've",
    "you'll",
    "you're",
    "you've",
]


def _apostrophe_variants(word: str) -> list[str]:
    """All spellings of `word` with a non-empty subset of its apostrophes removed."""
    parts = word.split("'")
    variants = []
    for keep in itertools.product((True, False), repeat=len(parts) - 1):
        if all(keep):
            continue
        text = parts[0]
        for kept, part in zip(keep, parts[1:]):
            text += ("'" if kept else "") + part
        variants.append(text)
    return variants


_CONTRACTION_MAP = {
    variant: word for word in _CONTRACTIONS for variant in _apostrophe_variants(word)
}


def _strip_punctuation(text: str) -> str:
    digit_comma = _DIGIT_COMMA_DIGIT.search(text) is not None
    out = text
    for p in _PUNCTUATION:
        # Punctuation glued to a word ("dog's-eye") becomes a space, punctuation next to a space
        # or inside a number disappears.
        if (p + " " in text or " " + p in text) or digit_comma:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD.sub("", out)


@functools.lru_cache(maxsize=1 << 16)  # answers repeat a lot; this runs at data-prep time
def normalize_answer(answer: str) -> str:
    """The official VQA answer normalization ("Two dogs." -> "2 dogs", "dont" -> "don't")."""
    text = answer.replace("\n", " ").replace("\t", " ").strip()
    text = _strip_punctuation(text)
    words = []
    for word in text.lower().split():
        word = _NUMBER_WORDS.get(word, word)
        if word not in _ARTICLES:
            words.append(_CONTRACTION_MAP.get(word, word))
    return " ".join(words)


# --- accuracy --------------------------------------------------------------------------------


def vqa_accuracy(prediction: str, gt_answers: Sequence[str]) -> float:
    """Accuracy of one predicted answer against the annotators' answers (normally 10)."""
    if not gt_answers:
        raise ValueError("vqa_accuracy needs at least one ground-truth answer")
    return answer_scores([normalize_answer(a) for a in gt_answers]).get(
        normalize_answer(prediction), 0.0
    )


def answer_scores(normalized_answers: Sequence[str]) -> dict[str, float]:
    """VQA accuracy of every answer that some annotator gave (answers already normalized).

    Leaving out annotator k changes the count of the answer k gave by one, so an answer given
    by c of n annotators scores (c * min((c-1)/3, 1) + (n-c) * min(c/3, 1)) / n.
    """
    n = len(normalized_answers)
    scores = {}
    for answer, c in Counter(normalized_answers).items():
        scores[answer] = (c * min((c - 1) / 3, 1.0) + (n - c) * min(c / 3, 1.0)) / n
    return scores


class VQAAccuracy(Metric):
    """Mean VQA accuracy, overall and per question type; DDP-safe (all states are sums).

    `compute()` returns {"acc": tensor, "acc_<type>": tensor, ...}; a type without questions
    reports NaN rather than a made-up 0.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, question_types: Sequence[str] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        self.question_types = list(question_types)
        n_types = max(len(self.question_types), 1)
        self.add_state(
            "total_score", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state(
            "type_score", default=torch.zeros(n_types, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state(
            "type_count", default=torch.zeros(n_types, dtype=torch.long), dist_reduce_fx="sum"
        )

    def update(self, preds, target, question_type: Tensor | Sequence | None = None) -> None:
        """preds: answer strings or (N,) vocabulary indices; target: lists of annotator answers
        or (N, A) answer scores; question_type: (N,) indices into `question_types` or names."""
        if isinstance(preds, Tensor):
            if not isinstance(target, Tensor) or target.dim() != 2:
                raise ValueError("index predictions need a (N, num_answers) score tensor target")
            scores = target.gather(1, preds.long().view(-1, 1)).squeeze(1).double()
        else:
            if len(preds) != len(target):
                raise ValueError(f"{len(preds)} predictions but {len(target)} answer lists")
            scores = torch.tensor(
                [vqa_accuracy(p, t) for p, t in zip(preds, target)],
                dtype=torch.float64,
                device=self.total_score.device,
            )
        self.total_score += scores.sum()
        self.count += scores.numel()
        if question_type is not None and self.question_types:
            types = self._type_indices(question_type).to(scores.device)
            self.type_score.index_add_(0, types, scores)
            self.type_count.index_add_(0, types, torch.ones_like(types))

    def _type_indices(self, question_type) -> Tensor:
        if isinstance(question_type, Tensor):
            return question_type.long().view(-1)
        try:
            return torch.tensor([self.question_types.index(t) for t in question_type])
        except ValueError as err:
            raise ValueError(f"{err}; known question types: {self.question_types}") from None

    def compute(self) -> dict[str, Tensor]:
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=self.total_score.device)
        result = {"acc": self.total_score / self.count if self.count > 0 else nan}
        for i, name in enumerate(self.question_types):
            count = self.type_count[i]
            result[f"acc_{metric_name(name)}"] = self.type_score[i] / count if count > 0 else nan
        return {k: v.float() for k, v in result.items()}


def metric_name(question_type: str) -> str:
    """A question type as a log-name suffix ("yes/no" -> "yes_no")."""
    return re.sub(r"[^0-9a-zA-Z]+", "_", question_type).strip("_") or "other"
