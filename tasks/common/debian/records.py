"""The prepared description records (records.jsonl + manifest.json) of the Debian corpus.

    <data_dir>/records.jsonl     {"package", "family", "split", "synopsis", "paragraphs"}
    <data_dir>/manifest.json     source files (name, bytes, sha256), counts, split fractions

The manifest is written last: its presence (with the right format version and byte count of the
records) marks the data as complete.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import DataError
from attnlab.files import atomic_write_text
from tasks.common.debian import apt
from tasks.common.debian.families import (
    DEFAULT_FRACTIONS,
    SPLITS,
    family_of,
    split_of,
    unique_paragraphs,
)
from tasks.common.debian.translation import read_translation_file
from tasks.common.files import sha256_of

RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"
# Bump when the record format or the family/split rules change: old prepared data is then redone.
FORMAT_VERSION = 1


def build_rows(files: Sequence[Path], fractions: Sequence[float] = DEFAULT_FRACTIONS) -> list[dict]:
    """Records of all files, de-duplicated (same package and description), with family + split."""
    rows, seen = [], set()
    for path in files:
        for rec in read_translation_file(path):
            key = (rec.package, rec.md5 or rec.synopsis, tuple(rec.paragraphs))
            if key in seen:  # the same description in bookworm and bookworm-updates
                continue
            seen.add(key)
            family = family_of(rec.package)
            rows.append(
                {
                    "package": rec.package,
                    "family": family,
                    "split": split_of(family, fractions),
                    "synopsis": rec.synopsis,
                    "paragraphs": rec.paragraphs,
                }
            )
    return rows


def is_prepared(data_dir: str | Path) -> bool:
    return unusable_because(data_dir) is None


def unusable_because(data_dir: str | Path) -> str | None:
    """Why the prepared records cannot be used as they are (None: they can)."""
    data_dir = Path(data_dir)
    manifest, records = data_dir / MANIFEST_FILE, data_dir / RECORDS_FILE
    if not (manifest.is_file() and records.is_file()):
        return f"{records} or {manifest.name} is missing"
    try:
        info = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return f"{manifest} is unreadable"
    if info.get("format_version") != FORMAT_VERSION:
        return f"the record format changed (version {info.get('format_version')} -> {FORMAT_VERSION})"
    expected = info.get("records_bytes")  # absent in manifests of older versions
    if expected is not None and records.stat().st_size != expected:
        return f"{records} has {records.stat().st_size} bytes, its manifest says {expected} (truncated)"
    return None


def prepare(
    data_dir: str | Path,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    files: Sequence[str | Path] | None = None,
    force: bool = False,
) -> Path:
    """Make sure data_dir holds prepared records; fetch with apt-get if needed. Returns records.jsonl.

    `files`: read these Translation-en files instead of fetching (tests, offline copies).
    """
    data_dir = Path(data_dir)
    records_path = data_dir / RECORDS_FILE
    if is_prepared(data_dir) and not force:
        return records_path
    data_dir.mkdir(parents=True, exist_ok=True)
    # Parallel jobs of a sweep may all arrive here: one prepares, the others wait and reuse it.
    with open(data_dir / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        reason = unusable_because(data_dir)
        if reason is None and not force:
            return records_path
        if (data_dir / MANIFEST_FILE).is_file() and not force:
            print(f"[debian] rebuilding the cache because {reason}", flush=True)
        return _prepare_locked(data_dir, fractions, files, force)


def _prepare_locked(data_dir: Path, fractions: Sequence[float], files: Sequence[str | Path] | None,
                    force: bool) -> Path:
    records_path = data_dir / RECORDS_FILE
    fetched = False
    if files is None:
        source_files = apt.translation_files(data_dir) if not force else []
        if not source_files:
            source_files, fetched = apt.fetch(data_dir), True
    else:
        source_files = [Path(f) for f in files]
    print(f"[debian] reading {len(source_files)} files into {records_path}", flush=True)
    try:
        rows = build_rows(source_files, fractions)
    except DataError as err:
        if files is not None or fetched:
            raise
        # a download cut short: fetch the index files again (apt-get checks their hashes)
        print(f"[debian] rebuilding the cache because a download is damaged ({err})", flush=True)
        for path in source_files:
            path.unlink(missing_ok=True)
        source_files = apt.fetch(data_dir)
        rows = build_rows(source_files, fractions)
    if not rows:
        raise DataError(
            f"no package descriptions found in {[str(f) for f in source_files]}; the files are "
            f"empty or not in the Translation-en format. Delete {data_dir} and run `make data` again"
        )
    atomic_write_text(records_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    per_split = {name: sum(r["split"] == name for r in rows) for name in SPLITS}
    manifest = {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sources": [{"name": f.name, "bytes": f.stat().st_size, "sha256": sha256_of(f)} for f in source_files],
        "records": len(rows),
        "records_bytes": records_path.stat().st_size,
        "records_per_split": per_split,
        "fractions": list(fractions),
        "split_rule": "sha256(family_of(package)) -> fractions (train, val, test)",
    }
    # The manifest is written last: its presence marks the data as complete.
    atomic_write_text(data_dir / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
    print(f"[debian] wrote {len(rows)} records {per_split} and {data_dir / MANIFEST_FILE}", flush=True)
    return records_path


def load_rows(data_dir: str | Path, split: str | None = None) -> list[dict]:
    """The prepared records (optionally of one split)."""
    path = Path(data_dir) / RECORDS_FILE
    if not path.is_file():
        raise DataError(f"{path} does not exist; run `make data` (or `python -m tasks.common.debian`)")
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except ValueError:
                raise DataError(f"{path}:{i} is not valid JSON; delete {path.parent} and run `make data`")
            if split is None or row["split"] == split:
                rows.append(row)
    return rows


def corpus_stats(rows: Sequence[dict]) -> dict:
    paragraphs = unique_paragraphs(rows)
    all_paragraphs = [p for ps in paragraphs.values() for p in ps]
    return {
        "records": len(rows),
        "families": len({r["family"] for r in rows}),
        "unique_paragraphs": len(all_paragraphs),
        "unique_paragraphs_per_split": {k: len(v) for k, v in paragraphs.items()},
        "words": sum(len(p.split()) for p in all_paragraphs),
    }
