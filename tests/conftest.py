"""Fixtures every test may use; the helpers themselves live in tests/helpers/."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

# Two xdist workers share two cores: torch in each (and in each CLI process a test starts) on one
# thread. With a thread per core each, they oversubscribe the cores, and the suite took 1.5x as
# long (tests/attention + tests/tasks: 2 min 59 s -> 1 min 55 s). Set before torch is imported;
# an OMP_NUM_THREADS the user gives wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch

# every test's global random generators start from this seed mixed with the test's id
SEED = 20240601


# the folders of the long tests (real runs through the CLI, the launcher): started first, so that
# the two workers do not end with one of them running a long file alone
LONG_FIRST = ("tests/e2e/", "tests/study/")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))  # stable: else as collected


def pytest_sessionstart(session):
    from helpers import measured_run

    measured_run.session_started()


def pytest_sessionfinish(session, exitstatus):
    """A whole default run records its figures (tests/helpers/measured_run.py)."""
    from helpers import measured_run

    measured_run.session_finished(session)


def seed_rngs(key: str) -> int:
    """Seed torch, numpy and random from SEED and `key` (a test's or a module's id): fixed, and
    not the leftover state of whatever ran before on the same xdist worker."""
    seed = (SEED + zlib.crc32(key.encode())) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


@pytest.fixture(autouse=True, scope="module")
def seeded_module_rngs(request):
    """Module-scoped fixtures that draw random inputs see the same state in any test order."""
    return seed_rngs(request.node.nodeid)


@pytest.fixture(autouse=True)
def seeded_rngs(request, seeded_module_rngs):
    """Tests that draw from the global generators (torch.randn, np.random.*, random.*) get the
    same inputs whatever ran before them: the seed is their own id's."""
    return seed_rngs(request.node.nodeid)


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
