"""File helpers of every data preparation: a file's sha256 (manifests, cache keys), atomic writes."""

from __future__ import annotations

import hashlib
from pathlib import Path

# the one atomic write (attnlab.files), here too for the data preparations that import it from here
from attnlab.files import atomic_write_text  # noqa: F401


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
