"""attnlab.files.atomic_write: the one atomic write (checkpoints, metrics.json, caches, data)."""

import os
import stat

import pytest

from attnlab.files import atomic_write, atomic_write_text


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "metrics.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two" and os.listdir(path.parent) == ["metrics.json"]
    # permissions as a plain write gives them (the umask), not a temporary file's 0600
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    with atomic_write(tmp_path / "data.bin") as f:
        f.write(b"\0\1")
    assert (tmp_path / "data.bin").read_bytes() == b"\0\1"


def test_an_error_keeps_the_previous_file_and_removes_the_temporary_one(tmp_path):
    path = tmp_path / "cache.npz"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_write(path) as f:
        f.write(b"half")
        raise RuntimeError("killed")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["cache.npz"]
    with pytest.raises(ValueError, match="use 'w'"), atomic_write(path, "a"):
        pass


def test_a_fixed_partial_name_and_first_writer_wins(tmp_path):
    path = tmp_path / "last.ckpt"
    with atomic_write(path, partial=".last.ckpt.partial") as f:
        f.write(b"x")
        assert (tmp_path / ".last.ckpt.partial").is_file()  # where the data go until the rename
    assert path.read_bytes() == b"x" and not (tmp_path / ".last.ckpt.partial").exists()
    run = tmp_path / "wandb_run.json"
    for text in ("first", "second"):
        with atomic_write(run, "w", keep_existing=True) as f:
            f.write(text)
    assert run.read_text() == "first" and sorted(os.listdir(tmp_path)) == ["last.ckpt", "wandb_run.json"]
