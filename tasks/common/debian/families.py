"""Package families and the train/val/test split that follows them.

Records are split by a stable hash of the package *family* (libfoo1, libfoo-dev, foo-doc and
python3-foo share one), so near-identical descriptions of related packages do not leak across
splits; a paragraph shared by several families belongs to one of them (`paragraph_owners`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

from attnlab.errors import DataError

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.98, 0.01, 0.01)

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
