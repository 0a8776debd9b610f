"""Atomic file writes: the one way attnlab and the tasks write a file that another process (a
parallel sweep job, a resumed run, the report) may read, or that a kill may interrupt.

    with atomic_write(path) as f:         # binary; atomic_write(path, "w") for text
        np.savez(f, **arrays)
    atomic_write_text(path, text)

The data go to a temporary file in the same folder (so the rename never crosses a filesystem),
are flushed and fsynced, and the file is renamed over `path` (os.replace: atomic). A reader, a
crash or a kill at any moment sees the previous file or the new one, never part of one; on an
error the temporary file is removed, and an OSError that names no file (a write or fsync on a
full disk) is raised again naming `path`, so that the user is told which file and where.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_write(path: str | Path, mode: str = "wb", *, partial: str | None = None,
                 keep_existing: bool = False) -> Iterator[IO]:
    """A file to write `path` through, put in place when the block ends without an error.

    `partial`: the temporary file's name (checkpoints: `.<name>.partial`, which a kill leaves
    behind for inspection and the next save overwrites); by default a unique hidden
    `.<name>.<random>.tmp`, so that parallel writers of one path never share one.
    `keep_existing`: the first writer wins (os.link refuses an existing `path`): processes that
    race to create the same file all end up reading the same one.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode {mode!r}: use 'w' (text) or 'wb' (binary)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if partial is None:  # a new file ("x"): never another writer's
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        open_mode = mode.replace("w", "x")
    else:  # what a killed save left there is overwritten
        tmp, open_mode = path.with_name(partial), mode
    try:
        with open(tmp, open_mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if keep_existing:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """`path` holds `text` (UTF-8), written atomically."""
    with atomic_write(path, "w") as f:
        f.write(text)
