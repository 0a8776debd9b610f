"""`HeadlineDataModule`: Debian (default) or Gigaword article -> headline pairs, WordPiece ids.

Batches are dicts:
    src_ids   (B, S) long  [CLS] article [SEP], padded with [PAD]
    tgt_ids   (B, T) long  [CLS] headline [SEP], padded; [CLS] starts decoding, [SEP] ends it
    articles, headlines    the raw texts (the predictions file and the ROUGE references)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import ConfigError, DataError
from tasks.common.batching import SPLITS, STAGE_SPLITS, EncodedSplitsDataModule, pad_rows
from tasks.common.bert_assets import CLS_ID, PAD_ID, SEP_ID, UNK_ID, load_tokenizer
from tasks.headline import gigaword, pairs
from tasks.headline.example import HeadlinePair

SOURCES = ("debian", "gigaword")
# Our split names -> the Gigaword file prefixes.
_GIGAWORD_SPLIT = {"train": "train", "val": "valid", "test": "test"}


class HeadlineDataModule(EncodedSplitsDataModule):
    # keyword-only; the defaults are conf/task/headline.yaml's, and the data folders (the run's
    # paths.data_dir) have none (tests/tasks/test_config_homes.py)
    def __init__(
        self,
        *,
        source: str = "debian",
        debian_dir: str,
        pairs_dir: str,
        gigaword_dir: str | None = None,
        translation_files: Sequence[str] | None = None,
        min_words: int = 10,
        max_words: int = 60,
        split_fractions: Sequence[float] = pairs.DEFAULT_FRACTIONS,
        max_source_length: int = 128,
        max_target_length: int = 64,
        max_train_examples: int | None = 9600,
        max_val_examples: int | None = None,
        max_test_examples: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 64,
        num_workers: int = 0,
        subset_seed: int = 0,
        output_vocab: str = "train",
    ) -> None:
        super().__init__(
            collate, batch_size, eval_batch_size, num_workers,
            {"train": max_train_examples, "val": max_val_examples, "test": max_test_examples}, subset_seed,
        )
        if source not in SOURCES:
            raise ConfigError(f"task.datamodule.source={source!r}; use one of {', '.join(SOURCES)}")
        if source == "gigaword" and not gigaword_dir:
            raise ConfigError(
                "task.datamodule.source=gigaword needs task.datamodule.gigaword_dir=<folder with "
                "train/valid/test .article.txt and .title.txt (Rush et al. 2015)>"
            )
        if output_vocab not in ("train", "full"):
            raise ConfigError(
                f"task.datamodule.output_vocab={output_vocab!r}; use 'train' (the word pieces of the "
                f"training headlines) or 'full' (all 30,522)"
            )
        if max_source_length < 3 or max_target_length < 3:
            raise ConfigError(
                "max_source_length and max_target_length must be >= 3 ([CLS] x [SEP])"
            )
        self.source = source
        self.debian_dir = Path(debian_dir)
        self.pairs_dir = Path(pairs_dir)
        self.gigaword_dir = Path(gigaword_dir) if gigaword_dir else None
        self.translation_files = list(translation_files) if translation_files else None
        self.min_words, self.max_words = int(min_words), int(max_words)
        self.split_fractions = tuple(float(f) for f in split_fractions)
        self.max_source_length = int(max_source_length)
        self.max_target_length = int(max_target_length)
        self.output_vocab = output_vocab
        self.tokenizer = None

    # -- preparation -------------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self.source == "debian":
            pairs.prepare_pairs(
                self.debian_dir,
                self.pairs_dir,
                self.min_words,
                self.max_words,
                self.split_fractions,
                translation_files=self.translation_files,
            )
        else:  # check that all six files are there and aligned, before training starts
            gigaword.read_gigaword(self.gigaword_dir)

    def load_split(self, split: str) -> list[HeadlinePair]:
        if self.source == "debian":
            return pairs.load_pairs(self.pairs_dir, split)
        return [
            HeadlinePair(gigaword.to_model_text(p.article), p.headline, p.source_id)
            for p in gigaword.read_split(self.gigaword_dir, _GIGAWORD_SPLIT[split])
        ]

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(None)  # we truncate ourselves, per side
        for split in STAGE_SPLITS.get(stage, SPLITS):
            if split in self.data:
                continue
            examples = self.subset(self.load_split(split), split)
            if not examples:
                raise DataError(
                    f"the headline {split} split is empty ({self.source} data); with "
                    f"source=debian give it a share in task.datamodule.split_fractions, with "
                    f"gigaword check the {_GIGAWORD_SPLIT[split]}.*.txt files"
                )
            self.data[split] = self._encode(examples)
            print(f"[headline] {split}: {len(self.data[split])} pairs ({self.source})", flush=True)

    def _ids(self, texts: list[str], max_length: int) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [[CLS_ID] + e.ids[: max_length - 2] + [SEP_ID] for e in encodings]

    def _encode(self, examples: list[HeadlinePair]) -> list[dict]:
        src = self._ids([e.article for e in examples], self.max_source_length)
        # Headlines are tokenized lowercased like the articles; the raw text stays the ROUGE reference.
        tgt = self._ids(
            [gigaword.to_model_text(e.headline) for e in examples], self.max_target_length
        )
        return [
            {"src_ids": s, "tgt_ids": t, "article": e.article, "headline": e.headline}
            for s, t, e in zip(src, tgt, examples)
        ]

    # -- what the model needs ----------------------------------------------------------------

    def model_kwargs(self) -> dict:
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(None)
        net = {
            "vocab_size": self.tokenizer.get_vocab_size(),
            "pad_id": PAD_ID,
            "max_source_positions": self.max_source_length,
            "max_target_positions": self.max_target_length,
        }
        if self.output_vocab == "train":
            net["output_vocab"] = self.headline_vocabulary()
        return {"bos_id": CLS_ID, "eos_id": SEP_ID, "unk_id": UNK_ID, "net": net}

    def headline_vocabulary(self) -> list[int]:
        """The token ids of the training headlines, plus [PAD], [UNK], [CLS], [SEP] (sorted).

        The decoder only ever needs to produce these: ~9k of the 30,522 word pieces on Debian.
        """
        if "train" not in self.data:
            self.setup("fit")
        ids = {PAD_ID, UNK_ID, CLS_ID, SEP_ID}
        for example in self.data["train"]:
            ids.update(example["tgt_ids"])
        return sorted(ids)


def collate(items: list[dict]) -> dict:
    return {
        "src_ids": pad_rows([it["src_ids"] for it in items], PAD_ID),
        "tgt_ids": pad_rows([it["tgt_ids"] for it in items], PAD_ID),
        "articles": [it["article"] for it in items],
        "headlines": [it["headline"] for it in items],
    }
