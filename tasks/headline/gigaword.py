"""Reader for the Gigaword headline files of Rush et al. (2015).

Layout: `<dir>/{train,valid,test}.article.txt` and `<dir>/{train,valid,test}.title.txt`, one
example per line, line `i` of the article file paired with line `i` of the title file. Text is
lowercased and tokenized, digits are replaced by `#`, rare words by `UNK`.

Empty lines exist in the public files. Training drops such pairs (nothing to learn from);
validation and test keep them, so that the scores are over the whole standard set, and a warning
says how many there are.
"""

from __future__ import annotations

import re
from pathlib import Path

from attnlab.errors import DataError, require_dir
from tasks.common.lines import read_aligned
from tasks.headline.example import HeadlinePair

SPLITS = ("train", "valid", "test")
# The files' unknown-word token, and the one of the WordPiece vocabulary the model uses.
GIGAWORD_UNK = "UNK"
WORDPIECE_UNK = "[UNK]"


def split_files(data_dir: str | Path, split: str) -> tuple[Path, Path]:
    if split not in SPLITS:
        raise DataError(f"unknown Gigaword split {split!r}; use one of {', '.join(SPLITS)}")
    data_dir = Path(data_dir)
    return data_dir / f"{split}.article.txt", data_dir / f"{split}.title.txt"


def read_split(
    data_dir: str | Path, split: str, drop_empty: bool | None = None
) -> list[HeadlinePair]:
    """Read one split. `drop_empty` defaults to True for train and False for valid/test."""
    require_dir(data_dir, "task.gigaword_dir", example="task.gigaword_dir=/data/sumdata/train")
    article_path, title_path = split_files(data_dir, split)
    if drop_empty is None:
        drop_empty = split == "train"
    hint = ("Point task.datamodule.gigaword_dir to the directory holding {train,valid,test}.article.txt "
            "/ .title.txt (Rush et al. 2015 format), or use task.datamodule.source=debian")
    rows = read_aligned(article_path, title_path, drop_empty, hint)
    if not rows:  # prepare_data reads every split: said before any tokenizing or training
        raise DataError(f"{article_path} and {title_path} hold no article/title pairs. {hint}")
    return [HeadlinePair(article=a, headline=t, source_id=f"{split}:{i}") for i, a, t in rows]


def read_gigaword(data_dir: str | Path) -> dict[str, list[HeadlinePair]]:
    return {split: read_split(data_dir, split) for split in SPLITS}


_UNK_WORD = re.compile(rf"(?<!\S){GIGAWORD_UNK}(?!\S)")


def to_model_text(text: str) -> str:
    """Map the files' `UNK` words to the tokenizer's `[UNK]`, which WordPiece keeps as one token
    (lowercased, `UNK` would become the ordinary word `unk`)."""
    return _UNK_WORD.sub(WORDPIECE_UNK, text)
