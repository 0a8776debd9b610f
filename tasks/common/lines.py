"""Line-aligned text files (Gigaword's article/title files, fairseq's train.de/train.en)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import DataError

log = logging.getLogger(__name__)


def read_lines(path: str | Path) -> list[str]:
    """The stripped lines of a UTF-8 file, split on "\\n" only.

    str.splitlines() would also split on \\x0b, \\x1c, \\u2028 ..., which occur inside lines of
    real corpora (Gigaword) and would shift the alignment of parallel files.
    """
    with open(path, encoding="utf-8", newline="") as handle:
        text = handle.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    return [line.rstrip("\r").strip() for line in lines]


def require_files(paths: Sequence[Path], hint: str) -> None:
    """DataError naming the missing files, followed by `hint` (where the files should come from)."""
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise DataError(f"file(s) not found: {', '.join(missing)}. {hint}")


def read_aligned(first: Path, second: Path, drop_empty: bool, hint: str) -> list[tuple[int, str, str]]:
    """Line i of `first` with line i of `second`, as (i, line, line) with 1-based i.

    Missing files and different line counts are DataErrors naming the files. Pairs with an empty
    side are dropped (`drop_empty`: training has nothing to learn from them) or kept (evaluation
    scores the whole standard set); a warning says how many there are.
    """
    require_files((first, second), hint)
    left, right = read_lines(first), read_lines(second)
    if len(left) != len(right):
        raise DataError(
            f"{first} has {len(left)} lines but {second} has {len(right)}; line i of one must pair "
            f"with line i of the other. Re-create both files from the same source"
        )
    rows = [(i, a, b) for i, (a, b) in enumerate(zip(left, right), 1) if (a and b) or not drop_empty]
    empty = sum(not (a and b) for a, b in zip(left, right))
    if empty:
        action = "dropped" if drop_empty else "kept (scored against what they have)"
        log.warning("%s / %s: %d of %d pairs have an empty line; %s", first.name, second.name, empty, len(left), action)
    return rows
