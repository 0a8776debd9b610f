"""`TranslationDataModule`: parallel text (Debian de-en by default, or fairseq-prepared files),
a joint BPE trained on the training split, length-grouped batches.

Batches are dicts:
    src_ids     (B, S) long  source tokens + </s>, padded with <pad>
    tgt_ids     (B, T) long  <s> + target tokens + </s>, padded; <s> starts decoding, </s> ends it
    sources, references      the raw texts (predictions.tsv; the references of BLEU)

Training pairs longer than max_source_length / max_target_length (special tokens included) are
dropped, as fairseq does, rather than truncated (a truncated target would teach the model to stop
mid-sentence); validation and test keep every pair, their sources truncated, and BLEU is scored
against the full reference text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import ConfigError, DataError
from tasks.common.batching import SPLITS, STAGE_SPLITS, EncodedSplitsDataModule, pad_rows
from tasks.mt import debian_pairs, parallel, tokenizer
from tasks.mt.parallel import TranslationPair

SOURCES = ("debian", "files")


class TranslationDataModule(EncodedSplitsDataModule):
    # keyword-only; the defaults are conf/task/mt.yaml's, and the data folders (the run's
    # paths.data_dir) have none (tests/tasks/test_config_homes.py)
    def __init__(
        self,
        *,
        source: str = "debian",
        src: str = "de",
        tgt: str = "en",
        data_dir: str | None = None,
        # source=debian: where the pairs are built, and the apt dirs of the two languages
        pairs_dir: str,
        english_dir: str,
        german_dir: str,
        english_files: Sequence[str] | None = None,
        german_files: Sequence[str] | None = None,
        split_fractions: Sequence[float] = debian_pairs.DEFAULT_FRACTIONS,
        copy_threshold: float = 0.9,
        max_words: int = 80,
        max_ratio: float = 2.0,
        sentences: bool = True,
        # source=files: the subword marker of fairseq-prepared text, removed on reading
        bpe_marker: str | None = "@@ ",
        tokenizer_dir: str,
        vocab_size: int = 8000,
        min_frequency: int = 2,
        max_source_length: int = 128,
        max_target_length: int = 128,
        max_train_examples: int | None = None,
        max_val_examples: int | None = None,
        max_test_examples: int | None = 500,
        batch_size: int = 64,
        eval_batch_size: int = 128,
        num_workers: int = 0,
        subset_seed: int = 0,
    ) -> None:
        super().__init__(
            collate, batch_size, eval_batch_size, num_workers,
            {"train": max_train_examples, "val": max_val_examples, "test": max_test_examples}, subset_seed,
        )
        if source not in SOURCES:
            raise ConfigError(f"task.source={source!r}; use one of {', '.join(SOURCES)}")
        if source == "files" and not data_dir:
            raise ConfigError(
                "task.source=files needs task.data_dir=<folder with train/valid/test.<src> and "
                ".<tgt>, as fairseq's prepare-iwslt14.sh writes them>"
            )
        if source == "debian" and {src, tgt} != set(debian_pairs.LANGUAGES):
            raise ConfigError(
                f"the Debian pairs are German-English: task.src={src!r} task.tgt={tgt!r} must be "
                f"de/en or en/de (other languages: task.source=files task.data_dir=...)"
            )
        if min(max_source_length, max_target_length) < 3:
            raise ConfigError("max_source_length and max_target_length must be >= 3 (<s> x </s>)")
        self.source, self.src, self.tgt = source, src, tgt
        # the Debian pairs are written in the fairseq layout: both sources read alike from here
        self.text_dir = Path(pairs_dir if source == "debian" else data_dir)
        self.bpe_marker = bpe_marker if source == "files" else None
        self.pairs_options = {
            "english_dir": english_dir,
            "german_dir": german_dir,
            "english_files": list(english_files) if english_files else None,
            "german_files": list(german_files) if german_files else None,
            "fractions": tuple(float(f) for f in split_fractions),
            "copy_threshold": float(copy_threshold),
            "max_words": int(max_words),
            "max_ratio": float(max_ratio),
            "sentences": bool(sentences),
        }
        self.tokenizer_dir = Path(tokenizer_dir)
        self.vocab_size, self.min_frequency = int(vocab_size), int(min_frequency)
        self.max_source_length, self.max_target_length = int(max_source_length), int(max_target_length)
        self.tokenizer = None
        self.tokenizer_file: Path | None = None

    # -- preparation -------------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self.source == "debian":
            debian_pairs.prepare_pairs(self.text_dir, **self.pairs_options)
        # Every split is read (missing, misaligned, non-UTF-8 or empty files fail) before the BPE
        # is trained and cached on the training split.
        parallel.require_layout(self.text_dir, self.src, self.tgt)
        pairs = {split: self.read_split(split) for split in SPLITS}
        for split in SPLITS:
            # a Debian split with no share of split_fractions is refused when it is set up
            if not pairs[split] and (split == "train" or self.source == "files"):
                raise self._empty(split)
        self._load_tokenizer(train=True, train_pairs=pairs["train"])

    def read_split(self, split: str) -> list[TranslationPair]:
        return parallel.read_split(self.text_dir, split, self.src, self.tgt, self.bpe_marker)

    def _empty(self, split: str) -> DataError:
        return DataError(
            f"the mt {split} split of {self.text_dir} is empty; with source=debian give it a "
            f"share in task.datamodule.split_fractions, with files check "
            f"{parallel.SPLIT_FILES[split]}.{self.src} / .{self.tgt}"
        )

    def _load_tokenizer(self, train: bool = False, train_pairs: list[TranslationPair] | None = None) -> None:
        if self.tokenizer is not None:
            return
        files = parallel.existing_split_files(self.text_dir, "train", self.src, self.tgt)
        key = tokenizer.cache_key(files, self.vocab_size, self.min_frequency, {"bpe_marker": self.bpe_marker})

        def training_texts() -> list[str]:  # both sides: one vocabulary for both languages
            pairs = self.read_split("train") if train_pairs is None else train_pairs
            return [p.source for p in pairs] + [p.target for p in pairs]

        self.tokenizer, self.tokenizer_file = tokenizer.load_or_train(
            self.tokenizer_dir, key, self.vocab_size, training_texts if train else None, self.min_frequency
        )

    def setup(self, stage: str | None = None) -> None:
        self._load_tokenizer(train=True)
        for split in STAGE_SPLITS.get(stage, SPLITS):
            if split in self.data:
                continue
            pairs = self.subset(self.read_split(split), split)
            if not pairs:
                raise self._empty(split)
            self.data[split] = self._encode(pairs, drop_long=split == "train")
            dropped = len(pairs) - len(self.data[split])
            note = f", {dropped} longer than the length limits dropped" if dropped else ""
            print(f"[mt] {split}: {len(self.data[split])} pairs {self.src}->{self.tgt} ({self.source}{note})",
                  flush=True)

    def _encode(self, pairs: list[TranslationPair], drop_long: bool) -> list[dict]:
        sources = tokenizer.encode(self.tokenizer, [p.source for p in pairs])
        targets = tokenizer.encode(self.tokenizer, [p.target for p in pairs])
        examples = []
        for pair, src, tgt in zip(pairs, sources, targets):
            src, tgt = src + [tokenizer.EOS_ID], [tokenizer.BOS_ID] + tgt + [tokenizer.EOS_ID]
            if len(src) > self.max_source_length or len(tgt) > self.max_target_length:
                if drop_long:
                    continue
                src = src[: self.max_source_length - 1] + [tokenizer.EOS_ID]
                tgt = tgt[: self.max_target_length - 1] + [tokenizer.EOS_ID]
            examples.append({"src_ids": src, "tgt_ids": tgt, "source": pair.source, "reference": pair.target})
        return examples

    # -- what the model needs ----------------------------------------------------------------

    def model_kwargs(self) -> dict:
        self._load_tokenizer(train=True)
        return {
            "bos_id": tokenizer.BOS_ID,
            "eos_id": tokenizer.EOS_ID,
            "unk_id": tokenizer.UNK_ID,
            # the module detokenizes its outputs for BLEU with the same vocabulary
            "tokenizer_file": str(self.tokenizer_file.resolve()),
            "net": {
                "vocab_size": self.tokenizer.get_vocab_size(),
                "pad_id": tokenizer.PAD_ID,
                "max_source_positions": self.max_source_length,
                "max_target_positions": self.max_target_length,
            },
        }

    def decode(self, rows: Sequence[Sequence[int]]) -> list[str]:
        self._load_tokenizer()
        return tokenizer.decode(self.tokenizer, rows)

    @staticmethod
    def sort_length(example: dict) -> int:  # batches of similar source *and* target lengths
        return max(len(example["src_ids"]), len(example["tgt_ids"]))


def collate(items: list[dict]) -> dict:
    return {
        "src_ids": pad_rows([it["src_ids"] for it in items], tokenizer.PAD_ID),
        "tgt_ids": pad_rows([it["tgt_ids"] for it in items], tokenizer.PAD_ID),
        "sources": [it["source"] for it in items],
        "references": [it["reference"] for it in items],
    }
