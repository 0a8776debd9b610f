"""Fixtures every test may use; the helpers themselves live in tests/helpers/."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir per test session, so generated datasets are cached across CLI runs."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def one_thread():
    """Torch on one thread: tiny tensors run faster so, above all when the cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
