"""`ClassifyDataModule`: Debian sections (default), label<TAB>text or SNLI, as padded token ids.

Batches are dicts:
    input_ids     (B, S) long   token ids, padded with [PAD] (id 0)
    padding_mask  (B, S) bool   True = padding (the attention API's convention)
    lengths       (B,)   long   tokens per row (for packed LSTM sequences)
    labels        (B,)   long   class index into model_kwargs()["label_names"]
and for sentence pairs (SNLI) also input_ids_b, padding_mask_b, lengths_b: the hypothesis,
encoded separately from the premise (Lin et al. 2017 combine the two sentence embeddings).

Training batches are drawn by `LengthGroupedSampler` (texts of similar lengths together, order a
function of (seed, epoch)): Debian descriptions run from a few to 128+ tokens (median 75), and
measured on them at max_length 128 and batch 32, random batches are 38% padding, grouped ones 1.4%
(37% fewer token positions per epoch). `group_by_length=false`: plain seeded shuffling.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.errors import ConfigError, DataError
from attnlab.sampling import EpochSeededSampler, LengthGroupedSampler
from tasks.classify import corpus as corpus_lib
from tasks.classify.readers import Example
from tasks.classify.tokenization import PAD, build_tokenizer, encode_cached
from tasks.common.datamodule import SplitsDataModule, seeded_subset


class ClassifyDataModule(SplitsDataModule):
    # keyword-only; the defaults are conf/task/classify.yaml's, and what the run gives it (the
    # data folder, the cache, the seed) has none (tests/tasks/test_config_homes.py)
    def __init__(
        self,
        *,
        source: str = "debian",
        data_dir: str | None = None,
        debian_dir: str,
        min_examples: int = 500,
        fractions: Sequence[float] = corpus_lib.DEFAULT_FRACTIONS,
        header: str = "auto",
        tokenizer: str = "wordpiece",
        max_length: int = 64,
        max_vocab_size: int = 30000,
        min_frequency: int = 2,
        max_train_examples: int | None = 10000,
        max_eval_examples: int | None = 2000,
        subset_seed: int = 0,
        batch_size: int = 32,
        eval_batch_size: int = 64,
        group_by_length: bool = True,
        num_workers: int = 0,
        seed: int | None,
        cache_dir: str | None,
    ) -> None:
        super().__init__(collate, batch_size, eval_batch_size, num_workers, seed)
        self.save_hyperparameters()
        corpus_lib.check_source(source, data_dir)
        self.folder = debian_dir if source == "debian" else data_dir
        if int(max_length) < 1:
            raise ConfigError(f"task.data.max_length={max_length} must be >= 1 (tokens per text)")
        self.tokenizer = None
        self.corpus: corpus_lib.Corpus | None = None
        self.data: dict[str, list[dict]] = {}

    def prepare_data(self) -> None:
        corpus_lib.prepare(self.hparams.source, self.folder)

    def setup(self, stage: str | None = None) -> None:
        if self.data:
            return
        hp = self.hparams
        corpus = corpus_lib.load_corpus(hp.source, self.folder, hp.min_examples, hp.fractions, hp.header)
        limits = {"train": hp.max_train_examples, "val": hp.max_eval_examples, "test": hp.max_eval_examples}
        whole = {split: limits[split] is None or int(limits[split]) >= len(examples)
                 for split, examples in corpus.splits.items()}
        corpus.splits = {split: seeded_subset(examples, limits[split], hp.subset_seed)
                         for split, examples in corpus.splits.items()}
        train = corpus.splits["train"]
        self.tokenizer = build_tokenizer(
            hp.tokenizer, [e.text for e in train] + [e.text_b for e in train if e.text_b is not None],
            hp.max_vocab_size, hp.min_frequency,
        )
        self.corpus = corpus
        for split in corpus.splits:
            # only whole splits are cached: a subset is quick to tokenize and would only add files
            cache = hp.cache_dir if whole[split] else None
            self.data[split] = self._encode(corpus.splits[split], corpus.labels(split), cache)
        sizes = {split: len(rows) for split, rows in self.data.items()}
        print(f"[classify] {hp.source}: {len(corpus.label_names)} classes, examples per split {sizes}, "
              f"{hp.tokenizer} vocabulary of {self.tokenizer.get_vocab_size()}", flush=True)

    def _encode(self, examples: list[Example], labels: list[int], cache: str | None) -> list[dict]:
        max_length = int(self.hparams.max_length)
        ids = encode_cached(self.tokenizer, [e.text for e in examples], max_length, cache)
        rows = [{"input_ids": i, "label": label} for i, label in zip(ids, labels)]
        if self.corpus.pair:
            for row, ids_b in zip(rows, encode_cached(self.tokenizer, [e.text_b for e in examples], max_length, cache)):
                row["input_ids_b"] = ids_b
        return rows

    def model_kwargs(self) -> dict:
        if self.corpus is None:
            self.setup("fit")
        return {
            "vocab_size": self.tokenizer.get_vocab_size(),
            "pad_id": self.tokenizer.token_to_id(PAD),
            "num_classes": len(self.corpus.label_names),
            "label_names": list(self.corpus.label_names),
            "pair": self.corpus.pair,
            "max_length": int(self.hparams.max_length),
            # the most frequent training label: the majority-class baseline (val/baseline_acc)
            "majority_label": int(torch.bincount(torch.tensor(self.corpus.labels("train"))).argmax()),
        }

    # -- loaders -----------------------------------------------------------------------------

    def split_data(self, split: str) -> list[dict]:
        if split not in self.data:
            self.setup()
        if not self.data[split]:
            raise DataError(f"the {split} split of {self.hparams.source} data is empty")
        return self.data[split]

    def train_sampler(self, rows: list[dict]) -> EpochSeededSampler:
        if self.hparams.group_by_length:
            lengths = [max(len(r["input_ids"]), len(r.get("input_ids_b", ()))) for r in rows]
            return LengthGroupedSampler(lengths, self.batch_size, self.sampler_seed)
        return EpochSeededSampler(len(rows), self.sampler_seed)


def _pad(rows: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.full((len(rows), int(lengths.max())), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, torch.arange(ids.shape[1])[None, :] >= lengths[:, None], lengths


def collate(items: list[dict]) -> dict:
    batch = dict(zip(("input_ids", "padding_mask", "lengths"), _pad([it["input_ids"] for it in items])))
    if "input_ids_b" in items[0]:
        batch.update(zip(("input_ids_b", "padding_mask_b", "lengths_b"), _pad([it["input_ids_b"] for it in items])))
    batch["labels"] = torch.tensor([it["label"] for it in items], dtype=torch.long)
    return batch
