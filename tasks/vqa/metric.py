"""VQA accuracy (Antol et al. 2015; the VQA-v2 evaluation) as a torchmetrics `Metric`.

An answer's accuracy on one question is `min(#annotators who gave it / 3, 1)`, averaged over the
10 subsets of 9 annotators (leave one out). Answers are compared after the official
normalization: lower-case, punctuation removed, number words to digits, articles dropped, and
the official contraction table ("dont" -> "don't"; words it does not list, such as "well" or
"its", stay as they are).

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

# The contraction table of the official evaluation (GT-Vision-Lab/VQA, vqaEval.py), listed here by
# the form it writes, with the spellings that the official table maps to it. Official semantics:
# one dictionary lookup per word, after lower-casing, number mapping and article removal; only the
# spellings listed are mapped (real words such as "well", "its", "ill", "wed" stay as they are).
# Kept as the official table has them, so that scores equal the official script's:
# - capitalised spellings (Id've, I'dve, Im, Ive) that never match a lower-cased word;
# - identity entries (let's, she's);
# - "somebody'd" -> "somebodyd", the reverse of every other entry.
_OFFICIAL_CONTRACTIONS: dict[str, tuple[str, ...]] = {
    "ain't": ("aint",),
    "aren't": ("arent",),
    "can't": ("cant",),
    "could've": ("couldve",),
    "couldn't": ("couldnt",),
    "couldn't've": ("couldn'tve", "couldnt've"),
    "didn't": ("didnt",),
    "doesn't": ("doesnt",),
    "don't": ("dont",),
    "hadn't": ("hadnt",),
    "hadn't've": ("hadnt've", "hadn'tve"),
    "hasn't": ("hasnt",),
    "haven't": ("havent",),
    "he'd": ("hed",),
    "he'd've": ("hed've", "he'dve"),
    "he's": ("hes",),
    "how'd": ("howd",),
    "how'll": ("howll",),
    "how's": ("hows",),
    "I'd've": ("Id've", "I'dve"),
    "I'm": ("Im",),
    "I've": ("Ive",),
    "isn't": ("isnt",),
    "it'd": ("itd",),
    "it'd've": ("itd've", "it'dve"),
    "it'll": ("itll",),
    "let's": ("let's",),
    "ma'am": ("maam",),
    "mightn't": ("mightnt",),
    "mightn't've": ("mightnt've", "mightn'tve"),
    "might've": ("mightve",),
    "mustn't": ("mustnt",),
    "must've": ("mustve",),
    "needn't": ("neednt",),
    "not've": ("notve",),
    "o'clock": ("oclock",),
    "oughtn't": ("oughtnt",),
    "'ow's'at": ("ow's'at", "'ows'at", "'ow'sat"),
    "shan't": ("shant",),
    "she'd've": ("shed've", "she'dve"),
    "she's": ("she's",),
    "should've": ("shouldve",),
    "shouldn't": ("shouldnt",),
    "shouldn't've": ("shouldnt've", "shouldn'tve"),
    "somebodyd": ("somebody'd",),
    "somebody'd've": ("somebodyd've", "somebody'dve"),
    "somebody'll": ("somebodyll",),
    "somebody's": ("somebodys",),
    "someone'd": ("someoned",),
    "someone'd've": ("someoned've", "someone'dve"),
    "someone'll": ("someonell",),
    "someone's": ("someones",),
    "something'd": ("somethingd",),
    "something'd've": ("somethingd've", "something'dve"),
    "something'll": ("somethingll",),
    "that's": ("thats",),
    "there'd": ("thered",),
    "there'd've": ("thered've", "there'dve"),
    "there're": ("therere",),
    "there's": ("theres",),
    "they'd": ("theyd",),
    "they'd've": ("theyd've", "they'dve"),
    "they'll": ("theyll",),
    "they're": ("theyre",),
    "they've": ("theyve",),
    "'twas": ("twas",),
    "wasn't": ("wasnt",),
    "we'd've": ("wed've", "we'dve"),
    "we've": ("weve",),
    "weren't": ("werent",),
    "what'll": ("whatll",),
    "what're": ("whatre",),
    "what's": ("whats",),
    "what've": ("whatve",),
    "when's": ("whens",),
    "where'd": ("whered",),
    "where's": ("wheres",),
    "where've": ("whereve",),
    "who'd": ("whod",),
    "who'd've": ("whod've", "who'dve"),
    "who'll": ("wholl",),
    "who's": ("whos",),
    "who've": ("whove",),
    "why'll": ("whyll",),
    "why're": ("whyre",),
    "why's": ("whys",),
    "won't": ("wont",),
    "would've": ("wouldve",),
    "wouldn't": ("wouldnt",),
    "wouldn't've": ("wouldnt've", "wouldn'tve"),
    "y'all": ("yall",),
    "y'all'll": ("yall'll", "y'allll"),
    "y'all'd've": ("yall'd've", "y'alld've", "y'all'dve"),
    "you'd": ("youd",),
    "you'd've": ("youd've", "you'dve"),
    "you'll": ("youll",),
    "you're": ("youre",),
    "you've": ("youve",),
}
_CONTRACTION_MAP = {
    spelling: written
    for written, spellings in _OFFICIAL_CONTRACTIONS.items()
    for spelling in spellings
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
