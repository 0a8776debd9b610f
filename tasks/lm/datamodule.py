"""`LMDataModule`: running text as token streams, contiguous training blocks, sliding evaluation.

Sources (`task.source`): `debian` (default; WordPiece ids of the packaged BERT vocabulary, one
[SEP] after each package family's text), `wikitext` and `ptb` (word level, one `<eos>` per line,
files in `task.data_dir`), or plain-text files (`task.data.files`, word level by default). See
`tasks.lm.corpus` for the segment rules and `tasks.lm.windows` for the windows.

Batches are dicts of (B, L) tensors: `input_ids`, `target_ids` (the next tokens), `score_mask`
(the targets to score: all of a training block; the new tokens of an evaluation window) and
`padding_mask` (True = padding). The loss of a split is the mean over its scored targets, each
token of the split exactly once.

`task.eval_lengths` (`eval_lengths`): multiples m of block_size at which the test split is scored
again, in consecutive windows of m * block_size tokens (`length_loader(m)`; tasks.lm.lengths).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader

from attnlab.config_schema import Rule
from attnlab.errors import ConfigError, DataError
from tasks.common import bert_assets, debian
from tasks.common.cache import cache_path, load_arrays, save_arrays
from tasks.common.datamodule import SplitsDataModule
from tasks.common.files import sha256_of
from tasks.common.plain_text import check_files, read_plain_text, split_plain_paragraphs
from tasks.lm.corpus import (
    STANDARD_FILES,
    build_word_tokenizer,
    debian_segments,
    read_lines,
    split_segments,
    standard_files,
)
from tasks.lm.windows import EvaluationShards, TokenWindows, collate_windows

SOURCES = ("debian", *STANDARD_FILES)
VOCABS = ("word", "wordpiece")
_ENCODE_CHUNK = 10_000  # segments per encode_batch call: bounded memory on Wikitext-103


def _lengths_ok(value) -> bool:
    """task.eval_lengths: null, or a non-empty list of integers >= 1."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return len(value) > 0 and all(isinstance(m, int) and not isinstance(m, bool) and m >= 1
                                      for m in value)
    return value is None


class LMDataModule(SplitsDataModule):
    # task.eval_lengths: config_schema reports a bad value under the key the user typed
    option_rules: ClassVar[dict[str, Rule]] = {"eval_lengths": Rule(
        _lengths_ok, "null or a non-empty list of integers >= 1 (multiples of task.data.block_size)",
        "[1,2,4,8]")}

    # keyword-only; the defaults are conf/task/lm.yaml's, and what the run gives it (the data
    # folder, the cache, the seed) or the YAML alone decides has none (test_config_homes.py)
    def __init__(
        self,
        *,
        source: str = "debian",
        data_dir: str | None = None,
        debian_dir: str,
        files: Sequence[str] | None = None,
        fractions: Sequence[float] = debian.DEFAULT_FRACTIONS,
        vocab: str | None = None,
        min_count: int = 1,
        block_size: int = 128,
        eval_stride: int | None,
        eval_lengths: Sequence[int] | None = None,
        batch_size: int = 16,
        eval_batch_size: int | None,
        num_workers: int = 0,
        seed: int,
        cache_dir: str | None,
    ) -> None:
        # the collate function pads with the vocabulary's [PAD], known below
        super().__init__(None, batch_size, eval_batch_size, num_workers, seed)
        self.save_hyperparameters()
        self.files = list(files) if files else None
        if source not in SOURCES:
            raise ConfigError(f"task.source={source!r}; use one of {', '.join(SOURCES)}")
        if self.files and source != "debian":
            raise ConfigError(f"task.source={source} and task.data.files are both set; give one of them")
        if source in STANDARD_FILES and not data_dir:
            names = ", ".join(STANDARD_FILES[source].values())
            raise ConfigError(f"task.source={source} needs task.data_dir=<folder with {names}>")
        # the corpora's own units: word level for the standard corpora and plain text (their
        # papers report word-level perplexity), WordPiece for the Debian default
        self.vocab_kind = vocab or ("wordpiece" if source == "debian" and not self.files else "word")
        if self.vocab_kind not in VOCABS:
            raise ConfigError(f"task.data.vocab={vocab!r}; use word, wordpiece or null (the source's own)")
        if int(min_count) < 1:
            raise ConfigError(f"task.data.min_count={min_count} must be >= 1")
        self.source = "files" if self.files else source
        self.block_size = int(block_size)
        self.eval_stride = int(eval_stride) if eval_stride else self.block_size
        if self.block_size < 2 or not 1 <= self.eval_stride <= self.block_size:
            raise ConfigError(
                f"task.data.block_size={block_size} must be >= 2 and task.eval_stride={eval_stride} "
                f"in [1, block_size] (new tokens scored per evaluation window; null: block_size)"
            )
        if not _lengths_ok(eval_lengths):
            rule = self.option_rules["eval_lengths"]
            given = (f"[{','.join(str(m) for m in eval_lengths)}]" if isinstance(eval_lengths, Sequence)
                     and not isinstance(eval_lengths, str) else eval_lengths)
            raise ConfigError(f"task.eval_lengths={given}: expected {rule.allowed}, e.g. "
                              f"task.eval_lengths={rule.example}")
        # each multiple once, shortest first (the order of the metrics, the plot's legend)
        self.eval_lengths = sorted(set(eval_lengths)) if eval_lengths else []
        self.fractions = tuple(float(f) for f in fractions)
        self.debian_dir = Path(debian_dir)
        self.data_dir = Path(data_dir) if data_dir else None
        self.word_level = self.vocab_kind == "word"
        # (pad, end-of-segment, unknown): [PAD]/[SEP]/[UNK] of BERT's vocabulary, or ours
        self.pad_id, self.eos_id, self.unk_id = (
            (0, 1, 2) if self.word_level  # the positions of corpus.WORD_SPECIALS
            else (bert_assets.PAD_ID, bert_assets.SEP_ID, bert_assets.UNK_ID)
        )
        self.collate_fn = collate_windows(self.pad_id)
        self.tokenizer = None  # HF `tokenizers`: WordLevel built on train, or the packaged WordPiece
        self.streams: dict[str, np.ndarray] = {}
        self.datasets: dict[str, TokenWindows] = {}

    # -- preparation -------------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self.source == "files":
            check_files(self.files)
        elif self.source == "debian":
            debian.prepare(self.debian_dir)
        else:
            standard_files(self.source, self.data_dir)

    def _segments(self) -> dict[str, Iterable[str]]:
        """split -> its segments (lazy for the standard corpora: Wikitext-103 is 540 MB)."""
        if self.source == "files":
            return split_plain_paragraphs(read_plain_text(self.files), self.fractions)
        if self.source == "debian":
            rows = debian.load_rows(self.debian_dir)
            for row in rows:  # the split of the requested fractions (records.jsonl holds the default)
                row["split"] = debian.split_of(row["family"], self.fractions)
            return debian_segments(rows)
        return {split: _Lines(path) for split, path in standard_files(self.source, self.data_dir).items()}

    def _source_files(self) -> list[Path]:
        if self.source == "files":
            return [Path(f) for f in self.files]
        if self.source == "debian":
            return [self.debian_dir / debian.MANIFEST_FILE]  # it holds the sources' sha256
        return list(standard_files(self.source, self.data_dir).values())

    def _cache_path(self) -> Path | None:
        if not self.hparams.cache_dir:
            return None
        key_parts = {
            "version": 1, "source": self.source, "vocab": self.vocab_kind,
            "inputs": [sha256_of(path) for path in self._source_files()],
            "fractions": self.fractions, "min_count": int(self.hparams.min_count),
        }
        if self.vocab_kind == "wordpiece":
            key_parts["tokenizer"] = sha256_of(bert_assets.bert_dir() / "tokenizer.json")
        return cache_path(self.hparams.cache_dir, "lm", key_parts)

    def _encode(self, segments: Iterable[str]) -> np.ndarray:
        """Token ids of the segments, each followed by the end-of-segment id."""
        ids = array("i")
        for chunk in _chunks(segments, _ENCODE_CHUNK):
            for encoding in self.tokenizer.encode_batch(chunk, add_special_tokens=False):
                ids.extend(encoding.ids)
                ids.append(self.eos_id)
        return np.frombuffer(ids, dtype=np.int32).copy()

    def _load_streams(self) -> dict[str, np.ndarray]:
        """Token streams per split; sets self.tokenizer (the word-level one is built on train)."""
        from tokenizers import Tokenizer

        cache = self._cache_path()
        arrays = load_arrays(cache)
        if arrays is not None:
            if self.word_level:
                self.tokenizer = Tokenizer.from_str(str(arrays["tokenizer"]))
            return {split: arrays[split] for split in debian.SPLITS}
        segments = self._segments()
        if self.word_level:
            print(f"[lm] building the word vocabulary of the {self.source} training split", flush=True)
            self.tokenizer = build_word_tokenizer(segments["train"], int(self.hparams.min_count))
        print(f"[lm] tokenizing {self.source} ({self.vocab_kind})", flush=True)
        streams = {split: self._encode(segments[split]) for split in debian.SPLITS}
        if cache is not None:
            arrays = dict(streams)
            if self.word_level:
                arrays["tokenizer"] = np.array(self.tokenizer.to_str())
            save_arrays(cache, arrays)
            print(f"[lm] cached the token streams in {cache}", flush=True)
        return streams

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        if not self.word_level:
            self.tokenizer = bert_assets.load_tokenizer(None)
        self.streams = self._load_streams()
        for split, stream in self.streams.items():
            if len(stream) < 2:
                raise DataError(
                    f"the {split} split of {self.files or self.data_dir or self.debian_dir} has "
                    f"{len(stream)} tokens; give more text or change task.data.fractions"
                )
            stride = self.block_size if split == "train" else self.eval_stride
            self.datasets[split] = TokenWindows(stream, self.eos_id, self.block_size, stride)
        summary = ", ".join(f"{split} {len(s):,} tokens" for split, s in self.streams.items())
        print(f"[lm] {self.source}, {self.vocab_kind} vocabulary of {self.tokenizer.get_vocab_size():,}: {summary}; "
              f"blocks of {self.block_size}, evaluation stride {self.eval_stride}", flush=True)

    # -- what the model needs ------------------------------------------------------------------

    def model_kwargs(self) -> dict:
        if not self.datasets:
            self.setup("fit")
        return {
            "vocab_size": self.tokenizer.get_vocab_size(),
            "pad_id": self.pad_id,
            "eos_id": self.eos_id,
            "unk_id": self.unk_id,
            # perplexity per token is per word only with a word-level vocabulary
            "word_level": self.word_level,
            "block_size": self.block_size,
            # token ids by decreasing training frequency (ties: by id): the adaptive softmax's bands
            "token_order": np.argsort(-np.bincount(self.streams["train"], minlength=self.tokenizer.get_vocab_size()),
                                      kind="stable").tolist(),
        }

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids (generated samples), one line per segment."""
        segments = split_segments(ids, self.eos_id, self.pad_id)
        return "\n".join(self.tokenizer.decode(segment) for segment in segments)

    def prompts(self, split: str = "test", count: int = 4, length: int = 16) -> torch.Tensor:
        """(n, 1 + length) model inputs to continue: end-of-segment, then the first `length` tokens
        of up to `count` segments of the split that are that long, evenly spaced over the split."""
        stream = torch.from_numpy(self.streams[split]).long()
        starts = torch.cat([torch.zeros(1, dtype=torch.long), (stream == self.eos_id).nonzero().squeeze(1) + 1])
        ends = torch.cat([starts[1:] - 1, torch.tensor([len(stream)])])
        starts = starts[ends - starts >= length]  # segments with `length` tokens before their end
        if len(starts) == 0:
            return torch.empty(0, length + 1, dtype=torch.long)
        chosen = starts[torch.linspace(0, len(starts) - 1, min(count, len(starts))).round().long()]
        eos = torch.full((len(chosen), 1), self.eos_id, dtype=torch.long)
        return torch.cat([eos, torch.stack([stream[s : s + length] for s in chosen.tolist()])], dim=1)

    def token_counts(self) -> dict[str, int]:
        """Tokens per split, end-of-segment tokens included (what perplexity averages over)."""
        return {split: len(stream) for split, stream in self.streams.items()}

    # -- loaders -------------------------------------------------------------------------------

    def split_data(self, split: str) -> TokenWindows:
        if not self.datasets:
            self.setup()
        return self.datasets[split]

    def eval_sampler(self, windows: TokenWindows) -> EvaluationShards | None:
        if self.trainer is not None and self.trainer.world_size > 1:  # every window once
            return EvaluationShards(windows, self.trainer.world_size, self.trainer.global_rank)
        return None

    def length_loader(self, multiple: int) -> DataLoader:
        """The test split in consecutive windows of `multiple` * block_size tokens, every token
        scored once (`windows` with stride = window: the last window ends at the end of the text
        and reaches back a whole window, its tokens scored by the window before being context
        only), sharded over processes as val/test are (`eval_sampler`). Batches of
        eval_batch_size // multiple windows (at least 1): the tokens of a batch, hence the
        memory, stay those of a 1x batch."""
        if not self.datasets:
            self.setup()
        windows = TokenWindows(self.streams["test"], self.eos_id, multiple * self.block_size)
        return DataLoader(windows, batch_size=max(1, self.eval_batch_size // multiple),
                          sampler=self.eval_sampler(windows), collate_fn=self.collate_fn,
                          num_workers=self.num_workers)


class _Lines:
    """The lines of a file, re-read on each iteration (the vocabulary pass, then encoding)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __iter__(self) -> Iterator[str]:
        return read_lines(self.path)


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
