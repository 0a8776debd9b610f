"""`VQADataModule`: the synthetic benchmark (default) or real VQA-v2, as batches of box features.

Both sources end up in the same form: per split, questions (token ids), soft answer scores over
an answer vocabulary built from the training split, a question type, and the index of the
question's image in a box-feature store that returns (views x boxes x D) features with a mask.

A batch is a dict:
  features      (B, V, N, D) float32   V views, N = max_boxes, D = feature dim (+4 box coords)
  box_mask      (B, V, N) bool         True = padding
  question      (B, L) long            token ids, 0 = padding
  question_length (B,) long
  scores        (B, A) float32         VQA accuracy of each vocabulary answer (the BCE target)
  question_type (B,) long              index into model_kwargs()["question_types"]
Synthetic data only (the model never sees them; the module's analysis metrics use them):
  hidden        (B,) bool              the answer depends on objects the primary view misses
  box_kind      (B, V, N) int8         -1 padding, else index into synthetic.BOX_KINDS
                                       (background / object the primary view sees / misses)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from attnlab.config_schema import POSITIVE_INT, Rule
from attnlab.errors import ConfigError, DataError, require_dir, require_file
from tasks.common.datamodule import SplitsDataModule
from tasks.vqa import synthetic, synthetic_questions
from tasks.vqa.dataset import MMFStore, RawSplit, SyntheticStore, VQADataset, batch_as_is
from tasks.vqa.metric import VQAAccuracy, answer_scores, normalize_answer
from tasks.vqa.vqav2 import MMFFeatures, read_split

PAD, UNK = "<pad>", "<unk>"
VQAV2_ANSWER_TYPES = ("yes/no", "number", "other")
# At most this many distinct answers per question get a score (VQA-v2 has 10 annotators).
MAX_TARGETS = 10


class VQADataModule(SplitsDataModule):
    # ranges of this task's own options, checked before any work (attnlab.config_schema)
    option_rules: ClassVar[dict[str, Rule]] = {"max_boxes": Rule(POSITIVE_INT.ok, "an integer >= 1 (boxes kept per view)", "100"),
                    "answer_vocab_size": Rule(POSITIVE_INT.ok, "an integer >= 1", "3000")}

    # keyword-only after data_dir; the defaults are conf/task/vqa.yaml's, and the generator's and
    # VQA-v2's options (task.synthetic, task.vqav2: their home) have none (test_config_homes.py)
    def __init__(
        self,
        data_dir: str,
        *,
        source: str = "synthetic",
        synthetic: dict | None,
        vqav2: dict | None,
        batch_size: int = 128,
        eval_batch_size: int | None,
        num_workers: int = 0,
        max_question_length: int = 20,
        answer_vocab_size: int = 3000,
        max_boxes: int = 100,
        box_coords: bool = True,
    ) -> None:
        # no seed: the training order follows the run's seed (seed_everything)
        super().__init__(batch_as_is, batch_size, eval_batch_size, num_workers)
        self.data_dir = Path(data_dir)
        self.source = str(source)
        if self.source not in ("synthetic", "vqav2"):
            raise ConfigError(f"task.source={self.source!r}; use synthetic (default) or vqav2")
        self.synthetic_params = synthetic_params(synthetic, max_boxes)
        self.vqav2 = _plain(vqav2) or {}
        self.max_question_length = int(max_question_length)
        self.answer_vocab_size = int(answer_vocab_size)
        self.max_boxes = int(max_boxes)
        self.box_coords = bool(box_coords)
        self.datasets: dict[str, VQADataset] = {}
        self.answers: list[str] = []
        self.question_types: list[str] = []
        self.tokenizer = None

    # --- preparation -------------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self.source == "synthetic":
            synthetic.prepare(self.data_dir, self.synthetic_params)
        else:
            for split in ("train", "val"):
                cfg = self._vqav2_split(split)
                for key in ("questions", "annotations"):
                    path = cfg.get(key)
                    if not path:
                        raise DataError(f"task.vqav2.{split}.{key} is not set; give the official "
                                        f"VQA-v2 {key} JSON file")
                    require_file(path, f"task.vqav2.{split}.{key}",
                                 example=f"task.vqav2.{split}.{key}=/data/vqa/v2_{key}.json")
                dirs = cfg.get("feature_dirs") or []
                if not dirs:
                    raise ConfigError(
                        f"task.vqav2.{split}.feature_dirs is empty; give one MMF feature "
                        f"directory per view (detector), e.g. '[/feats/d1,/feats/d2,/feats/d3]'"
                    )
                for directory in dirs:
                    require_dir(directory, f"task.vqav2.{split}.feature_dirs")

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        raw = self._read_synthetic() if self.source == "synthetic" else self._read_vqav2()
        self.tokenizer = build_tokenizer(raw["train"].questions, self.max_question_length)
        self.answers = build_answer_vocab(raw["train"].answers, self.answer_vocab_size)
        for split, data in raw.items():
            self.datasets[split] = self._encode(data)

    def _read_synthetic(self) -> dict[str, RawSplit]:
        arrays = synthetic.load_or_rebuild(self.data_dir, self.synthetic_params)
        self.question_types = list(synthetic_questions.QUESTION_TYPES)
        raw = {}
        for split in synthetic.SPLITS:
            store = SyntheticStore(
                arrays[f"{split}_features"],
                arrays[f"{split}_bbox"],
                arrays[f"{split}_num_boxes"],
                synthetic.box_kinds(arrays, split),
            )
            raw[split] = RawSplit(
                questions=arrays[f"{split}_question"].tolist(),
                answers=arrays[f"{split}_answers"].tolist(),
                question_types=arrays[f"{split}_question_type"].tolist(),
                image_keys=arrays[f"{split}_image"].astype(np.int64),
                store=store,
                hidden=arrays[f"{split}_hidden"],
            )
        return raw

    def _vqav2_split(self, split: str) -> dict:
        cfg = self.vqav2.get(split)
        if split == "test" and not cfg:
            cfg = self.vqav2.get("val")  # test-dev answers are not public: test on val
        if not cfg:
            raise ConfigError(
                f"task.vqav2.{split} is not set; give questions, annotations, feature_dirs"
            )
        return cfg

    def _read_vqav2(self) -> dict[str, RawSplit]:
        self.question_types = list(VQAV2_ANSWER_TYPES)
        raw = {}
        for split in ("train", "val", "test"):
            cfg = self._vqav2_split(split)
            records = read_split(cfg["questions"], cfg["annotations"])
            files = MMFFeatures(
                cfg.get("feature_dirs") or [], cfg.get("name_pattern", "{image_id}"), self.max_boxes
            )
            image_ids = np.array([r.image_id for r in records], dtype=np.int64)
            files.check_exist(image_ids)
            if len(image_ids):
                files.load(int(image_ids[0]))  # learns D, fails early on a corrupt first file
            raw[split] = RawSplit(
                questions=[r.question for r in records],
                answers=[r.answers for r in records],
                question_types=[
                    r.answer_type if r.answer_type in VQAV2_ANSWER_TYPES else "other"
                    for r in records
                ],
                image_keys=image_ids,
                store=MMFStore(files),
            )
        return raw

    def _encode(self, data: RawSplit) -> VQADataset:
        encodings = self.tokenizer.encode_batch(data.questions)
        tokens = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        lengths = torch.tensor([max(sum(e.attention_mask), 1) for e in encodings])
        index = {a: i for i, a in enumerate(self.answers)}
        id_rows, score_rows = [], []
        for answers in data.answers:
            scored = answer_scores([normalize_answer(x) for x in answers])
            known = [(index[a], s) for a, s in scored.items() if a in index][:MAX_TARGETS]
            padding = [(-1, 0.0)] * (MAX_TARGETS - len(known))
            ids, scores = zip(*(known + padding))
            id_rows.append(ids)
            score_rows.append(scores)
        answer_ids = torch.tensor(id_rows, dtype=torch.long).view(-1, MAX_TARGETS)
        scores = torch.tensor(score_rows, dtype=torch.float32).view(-1, MAX_TARGETS)
        type_ids = torch.tensor([self.question_types.index(t) for t in data.question_types])
        return VQADataset(
            data, tokens, lengths, answer_ids, scores, type_ids, len(self.answers), self.box_coords
        )

    # --- what the model needs to know --------------------------------------------------------

    def model_kwargs(self) -> dict:
        if not self.datasets:
            raise RuntimeError("call setup() before model_kwargs()")
        store = self.datasets["train"].split.store
        return {
            "vocab_size": self.tokenizer.get_vocab_size(),
            "num_answers": len(self.answers),
            "feature_dim": store.feature_dim + (4 if self.box_coords else 0),
            "num_views": self.datasets["train"][0]["features"].shape[0],
            "question_types": list(self.question_types),
        }

    def question_prior(self, split: str = "test") -> dict[str, float]:
        """VQA accuracy of a blind baseline that answers each question string with the answer of
        highest total score in the training split for that string (for a string never seen in
        training: its question type's best answer). It is an upper bound for what a model can
        get from the question alone; {"acc": ..., "acc_<type>": ...}."""
        train, target = self.datasets["train"], self.datasets[split]
        by_question: dict[str, Counter] = {}
        by_type: dict[int, Counter] = {}
        for text, qtype, ids, scores in zip(
            train.split.questions, train.type_ids.tolist(), train.answer_ids.tolist(),
            train.answer_scores.tolist(),
        ):
            for table, key in ((by_question, text), (by_type, qtype)):
                tally = table.setdefault(key, Counter())
                for answer, score in zip(ids, scores):
                    if answer >= 0:
                        tally[answer] += score
        best = []
        for text, qtype in zip(target.split.questions, target.type_ids.tolist()):
            tally = by_question.get(text) or by_type.get(qtype) or Counter({0: 0.0})
            # ties broken by the answer index (vocabulary order), so the result is deterministic
            best.append(min(tally, key=lambda a: (-tally[a], a)))
        dense = torch.zeros(len(target), len(self.answers) + 1)  # + a spare column for -1
        dense.scatter_(1, target.answer_ids % (len(self.answers) + 1), target.answer_scores)
        metric = VQAAccuracy(self.question_types)
        metric.update(torch.tensor(best), dense[:, :-1], target.type_ids)
        return {k: float(v) for k, v in metric.compute().items() if not torch.isnan(v)}

    def majority_baseline(self, split: str = "val") -> float:
        """VQA accuracy on `split` of always giving the answer of highest total score in the
        training split: the trivial baseline (the card's `baseline`, val/baseline_acc)."""
        train, target = self.datasets["train"], self.datasets[split]
        totals = torch.zeros(len(self.answers) + 1)  # + a spare column for -1 (no answer)
        totals.scatter_add_(0, train.answer_ids.flatten() % (len(self.answers) + 1), train.answer_scores.flatten())
        majority = int(totals[:-1].argmax())
        dense = torch.zeros(len(target), len(self.answers) + 1)
        dense.scatter_(1, target.answer_ids % (len(self.answers) + 1), target.answer_scores)
        metric = VQAAccuracy(self.question_types)
        metric.update(torch.full((len(target),), majority), dense[:, :-1], target.type_ids)
        return float(metric.compute()["acc"])

    def split_data(self, split: str) -> VQADataset:
        return self.datasets[split]


def build_tokenizer(questions: Sequence[str], max_length: int):
    """A word-level tokenizer (lower-cased words and punctuation) fitted on training questions."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.trainers import WordLevelTrainer

    tokenizer = Tokenizer(WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(questions, trainer=WordLevelTrainer(special_tokens=[PAD, UNK]))
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(PAD), pad_token=PAD, length=max_length)
    return tokenizer


def build_answer_vocab(answers: Sequence[Sequence[str]], size: int) -> list[str]:
    """The `size` most frequent normalized annotator answers of the training split."""
    counts = Counter(normalize_answer(a) for per_question in answers for a in per_question)
    counts.pop("", None)
    # Ties broken by the answer text, so the vocabulary does not depend on reading order.
    return [a for a, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]


def synthetic_params(cfg: dict | None, max_boxes: int) -> synthetic.SyntheticParams:
    values = _plain(cfg) or {}
    values.setdefault("max_boxes", max_boxes)
    known = synthetic.SyntheticParams.__dataclass_fields__
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown task.synthetic options {unknown}; known: {sorted(known)}")
    if values["max_boxes"] != max_boxes:
        raise ConfigError(
            f"task.synthetic.max_boxes={values['max_boxes']} differs from the data module's "
            f"max_boxes={max_boxes}; set only task.max_boxes"
        )
    return synthetic.SyntheticParams(**values)


def _plain(cfg) -> dict | None:
    """DictConfig -> dict (Hydra passes nested configs as DictConfig)."""
    if cfg is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)
