"""The joint source+target BPE vocabulary of the mt task, trained on the training split.

A byte-level BPE (HF `tokenizers`, GPT-2's scheme): every string has an encoding (no unknown
characters, whatever the language pair), and decoding gives the text back exactly up to runs of
whitespace, which is what BLEU needs (sacrebleu tokenizes the detokenized output itself). Both
languages share the vocabulary, so a model can tie its embeddings.

It is trained once per training data and size, never downloaded, and cached as

    <cache_dir>/bpe<vocab_size>-<key>.json

where `key` hashes the sha256 of the two training files, the vocabulary size, the minimum pair
frequency and the text preparation (BPE marker removal): other data or settings, another file.
Special tokens have fixed ids: <pad>=0, <s>=1 (begins a target), </s>=2 (ends both sides), <unk>=3.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from attnlab.errors import ConfigError, DataError
from attnlab.files import atomic_write
from tasks.common.files import sha256_of

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
# Bump when the tokenizer's pipeline changes: cached tokenizers are then retrained.
FORMAT_VERSION = 1


def cache_key(train_files: Sequence[Path], vocab_size: int, min_frequency: int, preparation: dict) -> str:
    """A short hash of what the tokenizer is trained on and how; the same for both directions."""
    spec = {
        "format_version": FORMAT_VERSION,
        "data": sorted(sha256_of(Path(f)) for f in train_files),
        "vocab_size": int(vocab_size),
        "min_frequency": int(min_frequency),
        "preparation": preparation,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE of at most `vocab_size` entries (special tokens and the 256 bytes included)."""
    minimum = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if int(vocab_size) <= minimum:
        raise ConfigError(
            f"task.vocab_size={vocab_size} is too small: the byte alphabet and the special tokens "
            f"take {minimum}; use e.g. 8000 (the CPU default) or 10000 (fairseq's IWSLT14 recipe)"
        )
    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space: a word is encoded alike at the start of a line and inside it
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=int(min_frequency),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def check_special_ids(tokenizer: Tokenizer, path: Path) -> None:
    ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise DataError(f"{path} is not a tokenizer of the mt task (special ids {ids}); delete it to retrain")


def load_or_train(
    cache_dir: str | Path,
    key: str,
    vocab_size: int,
    texts: Callable[[], Iterable[str]] | None = None,
    min_frequency: int = 2,
) -> tuple[Tokenizer, Path]:
    """The cached tokenizer of `key`, trained on `texts()` first if it is not there yet.

    `texts=None` only loads (DataError when missing). Parallel jobs of a sweep wait on a lock
    while one of them trains.
    """
    cache_dir = Path(cache_dir)
    path = cache_dir / f"bpe{int(vocab_size)}-{key}.json"
    if not path.is_file():
        if texts is None:
            raise DataError(f"the mt tokenizer {path} does not exist; run the task's prepare_data first")
        cache_dir.mkdir(parents=True, exist_ok=True)
        with open(cache_dir / ".train.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.is_file():
                print(f"[mt] training a joint BPE of {vocab_size} entries into {path}", flush=True)
                tokenizer = train_bpe(texts(), vocab_size, min_frequency)
                with atomic_write(path, "w") as f:  # what tokenizer.save(path) writes
                    f.write(tokenizer.to_str(pretty=True))
    return load(path), path


def load(path: str | Path) -> Tokenizer:
    """A tokenizer file written by `load_or_train` (the model reads its own vocabulary back)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"the mt tokenizer {path} does not exist; run the task's prepare_data first")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on a corrupt file
        raise DataError(f"cannot read the mt tokenizer {path} ({err}); delete it to retrain") from err
    check_special_ids(tokenizer, path)
    return tokenizer


def encode(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (no special tokens)."""
    return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def decode(tokenizer: Tokenizer, rows: Sequence[Sequence[int]]) -> list[str]:
    """Detokenized text of each id row, special tokens skipped and whitespace normalized (the text
    BLEU and predictions.tsv get). Generated rows: cut at the first </s> before (the decoding
    code's `strip_generated`)."""
    texts = tokenizer.decode_batch([[int(i) for i in row] for row in rows], skip_special_tokens=True)
    return [" ".join(text.split()) for text in texts]
