"""Reading Debian's Translation-<language> and Packages index files (deb822 stanzas).

apt stores them compressed (.lz4, .gz, .xz, ...); `apt-helper cat-file` decompresses them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.errors import DataError

APT_HELPER = "/usr/lib/apt/apt-helper"


@dataclass
class DescriptionRecord:
    package: str
    synopsis: str
    paragraphs: list[str] = field(default_factory=list)
    md5: str = ""


def parse_translation(lines: Iterable[str]) -> Iterator[DescriptionRecord]:
    """Parse the text of a Translation-en file (deb822 stanzas) into records.

    `Description-en:` holds the synopsis; the continuation lines (starting with a space) hold the
    long description, where a line " ." separates paragraphs. Lines starting with two spaces are
    "verbatim" (lists, code) in Debian policy; as plain text they are joined like the others.
    """
    package = md5 = synopsis = None
    paragraphs: list[str] = []
    current: list[str] = []
    in_description = False

    def finish_paragraph() -> None:
        if current:
            paragraphs.append(" ".join(current))
            current.clear()

    def record() -> DescriptionRecord | None:
        finish_paragraph()
        if package is None or synopsis is None:
            return None
        return DescriptionRecord(package, synopsis, list(paragraphs), md5 or "")

    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():  # blank line: end of stanza
            rec = record()
            if rec is not None:
                yield rec
            package = md5 = synopsis = None
            paragraphs, in_description = [], False
            continue
        if line[0] in " \t":  # continuation line
            if not in_description:
                continue  # continuation of a field we do not read
            text = line.strip()
            if text == ".":
                finish_paragraph()
            else:
                current.append(text)
            continue
        name, _, value = line.partition(":")
        in_description = False
        if name == "Package":
            package = value.strip()
        elif name == "Description-md5":
            md5 = value.strip()
        elif name.startswith("Description"):  # Description-en (or plain Description)
            synopsis = value.strip()
            in_description = True
    rec = record()
    if rec is not None:
        yield rec


def read_translation_file(path: str | Path) -> list[DescriptionRecord]:
    """Read one Translation-en file, compressed (.lz4/.gz/.xz, as apt stores it) or plain."""
    return list(parse_translation(read_index_text(path).splitlines()))


def read_index_text(path: str | Path) -> str:
    """The text of one apt index file (Translation-en, Packages), compressed as apt stores it or plain."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Debian index file {path} does not exist; run `make data`")
    if path.suffix in (".lz4", ".gz", ".xz", ".bz2", ".zst", ".lzma"):
        if not Path(APT_HELPER).exists():
            raise DataError(
                f"cannot decompress {path}: {APT_HELPER} (from Debian's apt) is missing; use plain "
                f"text files instead with task.data.files=[...]"
            )
        proc = subprocess.run(
            [APT_HELPER, "cat-file", str(path)], capture_output=True, text=True, errors="replace",
            check=False,
        )
        if proc.returncode != 0:
            raise DataError(
                f"`apt-helper cat-file {path}` failed ({proc.stderr.strip()}); the file looks "
                f"corrupt: delete it and run `make data` again"
            )
        return proc.stdout
    return path.read_text(encoding="utf-8", errors="replace")
