"""German-English translation pairs from Debian's package descriptions (the default data of `mt`).

Debian's description translation project publishes German descriptions in `Translation-de`,
keyed by `Description-md5`: the md5 of the English original, which is in `Translation-en` under
the same key. Both are fetched with `tasks.common.debian.fetch` (apt-get into a private directory
per language: one `apt-get update` keeps only the languages it was asked for), paired by that key,
aligned (`tasks.mt.segments`), filtered, de-duplicated and split, and written in the fairseq layout
that `tasks.mt.parallel` reads:

    <pairs_dir>/{train,valid,test}.{de,en}   one segment per line; line i of .de translates line i of .en
    <pairs_dir>/{train,valid,test}.package   the package each line comes from
    <pairs_dir>/manifest.json                settings, sha256 of the source files and of the outputs, counts

Rules, in order:
1. A German description pairs with the English one of the same md5 (German entries whose md5 is
   not in Translation-en, outdated translations, are counted and dropped). Each md5 is used once,
   with the package of the smallest family.
2. Segments: synopsis with synopsis; paragraphs, then sentences, only where both sides split alike
   (`segments.aligned_segments`).
3. Drop pairs that are untranslated copies or near-copies (word-sequence similarity >=
   `copy_threshold`, `segments.copy_similarity`), longer than `max_words` words on a side, or
   with a character-length ratio above `max_ratio`.
4. De-duplicate: a pair whose English or German text was already used is dropped (boilerplate such
   as "This package contains the development files." recurs in hundreds of packages); the copy of
   the smallest package family is kept, so no text is in two splits.
5. Split by package family (`debian.family_of` / `debian.split_of`), as the other Debian tasks.

CLI (what `make data` runs after the English descriptions):  python -m tasks.mt.debian_pairs --data-dir data
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import DataError, command, require_dir
from attnlab.files import atomic_write_text
from tasks.common import debian
from tasks.common.files import sha256_of
from tasks.mt import segments
from tasks.mt.parallel import SPLIT_FILES

LANGUAGES = ("de", "en")
MANIFEST_FILE = "manifest.json"
# Bump when the pairing rules change: pairs built by an older version are then rebuilt.
FORMAT_VERSION = 1
DEFAULT_FRACTIONS = (0.94, 0.03, 0.03)


def read_descriptions(files: Sequence[Path]) -> list[debian.DescriptionRecord]:
    return [record for path in files for record in debian.read_translation_file(path)]


def build_pairs(
    german: Sequence[debian.DescriptionRecord],
    english: Sequence[debian.DescriptionRecord],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    copy_threshold: float = 0.9,
    max_words: int = 80,
    max_ratio: float = 2.0,
    sentences: bool = True,
) -> tuple[dict[str, list[tuple[str, str, str]]], dict]:
    """{split: [(package, german, english), ...]} and counts of what each rule dropped."""
    english_by_md5 = {}
    for record in english:  # the same description may be in bookworm and bookworm-updates
        english_by_md5.setdefault(record.md5, record)
    ordered = sorted(german, key=lambda r: (debian.family_of(r.package), r.package))
    counts: Counter = Counter()
    used_md5: set[str] = set()
    seen_de: set[str] = set()
    seen_en: set[str] = set()
    result: dict[str, list[tuple[str, str, str]]] = {name: [] for name in debian.SPLITS}
    for record in ordered:
        if record.md5 in used_md5:
            counts["descriptions_repeated"] += 1
            continue
        original = english_by_md5.get(record.md5)
        if not record.md5 or original is None:
            counts["descriptions_without_english"] += 1
            continue
        used_md5.add(record.md5)
        counts["descriptions_paired"] += 1
        split = debian.split_of(debian.family_of(record.package), fractions)
        for de, en in segments.aligned_segments(
            record.synopsis, record.paragraphs, original.synopsis, original.paragraphs,
            max_ratio, sentences,
        ):
            counts["segments"] += 1
            if segments.is_copy(de, en, copy_threshold):
                counts["dropped_copy"] += 1
            elif max(len(de.split()), len(en.split())) > max_words:
                counts["dropped_too_long"] += 1
            elif segments.length_ratio(de, en) > max_ratio:
                counts["dropped_length_ratio"] += 1
            elif de in seen_de or en in seen_en:
                counts["dropped_duplicate"] += 1
            else:
                seen_de.add(de)
                seen_en.add(en)
                result[split].append((record.package, de, en))
    return result, dict(counts)


def _settings(fractions, copy_threshold, max_words, max_ratio, sentences) -> dict:
    return {
        "fractions": [float(f) for f in fractions],
        "copy_threshold": float(copy_threshold),
        "max_words": int(max_words),
        "max_ratio": float(max_ratio),
        "sentences": bool(sentences),
    }


def is_built(pairs_dir: Path, settings: dict, sources: Sequence[Path] = ()) -> bool:
    """Pairs built with these settings (and from these source files, when given)."""
    try:
        manifest = json.loads((pairs_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (
        manifest.get("format_version") == FORMAT_VERSION
        and manifest.get("settings") == settings
        and all((pairs_dir / f"{SPLIT_FILES[s]}.{lang}").is_file() for s in debian.SPLITS for lang in LANGUAGES)
        and (not sources or [s["sha256"] for s in manifest.get("sources", [])] == [sha256_of(f) for f in sources])
    )


def _source_files(directory: Path, language: str, given: Sequence[str | Path] | None, fetch: bool) -> list[Path]:
    if given:
        return [Path(f) for f in given]
    files = debian.translation_files(directory, language)
    return files or (debian.fetch(directory, language) if fetch else [])


def prepare_pairs(
    pairs_dir: str | Path,
    english_dir: str | Path,
    german_dir: str | Path,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    copy_threshold: float = 0.9,
    max_words: int = 80,
    max_ratio: float = 2.0,
    sentences: bool = True,
    english_files: Sequence[str | Path] | None = None,
    german_files: Sequence[str | Path] | None = None,
) -> Path:
    """Build the pairs into pairs_dir unless built with the same settings; returns pairs_dir.

    The Translation-en files are those of `english_dir` (the apt dir the mlm/headline tasks share,
    data/debian), the Translation-de files are fetched into `german_dir`; `english_files` /
    `german_files` give files instead (tests, offline copies).
    """
    pairs_dir = Path(pairs_dir)
    settings = _settings(fractions, copy_threshold, max_words, max_ratio, sentences)

    def sources(fetch: bool) -> list[Path]:  # English first, then German (the manifest's order)
        english = _source_files(Path(english_dir), "en", english_files, fetch)
        german = _source_files(Path(german_dir), "de", german_files, fetch)
        return english + german if english and german else []

    # Built pairs are reused unless the settings or the source files (when still there) changed.
    if is_built(pairs_dir, settings, sources(fetch=False)):
        return pairs_dir
    pairs_dir.mkdir(parents=True, exist_ok=True)
    # Parallel jobs of a sweep may all arrive here: one builds, the others wait and reuse it.
    with open(pairs_dir / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(pairs_dir, settings, sources(fetch=False)):
            return pairs_dir
        start = time.time()
        en_files = _source_files(Path(english_dir), "en", english_files, fetch=True)
        de_files = _source_files(Path(german_dir), "de", german_files, fetch=True)
        print(f"[mt] pairing {[f.name for f in de_files]} with {[f.name for f in en_files]}", flush=True)
        splits, counts = build_pairs(
            read_descriptions(de_files), read_descriptions(en_files),
            fractions, copy_threshold, max_words, max_ratio, sentences,
        )
        if not splits["train"]:
            raise DataError(
                f"no German-English pair survived in {pairs_dir} (counts: {counts}); the "
                f"Translation-de/-en files are empty or unrelated. Delete {german_dir} and "
                f"{english_dir}/apt-lists and run `make data` again"
            )
        _write(pairs_dir, splits, counts, settings, en_files + de_files)
        print(f"[mt] built the pairs in {time.time() - start:.1f} s", flush=True)
    return pairs_dir


def _write(pairs_dir: Path, splits: dict, counts: dict, settings: dict, sources: list[Path]) -> None:
    outputs = []
    for split, rows in splits.items():
        for column, suffix in enumerate(("package", "de", "en")):
            path = pairs_dir / f"{SPLIT_FILES[split]}.{suffix}"
            atomic_write_text(path, "".join(row[column] + "\n" for row in rows))
            outputs.append({"name": path.name, "lines": len(rows), "sha256": sha256_of(path)})
    per_split = {split: len(rows) for split, rows in splits.items()}
    words = {
        lang: sum(len(row[column].split()) for rows in splits.values() for row in rows)
        for column, lang in ((1, "de"), (2, "en"))
    }
    manifest = {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sources": [{"name": f.name, "bytes": f.stat().st_size, "sha256": sha256_of(f)} for f in sources],
        "settings": settings,
        "split_rule": "sha256(family_of(package)) -> fractions (train, valid, test)",
        "pairs": sum(per_split.values()),
        "pairs_per_split": per_split,
        "words": words,
        "counts": counts,
        "outputs": outputs,
    }
    # Written last: its presence (with matching settings) marks the pairs as complete.
    atomic_write_text(pairs_dir / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
    print(f"[mt] wrote {manifest['pairs']} pairs {per_split} ({words} words) to {pairs_dir}", flush=True)
    print(f"[mt] pairing counts: {counts}", flush=True)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.mt.debian_pairs",
                                     description="Build the German-English Debian pairs of task=mt")
    parser.add_argument("--data-dir", default="data", help="the project's data dir (default: data)")
    args = parser.parse_args(argv)
    data_dir = require_dir(args.data_dir, "--data-dir", "--data-dir data", missing_ok=True)
    pairs_dir = prepare_pairs(data_dir / "mt" / "debian-de-en", data_dir / "debian", data_dir / "debian-de")
    manifest = json.loads((pairs_dir / MANIFEST_FILE).read_text())
    print(f"[mt] {pairs_dir}: {manifest['pairs_per_split']} pairs, {manifest['words']} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
