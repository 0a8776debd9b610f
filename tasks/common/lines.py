"""Text files as the readers take them: strictly UTF-8 (a file that is not says where), and
line-aligned pairs of files (Gigaword's article/title files, fairseq's train.de/train.en).

Only "\n" ends a line: str.splitlines() would also split on \x0b, \x1c, \u2028 ..., which occur
inside lines of real corpora (Gigaword) and would shift the alignment of parallel files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from attnlab.errors import DataError

log = logging.getLogger(__name__)


def not_utf8(path: str | Path, data: bytes, err: UnicodeDecodeError, offset: int = 0) -> DataError:
    """The error for a file whose bytes `data` (read from byte `offset` on) are not UTF-8."""
    return DataError(
        f"{path} is not UTF-8: byte {data[err.start]:#04x} at byte offset {offset + err.start}; "
        f"convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or give the UTF-8 file"
    )


def read_text(path: str | Path) -> str:
    """The text of a UTF-8 file, newlines kept; a byte that is not UTF-8 is a DataError."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise not_utf8(path, data, err) from None


def iter_lines(path: str | Path, keepends: bool = False) -> Iterator[str]:
    """The lines of a UTF-8 file one at a time (files of gigabytes), split on "\\n" only; a byte
    that is not UTF-8 is a DataError naming the file and its byte offset."""
    offset = 0
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise not_utf8(path, raw, err, offset) from None
            offset += len(raw)
            yield line if keepends else line.rstrip("\n")


def read_lines(path: str | Path) -> list[str]:
    """The stripped lines of a UTF-8 file, split on "\\n" only."""
    lines = read_text(path).split("\n")
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
