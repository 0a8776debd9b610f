"""Reader for the Gigaword headline files of Rush et al. (2015).

Layout: `<dir>/{train,valid,test}.article.txt` and `<dir>/{train,valid,test}.title.txt`, one
example per line, line `i` of the article file paired with line `i` of the title file. Text is
lowercased and tokenized, digits are replaced by `#`, rare words by `UNK`.

Empty lines exist in the public files. Training drops such pairs (nothing to learn from);
validation and test keep them, so that the scores are over the whole standard set, and a warning
says how many there are.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from attnlab.errors import DataError, require_dir
from tasks.headline.example import HeadlinePair

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
# The files' unknown-word token, and the one of the WordPiece vocabulary the model uses.
GIGAWORD_UNK = "UNK"
WORDPIECE_UNK = "[UNK]"


def split_files(data_dir: str | Path, split: str) -> tuple[Path, Path]:
    if split not in SPLITS:
        raise DataError(f"unknown Gigaword split {split!r}; use one of {', '.join(SPLITS)}")
    data_dir = Path(data_dir)
    return data_dir / f"{split}.article.txt", data_dir / f"{split}.title.txt"


def _read_lines(path: Path) -> list[str]:
    # Split on "\n" only: str.splitlines() would also split on \x0b, \x1c, \u2028 ... that occur
    # inside Gigaword lines and would shift the article/title alignment.
    with open(path, encoding="utf-8", newline="") as handle:
        text = handle.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    return [line.rstrip("\r").strip() for line in lines]


def read_split(
    data_dir: str | Path, split: str, drop_empty: bool | None = None
) -> list[HeadlinePair]:
    """Read one split. `drop_empty` defaults to True for train and False for valid/test."""
    require_dir(data_dir, "task.gigaword_dir", example="task.gigaword_dir=/data/sumdata/train")
    article_path, title_path = split_files(data_dir, split)
    missing = [str(p) for p in (article_path, title_path) if not p.is_file()]
    if missing:
        raise DataError(
            f"Gigaword file(s) not found: {', '.join(missing)}. Point task.datamodule.gigaword_dir "
            f"to the directory holding {{train,valid,test}}.article.txt / .title.txt "
            f"(Rush et al. 2015 format), or use task.datamodule.source=debian"
        )
    articles = _read_lines(article_path)
    titles = _read_lines(title_path)
    if len(articles) != len(titles):
        raise DataError(
            f"Gigaword {split} files disagree: {article_path} has {len(articles)} lines but "
            f"{title_path} has {len(titles)}; line i of one must pair with line i of the other. "
            f"Re-extract both files from the same archive"
        )
    if drop_empty is None:
        drop_empty = split == "train"
    pairs, empty = [], 0
    for index, (article, title) in enumerate(zip(articles, titles)):
        if not article or not title:
            empty += 1
            if drop_empty:
                continue
        pairs.append(
            HeadlinePair(article=article, headline=title, source_id=f"{split}:{index + 1}")
        )
    if empty:
        action = "dropped" if drop_empty else "kept (scored against what they have)"
        log.warning(
            "Gigaword %s: %d of %d examples have an empty article or title line; %s",
            split,
            empty,
            len(articles),
            action,
        )
    return pairs


def read_gigaword(data_dir: str | Path) -> dict[str, list[HeadlinePair]]:
    return {split: read_split(data_dir, split) for split in SPLITS}


_UNK_WORD = re.compile(rf"(?<!\S){GIGAWORD_UNK}(?!\S)")


def to_model_text(text: str) -> str:
    """Map the files' `UNK` words to the tokenizer's `[UNK]`, which WordPiece keeps as one token
    (lowercased, `UNK` would become the ordinary word `unk`)."""
    return _UNK_WORD.sub(WORDPIECE_UNK, text)
