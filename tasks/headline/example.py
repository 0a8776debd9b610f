"""`HeadlinePair`: one article -> headline example, and its jsonl form shared by the data sources."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class HeadlinePair:
    article: str
    headline: str
    # Where the pair comes from (a Debian package name, or "<split>:<line>" for Gigaword).
    source_id: str = ""


def write_jsonl(path: Path, pairs: Iterable[HeadlinePair]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for pair in pairs:
            out.write(json.dumps(asdict(pair), ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> list[HeadlinePair]:
    with open(path, encoding="utf-8") as lines:
        return [HeadlinePair(**json.loads(line)) for line in lines if line.strip()]
