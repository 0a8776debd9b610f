"""Derived data kept on disk (generated data sets, tokenized corpora): a damaged file is rebuilt.

A cache can be cut short by a full disk, an interrupted copy or a filesystem that lost its last
blocks. Its owner calls `read_npz`; on None it builds the data again and writes it atomically
(temporary file + rename, as tasks/vqa/synthetic.py and tasks/mlm/datamodule.py do).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.errors import DataError


def read_npz(path: str | Path) -> dict[str, np.ndarray] | None:
    """Every array of a cached .npz; None if it is absent, or damaged (then removed, and said why)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"the cache {path} is a directory, not a file; move it away and run again")
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as err:  # noqa: BLE001 - zip, CRC, EOF and format errors: all mean damaged
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"[cache] rebuilding the cache because {path} is unreadable (truncated or corrupt: "
              f"{detail})", flush=True)
        path.unlink()
        return None
