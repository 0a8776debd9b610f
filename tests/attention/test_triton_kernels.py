"""The Triton DNAS / HNAS kernels, run on CPU tensors by Triton's interpreter (CI has no GPU).

TRITON_INTERPRET=1 is read when the kernels are first used (`@triton.jit` runs then), so it is
set here at import, before any test runs. bf16 has no arithmetic in the interpreter: the
kernels cast it to float32 after loading there, so these tests use fp32 and fp16.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

pytest.importorskip("triton")

from helpers.kernel_cases import leaf, out_and_grads, padded_problem, reference_out
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.attention import attend, paths
from attnlab.attention.functional import route
from attnlab.attention.kernels import dropout
from attnlab.attention.kernels import triton_query_normalized as tq
from attnlab.attention.reference import masked_logits

# (S_q, S_k, d, u, dtype); u None = DNAS. Every case has key and query padding, a batch item
# whose rows have no key and one whose columns have no query (kernel_cases.padded_problem).
CASES = [
    (1, 1, 8, None, torch.float32),
    (5, 5, 16, 0.0, torch.float32),
    (17, 17, 32, 0.3, torch.float32),
    (64, 64, 8, 1.0, torch.float32),
    (64, 17, 16, None, torch.float32),
    (17, 5, 16, None, torch.float16),
    (5, 17, 8, 0.3, torch.float16),
]
TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (4e-3, 3e-2)}  # (out, grads) absolute


def triton_attend(q, k, v, u, kpm, qpm, **kw):
    return tq.query_normalized_attend_triton(q, k, v, u, kpm, qpm, **kw)


@pytest.mark.parametrize(("S_q", "S_k", "d", "u_value", "dtype"), CASES)
def test_forward_c_and_gradients_match_reference(S_q, S_k, d, u_value, dtype):
    q, k, v, u, kpm, qpm = padded_problem(S_q, S_k, d, seed=S_q + 3 * S_k + d)
    u = None if u_value is None else torch.full_like(u, u_value)
    scheme = "dnas" if u is None else "hnas"
    inputs = leaf(q, k, v, dtype=dtype) + ([] if u is None else leaf(u))
    g_out = torch.randn(v.shape[0], v.shape[1], S_q, d)
    got = out_and_grads(lambda: triton_attend(*inputs[:3], inputs[3] if u is not None else None,
                                              kpm, qpm), inputs, g_out)
    ref_inputs = leaf(*inputs, dtype=torch.float64)
    ref = out_and_grads(lambda: reference_out(*ref_inputs[:3], scheme, kpm, qpm, *ref_inputs[3:]),
                        ref_inputs, g_out)
    assert got[0].dtype == dtype
    out_tol, grad_tol = TOL[dtype]
    torch.testing.assert_close(got[0].double(), ref[0], atol=out_tol, rtol=0)
    for a, b in zip(got[1:], ref[1:]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=grad_tol, rtol=0)
    assert (got[0][3] == 0).all() and (got[0][2] == 0).all()  # no query / no key: zeros
    assert (got[0][0, :, qpm[0]] == 0).all()
    # c: logsumexp over valid queries, at the keys of items that have one
    c = tq.column_lse(inputs[0].detach(), inputs[1].detach(), qpm)
    c_ref = torch.logsumexp(masked_logits(ref_inputs[0].detach(), ref_inputs[1].detach(),
                                          None, qpm), dim=-2)
    torch.testing.assert_close(c[:3].double(), c_ref[:3], atol=out_tol, rtol=0)


def test_several_blocks_with_dropout_match_reference(monkeypatch):
    """Tiles of 16 rows: the online softmax and both backward sweeps loop over several blocks."""
    monkeypatch.setattr(tq, "INTERPRET_BLOCK", 16)
    q, k, v, u, kpm, qpm = padded_problem(40, 35, 8, B=1, H=2, seed=1)
    keep = torch.rand(1, 2, 40, 35, generator=torch.Generator().manual_seed(2)) > 0.2
    inputs = leaf(q, k, v, u)
    g_out = torch.randn(1, 2, 40, 8)
    got = out_and_grads(lambda: triton_attend(*inputs, kpm, qpm, dropout_p=0.2, keep_mask=keep),
                        inputs, g_out)
    ref_in = leaf(*inputs, dtype=torch.float64)
    ref = out_and_grads(lambda: reference_out(*ref_in[:3], "hnas", kpm, qpm, ref_in[3], keep, 0.2),
                        ref_in, g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=0)


def test_gradients_agree_with_float64_finite_differences():
    """Each input's gradient along a random direction vs central differences of the float64
    reference (gradcheck-style; the kernels normalize in float32, hence the tolerance)."""
    q, k, v, u, kpm, qpm = padded_problem(9, 7, 8, B=2, H=2, seed=4)
    inputs = leaf(q, k, v, u)
    g_out = torch.randn(2, 2, 9, 8, dtype=torch.float64)
    out = triton_attend(*inputs, kpm, qpm)
    grads = torch.autograd.grad((out.double() * g_out).sum(), inputs)
    base = [t.detach().double() for t in inputs]
    eps = 1e-6
    for i, grad in enumerate(grads):
        direction = torch.randn_like(base[i])

        def loss(step, i=i, direction=direction):
            moved = [t + step * direction if j == i else t for j, t in enumerate(base)]
            return (reference_out(*moved[:3], "hnas", kpm, qpm, moved[3]) * g_out).sum()

        numeric = (loss(eps) - loss(-eps)) / (2 * eps)
        analytic = (grad.double() * direction).sum()
        assert abs(numeric - analytic) <= 2e-5 * (1 + abs(numeric)), (i, numeric, analytic)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_dropout_with_explicit_mask_matches_reference(scheme):
    q, k, v, u, kpm, qpm = padded_problem(17, 13, 8, B=3, seed=5)
    keep = torch.rand(3, 1, 17, 13, generator=torch.Generator().manual_seed(6)) > 0.3
    inputs = leaf(q, k, v) + (leaf(u) if scheme == "hnas" else [])
    uu = inputs[3] if scheme == "hnas" else None
    g_out = torch.randn(3, 1, 17, 8)
    got = out_and_grads(lambda: triton_attend(*inputs[:3], uu, kpm, qpm, dropout_p=0.3,
                                              keep_mask=keep), inputs, g_out)
    ref_in = leaf(*inputs, dtype=torch.float64)
    ref = out_and_grads(lambda: reference_out(*ref_in[:3], scheme, kpm, qpm, *ref_in[3:],
                                              keep=keep, p=0.3), ref_in, g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=0)


def test_counter_dropout_is_the_documented_mask_in_forward_and_backward():
    """The seed's mask is kernels/dropout.py's, and the backward regenerates the same one."""
    q, k, v, u, kpm, qpm = padded_problem(17, 19, 8, B=2, H=2, seed=7)
    inputs = leaf(q, k, v, u)
    g_out = torch.randn(2, 2, 17, 8)
    seed = 2**61 + 12345
    by_seed = out_and_grads(lambda: triton_attend(*inputs, kpm, qpm, dropout_p=0.25, seed=seed),
                            inputs, g_out)
    keep = dropout.keep_mask(seed, (2, 2, 17, 19), 0.25)
    by_mask = out_and_grads(lambda: triton_attend(*inputs, kpm, qpm, dropout_p=0.25,
                                                  keep_mask=keep), inputs, g_out)
    for a, b in zip(by_seed, by_mask):
        assert torch.equal(a, b)


def test_counter_dropout_keep_rate_and_mean():
    """With v = identity the output is the dropped weight matrix itself: about 1 - p of the
    weights survive, scaled by 1/(1-p), so that the mean weight is unchanged."""
    S, p = 64, 0.25
    q, k = (torch.randn(1, 2, S, 8) for _ in range(2))
    v = torch.eye(S).expand(1, 2, S, S)
    dropped = triton_attend(q, k, v, None, None, None, dropout_p=p, seed=11)
    weights = reference_out(q, k, v, "dnas", None, None).float()
    kept = dropped != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.02  # 8192 draws: sigma 0.005
    torch.testing.assert_close(dropped[kept], weights[kept] / (1 - p), atol=1e-5, rtol=1e-4)
    assert abs(dropped.sum().item() / weights.sum().item() - 1) < 0.03
    other = triton_attend(q, k, v, None, None, None, dropout_p=p, seed=12)
    assert not torch.equal(other != 0, kept)  # another seed, another mask


class _TwoLongDims(TorchDispatchMode):
    """Records the shapes of tensors that torch ops produce with two dims of at least `n`."""

    def __init__(self, n):
        super().__init__()
        self.n, self.found, self.seen = n, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen += 1
                if sum(size >= self.n for size in t.shape) >= 2:
                    self.found.append(tuple(t.shape))
        return out


def test_nothing_sequence_by_sequence_is_allocated():
    S_q, S_k = 48, 40
    q, k, v, u, kpm, qpm = padded_problem(S_q, S_k, 8, B=1, seed=8)
    inputs = leaf(q, k, v, u)
    with _TwoLongDims(min(S_q, S_k)) as rec:
        triton_attend(*inputs, kpm, qpm, dropout_p=0.1, seed=3).sum().backward()
    assert rec.seen and not rec.found
    with _TwoLongDims(min(S_q, S_k)) as rec:  # (the probe does see a materialized matrix)
        reference_out(q, k, v, "hnas", kpm, qpm, u)
    assert rec.found


def test_attend_routes_cuda_inputs_to_the_kernels(monkeypatch):
    """With the device check saying cuda, attend runs these kernels (here interpreted)."""
    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    assert route("hnas", "cuda", torch.float32)[0] == "triton"
    q, k, v, u, kpm, qpm = padded_problem(6, 5, 8, B=2, seed=9)
    calls = []
    real = tq.query_normalized_attend_triton

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(tq, "query_normalized_attend_triton", spy)
    out = attend(q, k, v, "hnas", kpm, qpm, u=u)
    assert calls
    torch.testing.assert_close(out.double(), reference_out(q, k, v, "hnas", kpm, qpm, u),
                               atol=1e-5, rtol=0)
