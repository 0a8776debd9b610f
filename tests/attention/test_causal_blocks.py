"""The causal row-wise CPU kernel (csrc/rowwise.cpp) skips the blocks above the diagonal: the
forward computes a block of rows [i0, i1) against the keys j < i1 only, the backward a block of
keys [j0, j1) against the queries i >= j0 only. Outputs and gradients of sigmoid, the sink and
softpick against a float64 materialized reference written here (masked pairs excluded: the
formulas), at lengths that span several blocks (256 rows / keys per block in float64 at these
widths), none a multiple of the block, with S_q != S_k both ways, key and query padding, and
dropout (the counter-based keep mask of (i, j): skipping must not shift it).

S_q > S_k puts whole query blocks past the last key (top-left alignment: they see every key) and
S_q < S_k whole key blocks past the last query (no query sees them: dk = dv = 0 there), so a
skip bound one block or one key off changes some output or gradient."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention.kernels import fused, rowwise

pytestmark = pytest.mark.skipif(not fused.load(), reason="the fused CPU kernel did not build")

F64 = torch.float64
B, H, D = 2, 2, 8
SINK_B = torch.tensor([0.5, -1.0], dtype=F64).view(1, H, 1, 1)
EPS = 0.3  # softpick's eps, large enough that its gradient through the row max shows
# (S_q, S_k): across blocks of 256 (float64), the last block partial; square, taller, wider
SHAPES = [(600, 600), (700, 530), (530, 700)]


def valid_pairs(s_q, s_k, kpm, qpm):
    """(B, 1, S_q, S_k) bool: key j <= query i (top-left), neither padded."""
    valid = torch.ones(s_q, s_k, dtype=torch.bool).tril()[None, None]
    valid = valid & ~kpm[:, None, None, :]
    return valid & ~qpm[:, None, :, None]


def reference(kind, q, k, v, kpm, qpm, keep=None, p=0.0):
    """The schemes' formulas in float64, materialized; a row without a valid key is 0."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    valid = valid_pairs(q.shape[-2], k.shape[-2], kpm, qpm)
    zero = torch.zeros_like(s)
    s0 = torch.where(valid, s, zero)
    if kind == "sigmoid":  # bias -log n_i, n_i = the valid keys of row i
        n = valid.sum(-1, keepdim=True).clamp(min=1).to(F64)
        w = torch.where(valid, torch.sigmoid(s0 - torch.log(n)), zero)
    elif kind == "sink":  # exp(s) / (exp(b) + sum exp(s))
        logits = torch.where(valid, s, torch.full_like(s, -math.inf))
        r = torch.logsumexp(torch.cat([logits, SINK_B.expand(*s.shape[:-1], 1)], -1), -1, keepdim=True)
        w = torch.where(valid, torch.exp(s0 - r), zero)
    else:  # softpick, shift c = max(row max, 0)
        m = torch.where(valid, s, torch.full_like(s, -math.inf)).amax(-1, keepdim=True)
        c = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).clamp(min=0)
        a = torch.exp(s0 - c) - torch.exp(-c)
        w = torch.where(valid, torch.relu(a), zero) / (torch.where(valid, a.abs(), zero).sum(-1, keepdim=True) + EPS)
    if keep is not None:
        w = w * keep / (1 - p)
    return w @ v


def fused_attend(kind, q, k, v, kpm, qpm, **kw):
    if kind == "sigmoid":
        return rowwise.sigmoid_attend(q, k, v, "log_n", None, kpm, qpm, causal=True, **kw)
    if kind == "sink":
        return rowwise.sink_attend(q, k, v, SINK_B, kpm, qpm, causal=True, **kw)
    return rowwise.softpick_attend(q, k, v, EPS, kpm, qpm, causal=True, **kw)


def problem(s_q, s_k, seed):
    g = torch.Generator().manual_seed(seed)
    q = 1.5 * torch.randn(B, H, s_q, D, generator=g, dtype=F64)
    k = 1.5 * torch.randn(B, H, s_k, D, generator=g, dtype=F64)
    v = torch.randn(B, H, s_k, D, generator=g, dtype=F64)
    gout = torch.randn(B, H, s_q, D, generator=g, dtype=F64)
    # item 1: its keys from 300 on and its queries from 500 on padded (item 0: none), so padded
    # keys lie in every block past the first and padded queries in the last row blocks
    kpm = torch.zeros(B, s_k, dtype=torch.bool)
    kpm[1, 300:] = True
    kpm[1, 17] = True
    qpm = torch.zeros(B, s_q, dtype=torch.bool)
    qpm[1, 500:] = True
    return q, k, v, gout, kpm, qpm


def outputs_and_grads(fn, q, k, v, gout):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad((out * gout).sum(), leaves)]


def assert_same(got, want):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kind", ["sigmoid", "sink", "softpick"])
def test_causal_blocks_match_the_materialized_reference(kind, shape):
    q, k, v, gout, kpm, qpm = problem(*shape, seed=sum(shape))
    got = outputs_and_grads(lambda *t: fused_attend(kind, *t, kpm, qpm), q, k, v, gout)
    want = outputs_and_grads(lambda *t: reference(kind, *t, kpm, qpm), q, k, v, gout)
    assert_same(got, want)
    s_q, s_k = shape
    if s_k > s_q:  # keys no query sees (a whole skipped block of them): no gradient
        assert got[2][..., s_q:, :].abs().max() == 0 and got[3][..., s_q:, :].abs().max() == 0
    # the rows past the last key see every key: they are not all 0 (nothing skipped them)
    assert got[0][0, :, s_k:].abs().amin(-1).gt(0).all()


@pytest.mark.parametrize("kind", ["sigmoid", "sink", "softpick"])
def test_causal_blocks_keep_the_dropout_mask_of_each_pair(kind):
    """With dropout the kernel's keep mask (from its seed) is that of (b, h, i, j) whatever
    blocks are skipped: an explicit keep mask and the counter-based one give the reference."""
    s_q, s_k, p = 700, 530, 0.2
    q, k, v, gout, kpm, qpm = problem(s_q, s_k, seed=5)
    keep = torch.rand(B, H, s_q, s_k, generator=torch.Generator().manual_seed(1)) >= p
    got = outputs_and_grads(lambda *t: fused_attend(kind, *t, kpm, qpm, dropout_p=p, keep_mask=keep),
                            q, k, v, gout)
    want = outputs_and_grads(lambda *t: reference(kind, *t, kpm, qpm, keep.to(F64), p), q, k, v, gout)
    assert_same(got, want)

    from attnlab.attention.kernels import dropout  # the counter-based mask of a seed, in torch

    seed = 123456789
    counter = dropout.keep_mask(seed, (B, H, s_q, s_k), p, q.device)
    got = outputs_and_grads(lambda *t: fused_attend(kind, *t, kpm, qpm, dropout_p=p, seed=seed),
                            q, k, v, gout)
    want = outputs_and_grads(lambda *t: reference(kind, *t, kpm, qpm, counter.to(F64), p), q, k, v, gout)
    assert_same(got, want)
