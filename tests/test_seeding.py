"""tests/conftest.py seeds torch, numpy and random for every test from the test's own id, so a test
that draws from the global generators gets the same inputs whatever ran before it (xdist
spreads files over workers in no fixed order)."""

import random

import numpy as np
import torch
from conftest import seed_rngs


def test_a_test_starts_from_the_seed_of_its_own_id(request):
    drawn = torch.rand(3), np.random.rand(3), random.random()
    seed_rngs(request.node.nodeid)
    assert torch.equal(drawn[0], torch.rand(3))
    assert np.array_equal(drawn[1], np.random.rand(3))
    assert drawn[2] == random.random()


def test_tests_get_different_seeds(request):
    assert seed_rngs(request.node.nodeid) != seed_rngs(request.node.nodeid + "[other]")
