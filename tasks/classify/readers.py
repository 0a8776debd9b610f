"""Readers of the standard classification formats: `label<TAB>text` (TSV/CSV) and SNLI's jsonl.

    task.source=tsv  task.data_dir=<dir>   train.tsv, dev.tsv (or val/valid/validation), test.tsv;
                                           .csv files (comma-separated, quoted) are read the same way
    task.source=snli task.data_dir=<dir>   snli_1.0_train.jsonl, snli_1.0_dev.jsonl, snli_1.0_test.jsonl
                                           (MultiNLI's *_dev_matched.jsonl is accepted as dev)

TSV/CSV: without a header, the first column is the label and the other columns are the text (AG
News' title, description). With a header, the columns are found by name (SST-2's `sentence<TAB>label`).
`header=auto` takes the first row for a header when one of its cells is a known column name.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import ConfigError, DataError
from tasks.common.lines import iter_lines, read_text

# File-name stems accepted for each split (the split's own name, or a suffix after "_": snli_1.0_dev).
SPLIT_STEMS = {"train": ("train",), "val": ("dev", "val", "valid", "validation", "dev_matched"), "test": ("test",)}
TSV_SUFFIXES = (".tsv", ".csv")
LABEL_COLUMNS = ("label", "labels", "class", "category", "sentiment", "gold_label", "target")
TEXT_COLUMNS = ("text", "sentence", "review", "content", "title", "description", "question")
HEADER_CHOICES = ("auto", "true", "false")
SNLI_LABELS = ("entailment", "neutral", "contradiction")


@dataclass(frozen=True)
class Example:
    label: str
    text: str
    text_b: str | None = None  # the hypothesis of a sentence pair (SNLI); None for single texts


def find_split_files(data_dir: str | Path, suffixes: tuple[str, ...]) -> dict[str, Path]:
    """train / val / test files of data_dir, by name (see SPLIT_STEMS); one of each, or a DataError."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"task.data_dir={data_dir} is not a directory; point it at the folder of your data files")
    found: dict[str, Path] = {}
    for split, stems in SPLIT_STEMS.items():
        matches = sorted(
            path for path in data_dir.iterdir()
            if path.suffix in suffixes and any(path.stem == s or path.stem.endswith("_" + s) for s in stems)
        )
        if not matches:
            names = ", ".join(f"{s}{x}" for s in stems[:2] for x in suffixes)
            raise DataError(f"no {split} file in {data_dir}: expected one named like {names} (or *_{stems[0]}{suffixes[0]})")
        if len(matches) > 1:
            raise DataError(f"several {split} files in {data_dir}: {[p.name for p in matches]}; keep one")
        found[split] = matches[0]
    return found


# --------------------------------------------------------------------------------------------
# label<TAB>text
# --------------------------------------------------------------------------------------------


def _is_header(row: list[str]) -> bool:
    # any known column name, so that an unlabelled file (GLUE's "index<TAB>sentence" test.tsv)
    # is recognized, and then refused for lacking labels rather than read as data
    return any(cell.strip().lower() in (*LABEL_COLUMNS, *TEXT_COLUMNS, "index", "id") for cell in row)


def _columns(header: list[str], path: Path) -> tuple[int, list[int]]:
    names = [cell.strip().lower() for cell in header]
    labels = [i for i, name in enumerate(names) if name in LABEL_COLUMNS]
    if not labels:
        raise DataError(f"{path}: the header {header} names no label column; name it one of {LABEL_COLUMNS}, "
                        f"or set task.data.header=false if the first row is data")
    texts = [i for i, name in enumerate(names) if name in TEXT_COLUMNS] or [
        i for i in range(len(names)) if i != labels[0]
    ]
    return labels[0], texts


def read_tsv(path: str | Path, header: str = "auto") -> list[Example]:
    """One Example per row of a `label<TAB>text` file (.tsv) or `label,text` file (.csv)."""
    path = Path(path)
    if str(header).lower() not in HEADER_CHOICES:
        raise ConfigError(f"task.data.header={header!r}; use one of {', '.join(HEADER_CHOICES)}")
    header = str(header).lower()
    is_csv = path.suffix == ".csv"
    # TSV files (SST, GLUE) quote nothing: a quote character is part of the text
    lines = io.StringIO(read_text(path), newline="")  # line ends as csv wants them: untranslated
    rows = list(csv.reader(lines, delimiter="," if is_csv else "\t",
                           quoting=csv.QUOTE_MINIMAL if is_csv else csv.QUOTE_NONE))
    first = 0
    label_col, text_cols = 0, None  # no header: label first, the rest is text
    if rows and (header == "true" or (header == "auto" and _is_header(rows[0]))):
        label_col, text_cols = _columns(rows[0], path)
        first = 1
    examples = []
    for number, row in enumerate(rows[first:], first + 1):
        if not any(cell.strip() for cell in row):
            continue  # blank line
        cells = text_cols if text_cols is not None else range(1, len(row))
        if len(row) < 2 or max(cells, default=0) >= len(row) or label_col >= len(row):
            raise DataError(f"{path}:{number} has {len(row)} column(s); expected label{'<TAB>' if not is_csv else ','}text")
        label = row[label_col].strip()
        # Zhang et al.'s CSVs (Yelp, AG News) write line breaks inside a text as a literal "\n"
        text = " ".join(row[i].replace("\\n", " ").strip() for i in cells).strip()
        if not label or not text:
            raise DataError(f"{path}:{number} has an empty {'label' if not label else 'text'}; fix or remove the row")
        examples.append(Example(label, " ".join(text.split())))
    if not examples:
        raise DataError(f"{path} holds no examples")
    return examples


# --------------------------------------------------------------------------------------------
# SNLI jsonl
# --------------------------------------------------------------------------------------------


def read_snli(path: str | Path) -> list[Example]:
    """Premise/hypothesis pairs of an SNLI (or MultiNLI) jsonl file; gold_label "-" (no consensus) is dropped."""
    path = Path(path)
    examples = []
    for number, line in enumerate(iter_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            label, premise, hypothesis = row["gold_label"], row["sentence1"], row["sentence2"]
        except ValueError:
            raise DataError(f"{path}:{number} is not valid JSON; is this SNLI's .jsonl (not the .txt)?")
        except (KeyError, TypeError):
            raise DataError(f"{path}:{number} lacks gold_label, sentence1 or sentence2 (SNLI jsonl fields)")
        if label == "-":
            continue
        if label not in SNLI_LABELS:
            raise DataError(f"{path}:{number} has gold_label {label!r}; expected one of {SNLI_LABELS} or '-'")
        examples.append(Example(label, " ".join(premise.split()), " ".join(hypothesis.split())))
    if not examples:
        raise DataError(f"{path} holds no labelled pairs")
    return examples
