"""Token ids for classification: the packaged BERT WordPiece (default) or words counted on train.

    tokenizer=wordpiece   bert-base-uncased's 30,522 word pieces (tasks.common.bert_assets)
    tokenizer=word        lower-cased words and punctuation (BERT's pre-tokenizer) seen at least
                          `min_frequency` times in the training texts, at most `vocab_size` of them
                          (Lin et al. 2017 used words); [PAD]=0, [UNK]=1

Sequences carry no [CLS]/[SEP]: the classifier pools over the tokens themselves. Each text is
truncated to `max_length` tokens; [PAD] has id 0 in both vocabularies.

Tokenizing the ~55k Debian descriptions takes 20-60 s on the shared 2 cores, so `encode_cached`
keeps the ids in a cache folder, keyed by the tokenizer, max_length and the texts themselves.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnlab.errors import ConfigError
from attnlab.files import atomic_write
from tasks.common import bert_assets

TOKENIZERS = ("wordpiece", "word")
PAD, UNK = "[PAD]", "[UNK]"


def build_tokenizer(kind: str, train_texts: Sequence[str], vocab_size: int = 30000, min_frequency: int = 2):
    """An HF `tokenizers.Tokenizer` of the given kind (the word vocabulary is fitted on train_texts)."""
    if kind == "wordpiece":
        return bert_assets.load_tokenizer(None)  # truncated in `encode`, after dropping special tokens
    if kind != "word":
        raise ConfigError(f"task.data.tokenizer={kind!r}; use one of {', '.join(TOKENIZERS)}")
    if int(vocab_size) < 3 or int(min_frequency) < 1:
        raise ConfigError(f"task.data.vocab_size={vocab_size} must be >= 3 and min_frequency={min_frequency} >= 1")
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.trainers import WordLevelTrainer

    tokenizer = Tokenizer(WordLevel(unk_token=UNK))
    # the same normalization and word splitting as the uncased WordPiece, so the two compare
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = WordLevelTrainer(vocab_size=int(vocab_size), min_frequency=int(min_frequency), special_tokens=[PAD, UNK])
    tokenizer.train_from_iterator(train_texts, trainer=trainer)
    return tokenizer


def encode(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each text, at most max_length of them; never empty (an empty text gives [UNK])."""
    unk = tokenizer.token_to_id(UNK)
    return [e.ids[:max_length] or [unk] for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def encode_cached(tokenizer, texts: Sequence[str], max_length: int, cache_dir: str | Path | None) -> list[list[int]]:
    """`encode`, read from / written to cache_dir (None: no cache)."""
    if cache_dir is None:
        return encode(tokenizer, texts, max_length)
    h = hashlib.sha256(f"{tokenizer.to_str()}\n{int(max_length)}\n".encode())
    for text in texts:
        h.update(text.encode("utf-8") + b"\0")
    path = Path(cache_dir) / f"ids-{h.hexdigest()[:20]}.npz"
    if path.is_file():
        with np.load(path) as arrays:
            flat, offsets = arrays["ids"].tolist(), arrays["offsets"].tolist()
        return [flat[a:b] for a, b in itertools.pairwise(offsets)]
    ids = encode(tokenizer, texts, max_length)
    offsets = np.cumsum([0] + [len(row) for row in ids])
    with atomic_write(path) as f:  # parallel sweep jobs never read a half-written cache
        np.savez(f, ids=np.fromiter((i for row in ids for i in row), dtype=np.int32, count=int(offsets[-1])),
                 offsets=offsets)
    return ids
