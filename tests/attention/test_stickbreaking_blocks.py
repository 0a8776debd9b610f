"""Stick-breaking's C++ CPU kernel (kernels/stickbreaking.py, csrc/stickbreaking.cpp): values and
gradients of q, k, v against a float64 statement of the weights written out here, across several
query blocks (S not a multiple of the block or of the vector width), with padding of every kind,
both diagonal conventions, logits large enough that sigmoid saturates; that `attend` runs it on
the CPU; and that forward and backward at S = 2048 allocate nothing of S x S size (peak RSS of a fresh
process: slow)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.kernel_cases import RecordShapes, leaf, padded_problem

from attnlab.attention import attend
from attnlab.attention.kernels import fused
from attnlab.attention.kernels import stickbreaking as sb

pytestmark = pytest.mark.skipif(not fused.load(), reason="the fused CPU kernel did not build")


def stick_weights(q, k, kpm, qpm, attend_current):
    """A_ij = sigmoid(z_ij) prod_{valid k, j < k} (1 - sigmoid(z_ik)) over the valid keys j of
    query i (j < i, or j <= i with attend_current; neither padded), in float64 from the formula:
    the product as exp of a suffix sum of logsigmoid(-z), taken by a triangular matrix."""
    z = (q @ k.transpose(-1, -2)).double() / math.sqrt(q.shape[-1])
    S_q, S_k = z.shape[-2:]
    i = torch.arange(S_q)[:, None]
    j = torch.arange(S_k)[None, :]
    valid = (j <= i) if attend_current else (j < i)
    valid = valid & ~kpm[:, None, None, :] & ~qpm[:, None, :, None]
    log_rest = torch.where(valid, F.logsigmoid(-z), torch.zeros_like(z))
    after = (j.T > j).double()  # after[k, j] = 1 when k > j: sums over the keys nearer the query
    log_a = F.logsigmoid(z) + log_rest @ after
    return torch.where(valid, log_a.exp(), torch.zeros_like(z))


def check_against_formula(S_q, S_k, attend_current, scale, seed, dtype=torch.float64, d=8, H=2,
                          tol=1e-10):
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k, d, B=4, H=H, dtype=torch.float64, seed=seed,
                                          scale=scale)
    g = torch.randn(4, H, S_q, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    q1, k1, v1 = leaf(q, k, v)
    ref = stick_weights(q1, k1, kpm, qpm, attend_current) @ v1
    ref_grads = torch.autograd.grad((ref * g).sum(), (q1, k1, v1))
    q2, k2, v2 = leaf(q, k, v, dtype=dtype)
    out = sb.stickbreaking_attend(q2, k2, v2, kpm, qpm, attend_current)
    assert out.dtype == dtype
    grads = torch.autograd.grad((out * g.to(dtype)).sum(), (q2, k2, v2))
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a.double(), b, atol=tol * max(1.0, b.abs().max().item()), rtol=tol,
                                   msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("S_q,S_k", [(603, 603), (37, 29), (29, 37)])
def test_kernel_equals_the_formula_over_several_blocks_with_padding(S_q, S_k, attend_current):
    """S = 603 in float64 is three query blocks of 256 lanes, the last short and not a multiple of
    the 8-lane vectors; the stick is carried over up to 602 keys per row. S_q != S_k: the causal
    mask is top-left aligned. Batch items: partial padding, none, all keys, all queries."""
    check_against_formula(S_q, S_k, attend_current, scale=1.2, seed=S_q)


@pytest.mark.parametrize("attend_current", [False, True])
def test_saturated_logits(attend_current):
    """|z| ~ 30: sigmoid(z) is 1 or ~1e-13, the stick is used up within a few keys and the later
    weights underflow (flushed to 0); values and gradients still match the formula."""
    scale = math.sqrt(30)  # z = scale^2 q.k / sqrt(d) with unit normal q, k: std 30
    check_against_formula(300, 300, attend_current, scale=scale, seed=5)
    q, k, _, _, _, _ = padded_problem(300, 300, 8, B=1, H=2, dtype=torch.float64, seed=5, scale=scale)
    z = q @ k.transpose(-1, -2) / math.sqrt(8)
    assert z.abs().median() > 15 and z.abs().max() > 60  # the regime the test is about


def test_float32_kernel_against_the_float64_formula():
    """The kernel in float32 (exp with ~1e-6 error, linear-space stick) stays within float32
    tolerances of the float64 formula, values and gradients, at S = 520 (three blocks)."""
    check_against_formula(520, 520, False, scale=1.0, seed=11, dtype=torch.float32, d=16, tol=2e-5)


def test_attend_runs_the_kernel_on_the_cpu(monkeypatch):
    """`attend` past one block runs the C++ op (not the query-block fallback) in float32 and
    float64, and equals the scheme's own materialized reference (`attention_weights`)."""
    from attnlab.attention import attention_weights
    ran = []
    real = sb._forward
    monkeypatch.setattr(sb, "_forward", lambda *a: ran.append(a[0].dtype) or real(*a))
    monkeypatch.setattr(sb, "query_blocks_attend", lambda *a, **kw: pytest.fail("fallback ran"))
    q, k, v, _, kpm, qpm = padded_problem(200, 200, 8, B=4, H=2, dtype=torch.float64, seed=2)
    out = attend(q, k, v, "stickbreaking", kpm, qpm, causal=True, attend_current=True)
    ref = attention_weights(q, k, "stickbreaking", kpm, qpm, causal=True, attend_current=True) @ v
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    out32 = attend(q.float(), k.float(), v.float(), "stickbreaking", kpm, qpm, causal=True)
    assert ran == [torch.float64, torch.float32] and out32.dtype == torch.float32


def test_no_grad_and_a_non_contiguous_output_gradient():
    """Without autograd the op returns the same values; a transposed (non-contiguous) upstream
    gradient gives the same gradients as its contiguous copy."""
    q, k, v, _, kpm, qpm = padded_problem(70, 70, 8, B=2, H=3, dtype=torch.float64, seed=4)
    with torch.no_grad():
        plain = sb.stickbreaking_attend(q, k, v, kpm, qpm)
    q1, k1, v1 = leaf(q, k, v)
    out = sb.stickbreaking_attend(q1, k1, v1, kpm, qpm)
    torch.testing.assert_close(out.detach(), plain, atol=0, rtol=0)
    g = torch.randn(2, 70, 3, 8, dtype=torch.float64).transpose(1, 2)
    a = torch.autograd.grad(out, (q1, k1, v1), g, retain_graph=True)
    b = torch.autograd.grad(out, (q1, k1, v1), g.contiguous())
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_no_op_makes_an_s_by_s_tensor_and_autograd_keeps_o_s():
    """Forward and backward at S = 2048: the largest tensor any op makes is an input's size (the
    kernel's blocks live inside the C++ op), and autograd saves O(S d) for the backward."""
    S, d = 2048, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, S, d, generator=g).requires_grad_() for _ in range(3))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with RecordShapes() as rec:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = attend(q, k, v, "stickbreaking", causal=True)
        out.square().sum().backward()
    assert rec.largest <= 2 * S * d and sum(saved) <= 8 * 2 * S * d
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


# Peak RSS of this process's memory (VmHWM), not ru_maxrss: a child forked from a large pytest
# process inherits the parent's ru_maxrss across exec.
PEAK_SCRIPT = textwrap.dedent("""
    import torch
    from attnlab.attention import attend
    from attnlab.attention.kernels import fused
    torch.set_num_threads(1)
    B, H, S, d = 1, 1, {S}, 64
    def run(S):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, S, d, generator=g, requires_grad=True) for _ in range(3))
        out = attend(q, k, v, "stickbreaking", causal=True)
        out.backward(torch.ones_like(out))
        assert torch.isfinite(q.grad).all()
    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
    assert fused.load()
    run(256)  # libraries loaded, first-call allocations made
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM restarts from the current RSS
    before = status("VmRSS:")
    run(S)
    print(status("VmHWM:") - before)
""")


@pytest.mark.slow  # a fresh process: ~20 s of imports on the shared machine
def test_forward_and_backward_at_s2048_hold_no_s_by_s_tensor():
    """In a fresh process, forward + backward at S = 2048 (one head, one thread) raise the peak
    RSS by less than one S x S float32 map (16 MiB): inputs, output, gradients (0.5 MiB each) and
    the kernel's two (256 x S) buffers (2 MiB each) only."""
    S = 2048
    src = Path(sb.__file__).resolve().parents[3]  # this checkout's src, as under pytest
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT.format(S=S)], check=False,
                          capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    grown = int(proc.stdout.split()[-1])
    assert grown < S * S * 4, f"peak RSS grew by {grown / 2**20:.1f} MiB"
