"""Plain-text corpora (`task.data.files=[...]`): paragraphs, split by a stable hash of their text."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import DataError, require_file
from tasks.common import debian
from tasks.common.lines import read_text


def check_files(files: Sequence[str | Path]) -> None:
    """Say early (in prepare_data) when a file of task.data.files is missing or a directory."""
    for name in files:
        require_file(name, "task.data.files", example="task.data.files=[corpus/a.txt]")


def read_plain_text(files: Sequence[str | Path]) -> list[str]:
    """Paragraphs (blocks separated by blank lines, lines joined) of UTF-8 text files; a file that
    is not UTF-8, or holds no text, is a DataError naming it."""
    check_files(files)
    paragraphs = []
    for name in files:
        found = [" ".join(block.split()) for block in re.split(r"\n\s*\n", read_text(name))]
        found = [paragraph for paragraph in found if paragraph]
        if not found:
            raise DataError(f"{name} holds no text; remove it from task.data.files or give it text")
        paragraphs.extend(found)
    return paragraphs


def split_plain_paragraphs(paragraphs: Sequence[str], fractions: Sequence[float]) -> dict[str, list[str]]:
    """Split plain-text paragraphs by a stable hash of their text (duplicates stay together)."""
    result: dict[str, list[str]] = {name: [] for name in debian.SPLITS}
    for paragraph in dict.fromkeys(paragraphs):  # distinct, in order
        key = hashlib.sha256(paragraph.encode("utf-8")).hexdigest()
        result[debian.split_of(key, fractions)].append(paragraph)
    return result
