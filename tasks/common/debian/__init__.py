"""English (and German) Debian package descriptions: read, split by family, fetch, prepare.

The corpus comes from Debian's `Translation-en` index files. `apt-get update` fetches them into a
private directory of the project (never the system's apt lists, `apt.py`), `apt-helper cat-file`
decompresses them (`translation.py`), records are split train/val/test by package family
(`families.py`), and `prepare()` writes one JSON line per description plus a manifest with the
sha256 of every source file (`records.py`). `fetch(data_dir, language)` fetches the descriptions of
another language the same way (Translation-de for the mt task, into its own data dir).

CLI (what `make data` runs):  python -m tasks.common.debian --data-dir data/debian

The names below are the package's interface: `from tasks.common import debian; debian.prepare(...)`.
"""

from attnlab.files import atomic_write_text
from tasks.common.debian.apt import apt_command, fetch, packages_files, translation_files
from tasks.common.debian.families import (
    DEFAULT_FRACTIONS,
    SPLITS,
    family_of,
    paragraph_owners,
    split_of,
    unique_paragraphs,
)
from tasks.common.debian.records import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    RECORDS_FILE,
    build_rows,
    corpus_stats,
    is_prepared,
    load_rows,
    prepare,
    unusable_because,
)
from tasks.common.debian.translation import (
    APT_HELPER,
    DescriptionRecord,
    parse_translation,
    read_index_text,
    read_translation_file,
)
from tasks.common.files import sha256_of

__all__ = [
    "APT_HELPER", "DEFAULT_FRACTIONS", "FORMAT_VERSION", "MANIFEST_FILE", "RECORDS_FILE", "SPLITS",
    "DescriptionRecord", "apt_command", "atomic_write_text", "build_rows", "corpus_stats", "family_of",
    "fetch", "is_prepared", "load_rows", "packages_files", "paragraph_owners", "parse_translation",
    "prepare", "read_index_text", "read_translation_file", "sha256_of", "split_of", "translation_files",
    "unique_paragraphs", "unusable_because",
]
