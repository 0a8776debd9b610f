"""Debian package descriptions labelled with their package's Section: `classify`'s default data.

A private `apt-get update` (tasks.common.debian, with the Packages index target enabled) fetches
the Packages indexes (Package, Source, Section, Description-md5 of every binary package of this
machine's architecture) and the Translation-en files (the descriptions) of one archive snapshot.
They are joined on Description-md5 and written as one JSON line per package:

    <data_dir>/examples.jsonl   {"package", "source", "family", "section", "text"}
    <data_dir>/manifest.json    source files (name, bytes, sha256), counts per section, what was dropped

Rules:
- section: the component prefix is dropped and the rest lower-cased (`contrib/games` -> `games`,
  `non-free/libs` -> `libs`); packages without a Section are left out.
- text: the synopsis, then the long description's paragraphs, joined by spaces.
- one example per binary package (the first in file order: security and updates sort before the
  release), and one per distinct text: a text shared by several families stays with the smallest
  family key, so no text is in two splits.
- family: `family_of` (tasks.common.debian) of the *source* package, so a source package (and
  related sources such as python-foo / foo) never spans two splits; splits are drawn per family
  at load time (`split_of`), so the fractions are an option, not part of the prepared data.
- which sections are classes (>= min_examples examples) is also decided at load time.

CLI:  python -m tasks.classify.debian_sections --data-dir data/debian_sections
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import DataError, command, require_dir
from tasks.common import debian

EXAMPLES_FILE = "examples.jsonl"
MANIFEST_FILE = "manifest.json"
# Bump when the example format or the join/dedupe rules change: old prepared data is then redone.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PackageEntry:
    package: str
    source: str  # the source package's name (= package when the Packages stanza has no Source)
    section: str  # as written in Packages ("" when missing)
    md5: str  # Description-md5 ("" when missing)


def parse_packages(lines: Iterable[str]) -> Iterator[PackageEntry]:
    """The fields we use of a Packages index (deb822 stanzas separated by blank lines)."""
    fields: dict[str, str] = {}

    def entry() -> PackageEntry | None:
        if "Package" not in fields:
            return None
        # "Source: foo (1.2-3)" names a source whose version differs from the binary's
        source = fields.get("Source", "").split(" ", 1)[0] or fields["Package"]
        return PackageEntry(fields["Package"], source, fields.get("Section", ""), fields.get("Description-md5", ""))

    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip():
            found = entry()
            if found is not None:
                yield found
            fields = {}
        elif line[0] not in " \t":  # continuation lines (Tag:, Description:) are not read
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    found = entry()
    if found is not None:
        yield found


def normalize_section(section: str) -> str:
    """`contrib/games` -> `games`, `non-free-firmware/Kernel` -> `kernel`; "" stays ""."""
    return section.strip().lower().rsplit("/", 1)[-1]


def description_text(record: debian.DescriptionRecord) -> str:
    return " ".join([record.synopsis, *record.paragraphs]).strip()


def build_examples(packages_files: Sequence[Path], translation_files: Sequence[Path]) -> tuple[list[dict], dict]:
    """Join the Packages entries to their descriptions; returns (examples, counts of what was dropped)."""
    texts: dict[str, str] = {}
    for path in translation_files:
        for record in debian.read_translation_file(path):
            if record.md5:
                texts.setdefault(record.md5, description_text(record))
    dropped = Counter()
    by_package: dict[str, dict] = {}
    for path in packages_files:
        for entry in parse_packages(debian.read_index_text(path).splitlines()):
            if entry.package in by_package:
                dropped["same package in a later file"] += 1
                continue
            section, text = normalize_section(entry.section), texts.get(entry.md5, "")
            if not section or not text:
                dropped["no section" if not section else "no description for its Description-md5"] += 1
                continue
            by_package[entry.package] = {
                "package": entry.package, "source": entry.source, "family": debian.family_of(entry.source),
                "section": section, "text": text,
            }
    owner: dict[str, dict] = {}  # text -> the example that keeps it
    for example in by_package.values():
        kept = owner.get(example["text"])
        if kept is None or (example["family"], example["package"]) < (kept["family"], kept["package"]):
            owner[example["text"]] = example
    dropped["same text as another package"] = len(by_package) - len(owner)
    examples = sorted(owner.values(), key=lambda e: e["package"])
    return examples, dict(dropped)


def is_prepared(data_dir: str | Path) -> bool:
    manifest = Path(data_dir) / MANIFEST_FILE
    if not (manifest.is_file() and (Path(data_dir) / EXAMPLES_FILE).is_file()):
        return False
    try:
        return json.loads(manifest.read_text()).get("format_version") == FORMAT_VERSION
    except (OSError, ValueError):
        return False


def prepare(data_dir: str | Path, packages_files: Sequence[str | Path] | None = None,
            translation_files: Sequence[str | Path] | None = None, force: bool = False) -> Path:
    """Make sure data_dir holds examples.jsonl (fetching with apt-get if needed); returns its path.

    `packages_files` + `translation_files`: read these index files instead of fetching (tests,
    offline copies).
    """
    data_dir = Path(data_dir)
    if is_prepared(data_dir) and not force:
        return data_dir / EXAMPLES_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    # Parallel jobs of a sweep may all arrive here: one prepares, the others wait and reuse it.
    with open(data_dir / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(data_dir) and not force:
            return data_dir / EXAMPLES_FILE
        if (packages_files is None) != (translation_files is None):
            raise DataError("give both packages_files and translation_files, or neither (then they are fetched)")
        if packages_files is None:
            packages = debian.packages_files(data_dir) if not force else []
            translations = debian.translation_files(data_dir)
            if not packages or not translations:
                translations = debian.fetch(data_dir, packages=True)
                packages = debian.packages_files(data_dir)
        else:
            packages, translations = [Path(p) for p in packages_files], [Path(p) for p in translation_files]
        return _write(data_dir, packages, translations)


def _write(data_dir: Path, packages: Sequence[Path], translations: Sequence[Path]) -> Path:
    print(f"[classify] joining {len(packages)} Packages and {len(translations)} Translation-en files", flush=True)
    examples, dropped = build_examples(packages, translations)
    if not examples:
        raise DataError(
            f"no package had both a Section and a description in {[str(p) for p in packages]} + "
            f"{[str(p) for p in translations]}; delete {data_dir} and run "
            f"`python -m tasks.classify.debian_sections --data-dir {data_dir}` again"
        )
    path = data_dir / EXAMPLES_FILE
    debian.atomic_write_text(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples))
    sections = Counter(e["section"] for e in examples)
    manifest = {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sources": [{"name": f.name, "bytes": f.stat().st_size, "sha256": debian.sha256_of(f)}
                    for f in [*packages, *translations]],
        "examples": len(examples),
        "families": len({e["family"] for e in examples}),
        "dropped": dropped,
        "examples_per_section": dict(sections.most_common()),
        "section_rule": "lower-case, component prefix dropped (contrib/games -> games)",
        "split_rule": "sha256(family_of(source package)) -> fractions (train, val, test), at load time",
    }
    # The manifest is written last: its presence marks the data as complete.
    debian.atomic_write_text(data_dir / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
    print(f"[classify] wrote {len(examples)} examples in {len(sections)} sections to {path} "
          f"(dropped: {dropped})", flush=True)
    return path


def load_examples(data_dir: str | Path) -> list[dict]:
    path = Path(data_dir) / EXAMPLES_FILE
    if not path.is_file():
        raise DataError(f"{path} does not exist; run `python -m tasks.classify.debian_sections --data-dir {data_dir}`")
    with open(path, encoding="utf-8") as f:
        try:
            return [json.loads(line) for line in f]
        except ValueError:
            raise DataError(f"{path} is not valid JSON lines; delete {path.parent} and prepare it again")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.classify.debian_sections",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="data/debian_sections", help="where to fetch and write")
    parser.add_argument("--force", action="store_true", help="fetch and prepare again")
    args = parser.parse_args(argv)
    require_dir(args.data_dir, "--data-dir", "--data-dir data/debian_sections", missing_ok=True)
    path = prepare(args.data_dir, force=args.force)
    manifest = json.loads((Path(args.data_dir) / MANIFEST_FILE).read_text())
    print(f"[classify] {path}: {manifest['examples']} examples, {manifest['families']} families, "
          f"sections {manifest['examples_per_section']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
