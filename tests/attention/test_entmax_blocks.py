"""Entmax attention by strips of query rows (kernels/entmax_blocks.py, path "blocked") against the
materialized reference, which computes the weights with the `entmax` package (sort-based
entmax15 / sparsemax, bisection for other alpha): outputs and q / k / v gradients in float64,
with padding, causal masks, several strips and a last partial one, single-key supports and ties;
that no S x S map is allocated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers.paths import ROOT

from attnlab.attention import attend
from attnlab.attention.functional import candidates, normalizer, reference_attend, route
from attnlab.attention.kernels import entmax_blocks
from attnlab.attention.kernels.entmax_blocks import entmax_attend, strips

F64 = torch.float64
ALPHAS = [1.5, 2.0, 1.25]
# 16 rows a strip (MIN_ROWS) and S = 37: three strips of each head, the last one partial
SMALL_BLOCKS = 16 * 37


def problem(S=37, B=2, H=3, d=8, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, d, generator=g, dtype=dtype) for _ in range(3))
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[0, :2] = True  # the first keys: causal rows 0 and 1 of batch 0 have no valid key
    kpm[1, 30:] = True
    qpm = torch.zeros(B, S, dtype=torch.bool)
    qpm[1, 33:] = True
    return q, k, v, kpm, qpm


def grads(out, tensors, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, tensors, g)


def reference(q, k, v, alpha, kpm, qpm, causal, dropout_p=0.0):
    return reference_attend(q, k, v, "entmax", kpm, qpm, causal, dropout_p, alpha=alpha)


def assert_matches_reference(q, k, v, alpha, kpm=None, qpm=None, causal=False, **kernel):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = entmax_attend(*leaves, alpha, kpm, qpm, causal, **kernel)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = reference(*ref_leaves, alpha, kpm, qpm, causal)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-9)
    for got, want in zip(grads(out, leaves), grads(ref, ref_leaves), strict=True):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-8)
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_outputs_and_gradients_equal_the_entmax_package_in_float64(alpha, causal):
    q, k, v, kpm, qpm = problem()
    q = q * 3  # spread scores: sparse rows, supports of every size
    out = assert_matches_reference(q, k, v, alpha, kpm, qpm, causal, block_elements=SMALL_BLOCKS)
    # a padded query, and a causal row whose only keys are padded, give 0
    assert torch.equal(out[1, :, 33:], torch.zeros_like(out[1, :, 33:]))
    if causal:
        assert torch.equal(out[0, :, :2], torch.zeros_like(out[0, :, :2]))


def test_strips_cover_every_row_once_and_causal_strips_see_no_later_key():
    """S = 37 in strips of 16 rows: 16 + 16 + 5, every head; causal strips end their keys at
    their last row, others see all 37."""
    for causal in (False, True):
        seen = torch.zeros(3, 37, dtype=torch.int64)
        for heads, i0, i1, keys in strips(3, 37, 37, causal, SMALL_BLOCKS):
            seen[heads, i0:i1] += 1
            assert keys == (i1 if causal else 37)
            assert (heads.stop - heads.start) * (i1 - i0) * 37 <= SMALL_BLOCKS
        assert torch.equal(seen, torch.ones_like(seen))
    # short sequences: several heads a strip, within the budget
    assert [(h.start, h.stop) for h, *_ in strips(8, 4, 4, False, 64)] == [(0, 4), (4, 8)]


@pytest.mark.parametrize("alpha", ALPHAS)
def test_weights_sum_to_one_per_valid_row_and_equal_the_reference_weights(alpha):
    """With v = the identity over keys, the output row i is the weight row p_i itself."""
    q, k, _, kpm, qpm = problem(seed=2)
    S = q.shape[-2]
    eye = torch.eye(S, dtype=F64).expand(2, 3, S, S)
    for causal in (False, True):
        w = entmax_attend(q * 3, k, eye, alpha, kpm, qpm, causal, block_elements=SMALL_BLOCKS)
        norm, _ = normalizer("entmax", alpha=alpha)
        ref = norm.attention_weights(q * 3, k, kpm, qpm, causal)
        torch.testing.assert_close(w, ref, atol=1e-12, rtol=0)
        sums = w.sum(-1)
        valid = ref.sum(-1) > 0.5
        torch.testing.assert_close(sums[valid], torch.ones_like(sums[valid]), atol=1e-12, rtol=0)
        assert torch.equal(sums[~valid], torch.zeros_like(sums[~valid]))
        assert (w == 0).any()  # sparse: some valid keys get exactly 0


@pytest.mark.parametrize("alpha", ALPHAS)
def test_single_key_supports_and_ties(alpha):
    """Rows whose support is one key (a key far above the others: weight exactly 1), rows of ties
    (q = 0: every valid score equal, uniform weights), and their gradients."""
    q, k, v, kpm, _ = problem(S=20, H=2, seed=3)
    k[:, :, 5] = 20 * q[:, :, 7] / q[:, :, 7].norm(dim=-1, keepdim=True)  # row 7: key 5 dominates
    q[:, :, 3] = 0.0  # row 3: all scores 0, ties
    for causal in (False, True):
        out = assert_matches_reference(q, k, v, alpha, kpm, None, causal, block_elements=16 * 20)
        torch.testing.assert_close(out[:, :, 7], v[:, :, 5], atol=1e-12, rtol=0)
        valid = ~kpm[:, :4, None] if causal else ~kpm[:, :, None]
        keys = v[:, :, :4] if causal else v
        uniform = (keys * valid[:, None]).sum(-2) / valid.sum(-2)[:, None]
        torch.testing.assert_close(out[:, :, 3], uniform, atol=1e-12, rtol=0)


def test_alpha_above_two_and_a_ragged_query_key_shape():
    """alpha > 2 (Newton from the other end of the bracket) and S_q != S_k, causal top-left."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, s, 8, generator=g, dtype=F64) for s in (19, 26, 26))
    for causal in (False, True):
        ref = reference(q, k, v, 3.0, None, None, causal)
        out = entmax_attend(q, k, v, 3.0, causal=causal, block_elements=16 * 26)
        torch.testing.assert_close(out, ref, atol=1e-9, rtol=0)  # the package bisects 50 times


def test_float32_matches_the_float64_reference():
    q, k, v, kpm, qpm = problem(S=70, seed=5, dtype=torch.float32)
    for alpha in ALPHAS:
        out = entmax_attend(3 * q, k, v, alpha, kpm, qpm, True)
        ref = reference(3 * q.double(), k.double(), v.double(), alpha, kpm, qpm, True)
        torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)


def test_dropout_drops_the_weights_the_reference_drops():
    """The same torch seed: the strips regenerate the reference's counter-based keep mask."""
    q, k, v, kpm, qpm = problem(seed=6)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(0)
    out = entmax_attend(*leaves, 1.5, kpm, qpm, True, dropout_p=0.3, block_elements=SMALL_BLOCKS)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(0)
    ref = reference(*ref_leaves, 1.5, kpm, qpm, True, dropout_p=0.3)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert not torch.allclose(out, reference(q, k, v, 1.5, kpm, qpm, True))  # something dropped
    for got, want in zip(grads(out, leaves), grads(ref, ref_leaves), strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_attend_routes_cpu_calls_to_the_strips():
    q, k, v, kpm, qpm = problem(dtype=torch.float32)
    assert route(q, k, v, "entmax", kpm, qpm, True) == "blocked"
    assert candidates("entmax", "cpu", torch.float32, 0.1, True) == ["blocked", "reference"]
    # dropout 1 drops every weight: the reference's zeros
    assert route(q, k, v, "entmax", dropout_p=1.0) == "reference"
    assert candidates("entmax", "cuda", torch.bfloat16) == ["reference"]
    out = attend(q, k, v, "entmax", kpm, qpm, True, alpha=2)
    torch.testing.assert_close(out, reference(q, k, v, 2.0, kpm, qpm, True), atol=2e-6, rtol=0)


def test_the_threshold_search_stops_early_and_within_its_cap(monkeypatch):
    """Newton converges in a few steps (sparsemax: the exact support iteration), not the cap;
    a cap of 1 step still returns finite weights in the bracket."""
    steps = []
    real = entmax_blocks._slopes
    monkeypatch.setattr(entmax_blocks, "_slopes", lambda c, a: steps.append(1) or real(c, a))
    q, k, v, *_ = problem(S=64, H=1, seed=7, dtype=torch.float32)
    for alpha in ALPHAS:
        steps.clear()
        with torch.no_grad():
            entmax_attend(3 * q, k, v, alpha)
        assert 2 <= len(steps) <= 12, (alpha, len(steps))
    out = entmax_attend(3 * q, k, v, 1.5, n_iter=1)
    assert torch.isfinite(out).all()


MEMORY_SCRIPT = """
import json, resource, sys, torch
from attnlab.attention.functional import attend, reference_attend
torch.set_num_threads(1)
S, run = int(sys.argv[1]), {"blocked": attend, "reference": reference_attend}[sys.argv[2]]
q, k, v = (torch.randn(1, 4, S, 32, requires_grad=True) for _ in range(3))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(q, k, v, "entmax", causal=True).sum().backward()
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024))
"""


@pytest.mark.slow
def test_forward_and_backward_at_2048_allocate_no_s_by_s_map():
    """Peak RSS growth of fwd+bwd at S = 2,048 (B=1, H=4, d=32, causal) in a fresh process: the
    strips stay under one head's S x S float32 map (16 MiB); the materialized reference, measured
    the same way, takes several (the measurement sees a map where there is one)."""
    def peak(mode):
        done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, "2048", mode], capture_output=True,
                              text=True, check=True, cwd=ROOT,
                              env={"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": ""})
        return json.loads(done.stdout.strip().splitlines()[-1])

    one_map = 2048 * 2048 * 4
    assert peak("blocked") < one_map
    assert peak("reference") > 4 * one_map
