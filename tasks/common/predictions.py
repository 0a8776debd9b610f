"""`predictions.tsv`: one row per test example (source, reference, model output)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path


def write_predictions(
    path: str | Path,
    rows: Iterable[Sequence[str]],
    header: Sequence[str] = ("source", "reference", "hypothesis"),
) -> int:
    """Write a tab-separated file with a header; returns the number of rows.

    Whitespace inside a field (tabs, newlines) becomes single spaces, so that every example is
    one line that `cut -f` and spreadsheets read back; quoting is csv's minimal one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out, delimiter="\t", quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        writer.writerow(list(header))
        for row in rows:
            if len(row) != len(header):
                raise ValueError(f"a predictions row has {len(row)} fields, the header {len(header)}")
            writer.writerow([" ".join(str(text).split()) for text in row])
            count += 1
    return count


def run_file(trainer, name: str) -> Path:
    """`name` in the run directory; one file per process when several run (`name.rank<r>.ext`)."""
    if trainer.world_size > 1:
        name = f"{Path(name).stem}.rank{trainer.global_rank}{Path(name).suffix}"
    return Path(trainer.default_root_dir) / name
