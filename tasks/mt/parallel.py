"""Reader for parallel text in the layout fairseq's preparation scripts write.

`examples/translation/prepare-iwslt14.sh` and `prepare-wmt14en2de.sh` leave, in one folder,

    train.de  train.en  valid.de  valid.en  test.de  test.en

one sentence per line, line i of `<split>.de` the translation of line i of `<split>.en`. Their
text is Moses-tokenized (IWSLT14 also lower-cased) and split into subword-nmt BPE units marked
with "@@ " ("wir@@ k@@ lich"); `remove_bpe="@@ "` undoes the BPE exactly as fairseq's
`--remove-bpe` does, before our own tokenizer sees the text. The Debian pairs
(`tasks.mt.debian_pairs`) are written in the same layout, so one reader serves both; the
direction is only a matter of which file is the source (`src=de tgt=en` or the reverse).

Empty lines: training drops such pairs (nothing to learn); valid and test keep them, so that
BLEU is over the whole standard set, and a warning says how many there are.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from attnlab.errors import DataError
from tasks.common.lines import read_aligned, require_files

# Our split names -> the file prefixes of the fairseq layout.
SPLIT_FILES = {"train": "train", "val": "valid", "test": "test"}


class TranslationPair(NamedTuple):
    source: str
    target: str
    # where it comes from: "<file>:<line>" (1-based)
    source_id: str = ""


def remove_bpe(line: str, marker: str | None) -> str:
    """fairseq's post-processing of BPE output: drop `marker` ("@@ ") and a trailing "@@"."""
    if not marker:
        return line
    return (line + " ").replace(marker, "").rstrip()


def split_files(data_dir: str | Path, split: str, src: str, tgt: str) -> tuple[Path, Path]:
    if split not in SPLIT_FILES:
        raise DataError(f"unknown split {split!r}; use one of {', '.join(SPLIT_FILES)}")
    if not src or not tgt or src == tgt:
        raise DataError(
            f"task.src={src!r} and task.tgt={tgt!r} must name two different languages, the "
            f"suffixes of the files (train.de / train.en: src=de tgt=en, or the reverse)"
        )
    name = SPLIT_FILES[split]
    return Path(data_dir) / f"{name}.{src}", Path(data_dir) / f"{name}.{tgt}"


def _missing_hint(src: str, tgt: str) -> str:
    return (
        f"Point task.data_dir to a folder with train/valid/test.{src} and .{tgt} (fairseq's "
        f"prepare-iwslt14.sh / prepare-wmt14en2de.sh layout), or use task.source=debian"
    )


def existing_split_files(data_dir: str | Path, split: str, src: str, tgt: str) -> tuple[Path, Path]:
    """`split_files`, with a DataError naming the missing ones."""
    paths = split_files(data_dir, split, src, tgt)
    require_files(paths, _missing_hint(src, tgt))
    return paths


def require_layout(data_dir: str | Path, src: str, tgt: str) -> None:
    """DataError naming every missing file of the three splits at once."""
    paths = [path for split in SPLIT_FILES for path in split_files(data_dir, split, src, tgt)]
    require_files(paths, _missing_hint(src, tgt))


def read_split(
    data_dir: str | Path,
    split: str,
    src: str,
    tgt: str,
    bpe_marker: str | None = None,
    drop_empty: bool | None = None,
) -> list[TranslationPair]:
    """The (source, target) pairs of one split. `drop_empty` defaults to True for train only."""
    src_path, tgt_path = split_files(data_dir, split, src, tgt)
    if drop_empty is None:
        drop_empty = split == "train"
    rows = read_aligned(src_path, tgt_path, drop_empty, _missing_hint(src, tgt))
    return [
        TranslationPair(remove_bpe(a, bpe_marker), remove_bpe(b, bpe_marker), f"{src_path.name}:{i}")
        for i, a, b in rows
    ]
