"""One entry point to the classification data of every source: examples per split and label names.

    source=debian   Debian descriptions -> package section (tasks.classify.debian_sections);
                    sections with >= min_examples examples are the classes, the others are left out;
                    splits by package family with `fractions`
    source=tsv      label<TAB>text files of data_dir (tasks.classify.readers); the classes are the
                    training labels (val/test labels must be among them)
    source=snli     SNLI jsonl pairs of data_dir; classes entailment, neutral, contradiction
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import ConfigError, DataError
from tasks.classify import debian_sections, readers
from tasks.classify.readers import Example
from tasks.common import debian

SOURCES = ("debian", "tsv", "snli")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)


@dataclass
class Corpus:
    splits: dict[str, list[Example]]
    label_names: list[str]
    pair: bool  # examples are (text, text_b) pairs

    def labels(self, split: str) -> list[int]:
        index = {name: i for i, name in enumerate(self.label_names)}
        return [index[e.label] for e in self.splits[split]]


def check_source(source: str, data_dir: str | Path | None) -> None:
    if source not in SOURCES:
        raise ConfigError(f"task.source={source!r}; use one of {', '.join(SOURCES)}")
    if source != "debian" and not data_dir:
        raise ConfigError(f"task.source={source} needs task.data_dir=<folder with its train/dev/test files>")


def prepare(source: str, data_dir: str | Path) -> None:
    """Fetch the Debian data if needed; for files, check that every split's file is there."""
    check_source(source, data_dir)
    if source == "debian":
        debian_sections.prepare(data_dir)
    else:
        readers.find_split_files(data_dir, _suffixes(source))


def load_corpus(source: str, data_dir: str | Path, min_examples: int = 500,
                fractions: Sequence[float] = DEFAULT_FRACTIONS, header: str = "auto") -> Corpus:
    check_source(source, data_dir)
    if source == "debian":
        return _debian_corpus(data_dir, int(min_examples), fractions)
    files = readers.find_split_files(data_dir, _suffixes(source))
    if source == "snli":
        return Corpus({s: readers.read_snli(p) for s, p in files.items()}, list(readers.SNLI_LABELS), pair=True)
    splits = {s: readers.read_tsv(p, header) for s, p in files.items()}
    names = sorted({e.label for e in splits["train"]}, key=_label_order)
    for split in ("val", "test"):
        unknown = sorted({e.label for e in splits[split]} - set(names))
        if unknown:
            raise DataError(f"{files[split]} has labels that {files['train'].name} lacks: {unknown[:10]}; "
                            f"a classifier cannot predict them")
    return Corpus(splits, names, pair=False)


def _suffixes(source: str) -> tuple[str, ...]:
    return (".jsonl",) if source == "snli" else readers.TSV_SUFFIXES


def _label_order(label: str) -> tuple:
    """Numeric labels (Yelp's 1..5, SST's 0/1) in numeric order, others alphabetically."""
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def _debian_corpus(data_dir: str | Path, min_examples: int, fractions: Sequence[float]) -> Corpus:
    rows = debian_sections.load_examples(data_dir)
    counts = Counter(row["section"] for row in rows)
    names = sorted(s for s, n in counts.items() if n >= min_examples)
    if len(names) < 2:
        raise ConfigError(
            f"task.data.min_examples={min_examples} leaves {len(names)} section(s) of {Path(data_dir)} "
            f"(the largest: {dict(counts.most_common(3))}); lower it"
        )
    kept = set(names)
    splits: dict[str, list[Example]] = {s: [] for s in debian.SPLITS}
    for row in rows:
        if row["section"] in kept:
            splits[debian.split_of(row["family"], fractions)].append(Example(row["section"], row["text"]))
    empty = [s for s, examples in splits.items() if not examples]
    if empty:
        raise DataError(f"the {', '.join(empty)} split of {data_dir} is empty; give it a share in task.data.fractions")
    return Corpus(splits, names, pair=False)
