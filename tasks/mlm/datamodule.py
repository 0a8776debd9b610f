"""MLM data: paragraphs of the Debian descriptions (or plain-text files), WordPiece, n-gram masks.

Examples are packed as in BERT/RoBERTa pretraining: consecutive paragraphs fill a sequence of up
to max_length tokens, `[CLS] p1 [SEP] p2 [SEP] ...` (a paragraph longer than that is truncated and
stands alone), so batches carry almost no padding and attention sees long contexts. `pack: false`
gives one paragraph per example instead.

Masks are drawn when an example is fetched, from an RNG seeded by (seed, epoch, index): every
epoch masks the training text anew, the same way on every rerun; val/test always use epoch 0
(a fixed evaluation set).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.config_schema import POSITIVE_INT, Rule
from attnlab.errors import ConfigError, DataError
from tasks.common import bert_assets, debian
from tasks.common.cache import cache_path, load_arrays, save_arrays
from tasks.common.datamodule import SplitsDataModule
from tasks.common.files import sha256_of
from tasks.common.plain_text import check_files, read_plain_text, split_plain_paragraphs
from tasks.mlm.masking import IGNORE, MaskingConfig, example_rng, mask_example


@dataclass
class PackedText:
    """Tokenized examples as flat arrays: example i is ids[offsets[i]:offsets[i + 1]]."""

    ids: np.ndarray  # int32 token ids, [CLS]/[SEP] included
    word_ids: np.ndarray  # int32 word index of each token within its example, -1 for [CLS]/[SEP]
    offsets: np.ndarray  # int64, len = examples + 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.ids[a:b].astype(np.int64), self.word_ids[a:b]

    def head(self, n: int) -> PackedText:
        n = min(n, len(self))
        end = self.offsets[n]
        return PackedText(self.ids[:end], self.word_ids[:end], self.offsets[: n + 1])


def pack_paragraphs(encodings: Iterable[tuple[Sequence[int], Sequence[int | None]]], max_length: int,
                    pack: bool = True) -> PackedText:
    """(token ids, word ids) of paragraphs without special tokens -> examples with [CLS]/[SEP].

    Word ids are renumbered per example so that words of different paragraphs never share an id
    (the masking groups word pieces by word id).
    """
    ids: list[int] = []
    words: list[int] = []
    offsets = [0]
    length = 0  # tokens in the open example, [CLS] included
    next_word = 0
    for piece_ids, piece_words in encodings:
        piece_ids, piece_words = list(piece_ids)[: max_length - 2], list(piece_words)[: max_length - 2]
        if not piece_ids:
            continue
        if length and (length + len(piece_ids) + 1 > max_length or not pack):
            offsets.append(len(ids))  # close the open example
            length = 0
        if length == 0:
            ids.append(bert_assets.CLS_ID)
            words.append(-1)
            length, next_word = 1, 0
        ids.extend(piece_ids)
        ids.append(bert_assets.SEP_ID)
        words.extend(-1 if w is None else w + next_word for w in piece_words)
        words.append(-1)
        next_word = max(words[-len(piece_words) - 1:]) + 1
        length += len(piece_ids) + 1
    if length:
        offsets.append(len(ids))
    return PackedText(np.asarray(ids, dtype=np.int32), np.asarray(words, dtype=np.int32),
                      np.asarray(offsets, dtype=np.int64))


class MaskedTextDataset(Dataset):
    """Tokenized examples; __getitem__ masks one with the RNG of (seed, epoch, index)."""

    def __init__(self, text: PackedText, masking: MaskingConfig, seed: int, train: bool) -> None:
        self.text = text
        self.masking = masking
        self.seed = seed
        self.train = train
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        if self.train:  # eval sets keep the masks of epoch 0
            self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.text)

    def __getitem__(self, index: int) -> dict:
        ids, word_ids = self.text.example(index)
        ex = mask_example(ids, word_ids, self.masking, example_rng(self.seed, self.epoch, index))
        return {"input_ids": torch.from_numpy(ex.input_ids), "labels": torch.from_numpy(ex.labels)}


def pad_collate(pad_id: int):
    def collate(batch: Sequence[dict]) -> dict:
        length = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), length), IGNORE, dtype=torch.long)
        for row, b in enumerate(batch):
            ids[row, : len(b["input_ids"])] = b["input_ids"]
            labels[row, : len(b["labels"])] = b["labels"]
        lengths = torch.tensor([len(b["input_ids"]) for b in batch])
        padding_mask = torch.arange(length)[None, :] >= lengths[:, None]  # True = padding
        return {"input_ids": ids, "labels": labels, "padding_mask": padding_mask}

    return collate


class MLMDataModule(SplitsDataModule):
    # ranges of this task's own options, checked before any work (attnlab.config_schema)
    option_rules: ClassVar[dict[str, Rule]] = {"mask_rate": Rule(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                                      and 0 < v < 1, "a number in (0, 1)", "0.15"),
                    "max_ngram": Rule(POSITIVE_INT.ok, "an integer >= 1", "3")}

    # keyword-only; the defaults are conf/task/mlm.yaml's, and what the run gives it (the data
    # folder, the seed) has none (tests/tasks/test_config_homes.py)
    def __init__(
        self,
        *,
        data_dir: str,
        files: Sequence[str] | None = None,
        fractions: Sequence[float] = debian.DEFAULT_FRACTIONS,
        max_length: int = 64,
        pack: bool = True,
        min_words: int = 3,
        max_train_examples: int | None = None,
        max_eval_examples: int | None = None,
        batch_size: int = 16,
        num_workers: int = 0,
        seed: int,
        mask_rate: float = 0.15,
        max_ngram: int = 3,
    ) -> None:
        # one batch size for all splits; workers are re-created each epoch (not persistent) so
        # that they see the new epoch's masks
        super().__init__(pad_collate(bert_assets.PAD_ID), batch_size, batch_size, num_workers, seed,
                         persistent_workers=False)
        self.save_hyperparameters()
        self.files = list(files) if files else None
        self.data_dir = Path(data_dir)
        self.fractions = tuple(float(f) for f in fractions)
        if int(max_length) < 8:
            raise ConfigError(f"task.data.max_length={max_length} is too short for [CLS] text [SEP]; use >= 8")
        if not 0 < mask_rate < 1 or int(max_ngram) < 1:
            raise ConfigError(f"mask_rate={mask_rate} must be in (0, 1) and max_ngram={max_ngram} >= 1")
        self.tokenizer = None
        self.datasets: dict[str, MaskedTextDataset] = {}

    # -- preparation -----------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self.files:  # user text: nothing to fetch, but say early if a file is missing
            check_files(self.files)
            return
        debian.prepare(self.data_dir)

    def _paragraphs(self) -> dict[str, list[str]]:
        if self.files:
            per_split = split_plain_paragraphs(read_plain_text(self.files), self.fractions)
        else:
            rows = debian.load_rows(self.data_dir)
            for row in rows:  # the split of the requested fractions (records.jsonl holds the default)
                row["split"] = debian.split_of(row["family"], self.fractions)
            per_split = debian.unique_paragraphs(rows)
        min_words = self.hparams.min_words
        return {k: [p for p in v if len(p.split()) >= min_words] for k, v in per_split.items()}

    def _masking(self) -> MaskingConfig:
        vocab = self.tokenizer.get_vocab()
        # Random replacements come from real word pieces: ids past [PAD], [unusedN], [CLS], ...
        bracketed = [i for t, i in vocab.items() if t.startswith("[") and t.endswith("]")]
        return MaskingConfig(
            mask_id=bert_assets.MASK_ID,
            vocab_size=self.tokenizer.get_vocab_size(),
            rate=float(self.hparams.mask_rate),
            max_ngram=int(self.hparams.max_ngram),
            random_low=max(bracketed) + 1,
        )

    def _cache_path(self) -> Path | None:
        """Where the tokenized Debian corpus is kept (None: do not cache).

        Tokenizing ~90k paragraphs takes a minute on 2 cores; the cache key covers everything the
        result depends on (source sha256s via the manifest, tokenizer, lengths, splitting).
        """
        hp = self.hparams
        if self.files or hp.max_train_examples or hp.max_eval_examples:
            return None  # user text or a small smoke run: tokenize directly
        manifest = self.data_dir / debian.MANIFEST_FILE
        if not manifest.is_file():
            return None
        key_parts = {
            "sources": json.loads(manifest.read_text()).get("sources"),
            "tokenizer": sha256_of(bert_assets.bert_dir() / "tokenizer.json"),
            "max_length": hp.max_length, "pack": hp.pack, "min_words": hp.min_words, "fractions": self.fractions,
            "version": 1,
        }
        return cache_path(self.data_dir / "cache", "mlm", key_parts)

    def _tokenize(self, paragraphs: list[str]) -> PackedText:
        encoded = self.tokenizer.encode_batch(paragraphs, add_special_tokens=False)
        return pack_paragraphs(((e.ids, e.word_ids) for e in encoded), self.hparams.max_length,
                               pack=self.hparams.pack)

    def _load_splits(self) -> dict[str, PackedText]:
        cache = self._cache_path()
        arrays = load_arrays(cache)
        if arrays is not None:
            return {split: PackedText(arrays[f"{split}_ids"], arrays[f"{split}_word_ids"],
                                      arrays[f"{split}_offsets"]) for split in debian.SPLITS}
        hp = self.hparams
        limits = {"train": hp.max_train_examples, "val": hp.max_eval_examples, "test": hp.max_eval_examples}
        texts = {}
        for split, paragraphs in self._paragraphs().items():
            if limits[split]:  # a packed example holds at most max_length / 4 paragraphs (>= 3 tokens + [SEP])
                per_example = max(1, hp.max_length // 4) if hp.pack else 1
                paragraphs = paragraphs[: int(limits[split]) * per_example]
            if not paragraphs:
                raise DataError(
                    f"the {split} split of {self.files or self.data_dir} has no paragraphs of >= "
                    f"{hp.min_words} words; give more text or change task.data.fractions"
                )
            print(f"[mlm] tokenizing {len(paragraphs)} {split} paragraphs", flush=True)
            text = self._tokenize(paragraphs)
            texts[split] = text.head(int(limits[split])) if limits[split] else text
        if cache is not None:
            arrays = {f"{split}_{name}": getattr(text, name) for split, text in texts.items()
                      for name in ("ids", "word_ids", "offsets")}
            save_arrays(cache, arrays)
            print(f"[mlm] cached the tokenized corpus in {cache}")
        return texts

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        # Paragraphs are encoded without [CLS]/[SEP] (added when packing), truncated to leave room for them.
        self.tokenizer = bert_assets.load_tokenizer(self.hparams.max_length - 2)
        masking = self._masking()
        for split, text in self._load_splits().items():
            self.datasets[split] = MaskedTextDataset(text, masking, self.hparams.seed, split == "train")
        sizes = {k: len(v) for k, v in self.datasets.items()}
        print(f"[mlm] examples per split: {sizes} (max_length {self.hparams.max_length}, "
              f"pack {self.hparams.pack})")

    def model_kwargs(self) -> dict:
        if self.tokenizer is None:
            self.setup("fit")
        return {"vocab_size": self.tokenizer.get_vocab_size(), "pad_id": bert_assets.PAD_ID,
                "max_length": int(self.hparams.max_length), "unigram_id": self.unigram_id()}

    def unigram_id(self) -> int:
        """The most frequent word piece of the training text ([CLS]/[SEP] aside): the unigram
        prediction, the trivial baseline every masked token is scored against."""
        text = self.datasets["train"].text
        return int(np.bincount(text.ids[text.word_ids >= 0]).argmax())

    def set_epoch(self, epoch: int) -> None:
        """Called by the module at each training epoch start: new masks for the new epoch."""
        if "train" in self.datasets:
            self.datasets["train"].set_epoch(epoch)

    # -- loaders -----------------------------------------------------------------------------

    def split_data(self, split: str) -> MaskedTextDataset:
        return self.datasets[split]
