"""Property tests of every attention path at sequence lengths up to 512 (beyond the kernels'
block sizes), with scores up to ~1e8: outputs and gradients finite, padded rows zero, and equal
to the reference wherever the scores are moderate.

Paths: ATen / SDPA flash (unas), SDPA math (unas with dropout without the C++ kernel), the fused
C++ kernel (unas with dropout or huge scores, dnas, hnas; dropout), the composed flash fallback
(dnas, hnas), the reference (sinkhorn), and the Triton kernels (interpreted: CPU tensors).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from helpers.kernel_cases import leaf, reference_out
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attnlab.attention import attend
from attnlab.attention.kernels import dropout, fused, sdpa

LENGTHS = [1, 7, 63, 64, 65, 127, 128, 129, 300, 512]


def build_problem(B, S_q, S_k, d, magnitude, key_rates, query_rates, seed, dropout_p):
    g = torch.Generator().manual_seed(seed)
    kpm = torch.stack([torch.rand(S_k, generator=g) < rate for rate in key_rates])
    qpm = torch.stack([torch.rand(S_q, generator=g) < rate for rate in query_rates])
    q = torch.randn(B, 1, S_q, d, generator=g) * magnitude
    k = torch.randn(B, 1, S_k, d, generator=g) * magnitude
    v = torch.randn(B, 1, S_k, d, generator=g)
    u = torch.rand(1, 1, 1, 1, generator=g)
    return {"q": q, "k": k, "v": v, "u": u, "kpm": kpm, "qpm": qpm, "magnitude": magnitude,
            "dropout_p": dropout_p}


@st.composite
def problems(draw, lengths=LENGTHS):
    B = draw(st.integers(1, 2))
    rates = st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=B, max_size=B)  # 1.0: all padded
    return build_problem(
        B, draw(st.sampled_from(lengths)), draw(st.sampled_from(lengths)),
        draw(st.sampled_from([8, 16])),
        draw(st.sampled_from([1.0, 10.0, 1e4])),  # of q and k entries: |s| up to ~1e8
        draw(rates), draw(rates), draw(st.integers(0, 2**16)), draw(st.sampled_from([0.0, 0.1])),
    )


# Where ATen's CPU flash kernel alone gives non-finite gradients (unas must not run there).
HUGE_SCORES = build_problem(1, 512, 512, 8, 1e4, [0.0], [0.0], 0, 0.0)
# Found by the random search: the kernels' column pass rounds the scores (~1e8) differently from
# the row pass, so s - c reached +96 and the row LSE +128 with e^128 = inf in the DNAS backward:
# NaN gradients, until the kernels clamped s - c at its exact bound 0.
ROUNDING_GAP = build_problem(2, 128, 512, 8, 1e4, [0.0, 0.0], [0.0, 0.0], 158, 0.0)


def check(p, scheme, run, n_iter=1, regenerate_mask=True):
    """run(q, k, v, u) under torch.manual_seed(0); finite, zero padded rows, and equal to the
    reference at moderate scores (with dropout: given the mask the seed regenerates)."""
    q, k, v, u = leaf(p["q"], p["k"], p["v"], p["u"])
    torch.manual_seed(0)
    out = run(q, k, v, u)
    out.square().sum().backward()
    assert torch.isfinite(out).all()
    for t in (q, k, v, u):
        assert t.grad is None or torch.isfinite(t.grad).all()
    assert (out[p["qpm"][:, None, :, None].expand_as(out)] == 0).all()
    assert (out[p["kpm"].all(-1)] == 0).all()
    if p["magnitude"] > 10 or (p["dropout_p"] > 0 and not regenerate_mask):
        return
    keep = None
    if p["dropout_p"] > 0:
        torch.manual_seed(0)
        keep = dropout.keep_mask(dropout.draw_seed(), tuple(out.shape[:3]) + (k.shape[2],),
                                 p["dropout_p"])
    ref = reference_out(p["q"], p["k"], p["v"], scheme, p["kpm"], p["qpm"], p["u"], keep,
                        p["dropout_p"], n_iter)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)


# derandomize: CI runs the same examples every time (a failure found by a random search
# becomes an @example, as ROUNDING_GAP did)
@settings(max_examples=12, deadline=None, derandomize=True)
@given(problems())
@example(HUGE_SCORES)
@example(ROUNDING_GAP)
def test_cpu_paths(p):
    kpm, qpm, drop = p["kpm"], p["qpm"], p["dropout_p"]
    for scheme in ("unas", "dnas", "hnas"):  # flash / fused C++ (by dropout and magnitude)
        check(p, scheme, lambda q, k, v, u, s=scheme: attend(q, k, v, s, kpm, qpm, u=u,
                                                             dropout_p=drop))
    with mock.patch.object(fused, "load", lambda: False):  # without a C++ compiler
        for scheme in ("dnas", "hnas"):  # composed (dropout: the reference, same counter mask)
            check(p, scheme, lambda q, k, v, u, s=scheme: attend(q, k, v, s, kpm, qpm, u=u,
                                                                 dropout_p=drop))
    check(p, "unas", lambda q, k, v, u: sdpa.unas_sdpa_math(q, k, v, kpm, qpm, dropout_p=drop),
          regenerate_mask=False)
    check(p, "sinkhorn", lambda q, k, v, u: attend(q, k, v, "sinkhorn", kpm, qpm, n_iter=2,
                                                   dropout_p=drop),
          n_iter=2)


@settings(max_examples=4, deadline=None, derandomize=True)
@given(problems(lengths=[65, 129, 300, 512]))
@example(ROUNDING_GAP)
def test_triton_paths(p):
    pytest.importorskip("triton")
    from attnlab.attention.kernels import triton_ops
    from attnlab.attention.kernels import triton_query_normalized as tq

    kpm, qpm, drop = p["kpm"], p["qpm"], p["dropout_p"]
    with mock.patch.object(tq, "INTERPRET_BLOCK", 256):  # few tiles: the interpreter is slow
        check(p, "dnas", lambda q, k, v, u: triton_ops.query_normalized_attend_triton(
            q, k, v, None, kpm, qpm, dropout_p=drop))
        check(p, "hnas", lambda q, k, v, u: triton_ops.query_normalized_attend_triton(
            q, k, v, u, kpm, qpm, dropout_p=drop))
