"""English Debian package descriptions: fetch, read, split and prepare.

The corpus comes from Debian's `Translation-en` index files. `apt-get update` fetches them into a
private directory of the project (never the system's apt lists), `apt-helper cat-file` decompresses
them, and `prepare()` writes one JSON line per description plus a manifest with the sha256 of every
source file:

    <data_dir>/records.jsonl     {"package", "family", "split", "synopsis", "paragraphs"}
    <data_dir>/manifest.json     source files (name, bytes, sha256), counts, split fractions

`fetch(data_dir, language)` fetches the descriptions of another language the same way
(Translation-de for the mt task, into its own data dir).

Records are split train/val/test by a stable hash of the package *family* (libfoo1, libfoo-dev,
foo-doc and python3-foo share one), so near-identical descriptions of related packages do not leak
across splits.

CLI (what `make data` runs):  python -m tasks.common.debian --data-dir data/debian
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.errors import DataError

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.98, 0.01, 0.01)
RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"
APT_HELPER = "/usr/lib/apt/apt-helper"
# Bump when the record format or the family/split rules change: old prepared data is then redone.
FORMAT_VERSION = 1


@dataclass
class DescriptionRecord:
    package: str
    synopsis: str
    paragraphs: list[str] = field(default_factory=list)
    md5: str = ""


# --------------------------------------------------------------------------------------------
# Reading the Translation-en format
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Package families and splits
# --------------------------------------------------------------------------------------------

# Prefixes of binary packages built from a library or a language binding.
_PREFIXES = (
    "python3-", "python-", "pypy3-", "ruby-", "node-", "r-cran-", "r-bioc-", "r-other-",
    "php-", "lua-", "golang-github-", "golang-gopkg-", "golang-", "librust-", "elpa-",
    "gir1.2-", "haskell-", "ocaml-", "perl-", "tcl-", "guile-", "fonts-", "lib",
)
# Suffixes naming one part of a split source package (stripped repeatedly).
_SUFFIXES = (
    "-dev", "-doc", "-docs", "-dbg", "-dbgsym", "-common", "-data", "-bin", "-utils", "-tools",
    "-examples", "-perl", "-java", "-jni", "-ocaml", "-static", "-plugins", "-plugin", "-runtime",
    "-tests", "-test", "-headers", "-modules", "-core", "-client", "-server", "-daemon", "-cli",
    "-gtk", "-gtk3", "-qt", "-qt5", "-qt6", "-extra", "-extras", "-all", "-full", "-minimal",
    "-udeb", "-l10n", "-i18n", "-locales", "-lang", "-dynamic", "-prof", "-cil",
)
# Trailing ABI/version markers: libfoo1, libfoo2.0-0, libfoo-1.0-0, libfoo1t64, libfoo6v5.
_VERSION_TAIL = re.compile(r"([-.]?\d[\d.+~]*(t64|v5|c2|c2a|ldbl|gf|a)?)$")


def family_of(package: str) -> str:
    """A package-family key: related binary packages of one source map to the same key.

    Heuristic on the binary name (Translation files do not name the source package): lower-case,
    drop a language/library prefix, then strip part suffixes and ABI version tails until nothing
    changes. libfoo1, libfoo-dev, foo-doc, python3-foo and foo all give "foo". Merging too much
    is harmless for leakage (it only puts more packages together); the key is never empty.
    """
    name = package.strip().lower()
    if ":" in name:  # architecture qualifier (foo:amd64)
        name = name.split(":", 1)[0]
    key = name
    for prefix in _PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix):]
            break
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key, changed = key[: -len(suffix)], True
        stripped = _VERSION_TAIL.sub("", key)
        if stripped and stripped != key:
            key, changed = stripped, True
        key = key.rstrip("-.+")
    return key or name


def split_of(family: str, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> str:
    """train / val / test for a family, by a stable hash (same answer on every machine and run)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise DataError(f"split fractions {tuple(fractions)} must be 3 non-negative numbers summing to 1")
    digest = hashlib.sha256(family.encode("utf-8")).digest()
    x = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
    edge = 0.0
    for name, fraction in zip(SPLITS, fractions):
        edge += fraction
        if x < edge:
            return name
    return SPLITS[-1]


def paragraph_owners(rows: Iterable[dict]) -> dict[str, tuple[str, str]]:
    """paragraph -> (family, split) of the one family that owns it.

    Related packages often repeat a paragraph; a paragraph shared by several families goes to the
    smallest family key that has it, so no text appears in two splits. `rows` are prepared
    records (dicts with "family", "split", "paragraphs"); the dict keeps first-seen order.
    """
    owner: dict[str, tuple[str, str]] = {}
    for row in rows:
        for paragraph in row["paragraphs"]:
            seen = owner.get(paragraph)
            if seen is None or row["family"] < seen[0]:
                owner[paragraph] = (row["family"], row["split"])
    return owner


def unique_paragraphs(rows: Iterable[dict]) -> dict[str, list[str]]:
    """Distinct paragraphs per split, each paragraph in exactly one split (see paragraph_owners)."""
    result: dict[str, list[str]] = {name: [] for name in SPLITS}
    for paragraph, (_, split) in paragraph_owners(rows).items():  # first-seen order: deterministic
        result[split].append(paragraph)
    return result


# --------------------------------------------------------------------------------------------
# Fetching with apt-get into a private directory
# --------------------------------------------------------------------------------------------

_OFFLINE_HELP = (
    "Fetch the corpus on a machine with Debian's apt and network access (`make data`, which runs "
    "`python -m tasks.common.debian --data-dir data/debian`) and copy the data dir here, or train "
    "on your own plain-text files instead: task.data.files=[path/a.txt,path/b.txt]"
)


def apt_command(data_dir: Path, language: str = "en", packages: bool = False) -> list[str]:
    """`apt-get update` that writes only under data_dir and fetches only the descriptions in
    `language` (Translation-<language>; the German ones for the mt task are `de`).

    One language per data_dir: `apt-get update` deletes the index files it was not asked for.
    `packages=True` also fetches the Packages indexes (section, source, Description-md5 of every
    binary package of the machine's architecture), which the `classify` task labels with.
    """
    data_dir = data_dir.resolve()
    return [
        "apt-get",
        # Private config: clears the system's update hooks (packagekit, appstream) so that
        # nothing outside data_dir is touched; see _write_private_conf.
        "-c", str(data_dir / "apt.conf"),
        "-o", f"Dir::State::Lists={data_dir / 'apt-lists'}",  # the index files and their lock
        "-o", f"Dir::Cache={data_dir / 'apt-cache'}",
        "-o", "Dir::Cache::pkgcache=",  # no binary package caches
        "-o", "Dir::Cache::srcpkgcache=",
        "-o", f"Acquire::Languages={language}",
        # Only Translation-<language> (and Packages if asked): no other index is needed.
        "-o", f"Acquire::IndexTargets::deb::Packages::DefaultEnabled={str(packages).lower()}",
        "-o", "Acquire::IndexTargets::deb-src::Sources::DefaultEnabled=false",
        "-o", "Acquire::http::Timeout=30",
        "-o", "Acquire::Retries=2",
        "update",
    ]


def _write_private_conf(data_dir: Path) -> None:
    (data_dir / "apt-lists" / "partial").mkdir(parents=True, exist_ok=True)
    (data_dir / "apt-cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (data_dir / "apt.conf").write_text(
        "// written by tasks.common.debian: keep `apt-get update` from running system hooks\n"
        "#clear APT::Update::Pre-Invoke;\n"
        "#clear APT::Update::Post-Invoke;\n"
        "#clear APT::Update::Post-Invoke-Success;\n"
    )


def translation_files(data_dir: Path, language: str = "en") -> list[Path]:
    return sorted((Path(data_dir) / "apt-lists").glob(f"*Translation-{language}*"))


def packages_files(data_dir: Path) -> list[Path]:
    return sorted((Path(data_dir) / "apt-lists").glob("*_Packages*"))


def fetch(data_dir: str | Path, language: str = "en", packages: bool = False) -> list[Path]:
    """Run `apt-get update` into data_dir/apt-lists; return the Translation-<language> files.

    `packages=True`: fetch the Packages indexes too (see `apt_command`; `packages_files` lists them).
    """
    data_dir = Path(data_dir)
    if shutil.which("apt-get") is None or not Path(APT_HELPER).exists():
        raise DataError(f"the Debian corpus needs Debian's apt-get, which this machine lacks. {_OFFLINE_HELP}")
    data_dir.mkdir(parents=True, exist_ok=True)
    _write_private_conf(data_dir)
    cmd = apt_command(data_dir, language, packages)
    what = f"Translation-{language} package descriptions" + (" and the Packages indexes (~9 MB)" if packages else "")
    print(f"[debian] fetching {what} into {data_dir / 'apt-lists'}:")
    print("[debian]   " + " ".join(cmd), flush=True)
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise DataError(f"`apt-get update` did not finish in 10 minutes (offline?). {_OFFLINE_HELP}")
    for line in proc.stdout.splitlines():
        if line.startswith(("Get:", "Hit:", "Fetched", "Ign:", "Err:")):
            print(f"[debian]   {line}")
    files = translation_files(data_dir, language)
    if proc.returncode != 0 or not files or (packages and not packages_files(data_dir)):
        detail = (proc.stderr.strip() or proc.stdout.strip())[-800:]
        raise DataError(
            f"`apt-get update` could not fetch the Translation-{language}{' and Packages' if packages else ''} "
            f"files (exit {proc.returncode}):\n"
            f"{detail}\n{_OFFLINE_HELP}"
        )
    print(f"[debian] fetched {len(files)} Translation-{language} files in {time.time() - start:.1f} s", flush=True)
    return files


# --------------------------------------------------------------------------------------------
# Preparing records + manifest
# --------------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        source_files = translation_files(data_dir) if not force else []
        if not source_files:
            source_files, fetched = fetch(data_dir), True
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
        source_files = fetch(data_dir)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="data/debian", help="where to fetch and write (default data/debian)")
    parser.add_argument("--force", action="store_true", help="fetch and prepare again")
    args = parser.parse_args(argv)
    start = time.time()
    try:
        path = prepare(args.data_dir, force=args.force)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    stats = corpus_stats(load_rows(args.data_dir))
    print(f"[debian] {path}: {json.dumps(stats)} ({time.time() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
