"""Tokenized corpora kept on disk as .npz files, named by a hash of everything they depend on.

Tokenizing the Debian corpus takes about a minute on 2 cores (Wikitext-103 several); tasks key
the cache on the source files' sha256, the tokenizer and their own settings, so a stale cache is
never read: any change gives another file name.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from attnlab.files import atomic_write


def cache_path(folder: str | Path, prefix: str, key_parts: dict) -> Path:
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / f"{prefix}-{key}.npz"


def load_arrays(path: Path | None) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file; None when there is none, or when it is damaged (cut short by a
    full disk or an interrupted copy): then it is removed, with the reason, and the caller builds
    and saves the data again."""
    if path is None or not Path(path).is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except Exception as err:  # noqa: BLE001 - zip, CRC, EOF and format errors: all mean damaged
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"[cache] rebuilding the cache because {path} is unreadable (truncated or corrupt: "
              f"{detail})", flush=True)
        Path(path).unlink()
        return None


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically: a crash or a parallel job never leaves a half-written cache."""
    with atomic_write(path) as f:
        np.savez(f, **arrays)
