"""The Triton DNAS / HNAS kernels against the float64 reference, compiled on a GPU and
interpreted on the CPU: one module, so that the GPU checks cannot rot on machines without one.

Every test takes a `device`: "cuda" cases carry the `gpu` marker (excluded from `make test`, run
by `make test-gpu` in a fresh process without TRITON_INTERPRET, skipped without CUDA) and use
real shapes (S up to 4,097, d 52 / 64 / 128, d_v != d, bf16 / fp16 / fp32); "cpu" cases run the
same code on small shapes under Triton's interpreter (which CPU tensors always get), in the
default suite. `LAUNCHES` proves which kernels ran: compiled on CUDA, interpreted on the CPU,
never the reference (the kernels are called directly).

Tolerances are anchored to SDPA: on the same inputs, UNAS through SDPA (flash / memory-efficient
on CUDA) is compared with its float64 reference, and the kernels may err by `MULTIPLE` times
SDPA's own relative error (or the dtype's rounding, where SDPA happens to be closer): 4x for the
output, 8x for the gradients (the backward rounds more products to the input dtype than
flash's: the DNAS weights in dc's sum, exp(t) in dS). The matrix runs the default backward (dQ by
atomics); the dropout and bitwise tests run the deterministic one. Not yet run on a GPU: widen
with care.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

pytest.importorskip("triton")

from helpers.kernel_cases import leaf, out_and_grads, padded_problem, reference_out

from attnlab.attention.kernels import dropout, sdpa, triton_ops
from attnlab.attention.kernels import triton_query_normalized as tq

HAS_CUDA = torch.cuda.is_available()
GPU = [pytest.mark.gpu,
       pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: `make test-gpu` on one")]
MULTIPLE = {"out": 4.0, "dq": 8.0, "dk": 8.0, "dv": 8.0, "du": 8.0}
# relative error any kernel may have whatever SDPA's: the dtype's unit roundoff (x2 for fp32,
# whose float32 sums run in another order than the float64 reference's)
ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-22}
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


DTYPE_IDS = {BF16: "bf16", FP16: "fp16", FP32: "fp32"}


def case(device, *values):
    """One parametrization; its id names the dtype (`make gpu-check` deselects "fp16", "fp32"
    by default: a full-precision Triton compile takes 16-75 s)."""
    return pytest.param(device, *values, marks=GPU if device == "cuda" else (),
                        id="-".join(DTYPE_IDS.get(x, str(x)) for x in (device, *values)))


# (device, scheme, S, d, d_v, dtype): S_q = S_k = S
MATRIX = [
    case("cpu", "dnas", 17, 16, 24, BF16),
    case("cpu", "hnas", 17, 8, 8, FP16),
    case("cpu", "hnas", 1, 8, 12, FP32),
    case("cpu", "dnas", 40, 8, 8, FP32),
]
MATRIX += [case("cuda", scheme, S, d, d_v, BF16) for scheme in ("dnas", "hnas")
           for S in (1, 17, 1000, 1024, 4097) for d, d_v in ((52, 52), (64, 96), (128, 128))]
MATRIX += [case("cuda", scheme, S, d, d_v, dtype) for scheme in ("dnas", "hnas")
           for dtype in (FP16, FP32) for S in (17, 1024) for d, d_v in ((64, 64), (128, 40))]


@pytest.fixture(autouse=True)
def _compiled_on_cuda(request):
    """The GPU cases must run compiled kernels: TRITON_INTERPRET would interpret them."""
    if "gpu" in request.keywords and os.environ.get("TRITON_INTERPRET", "0") == "1":
        pytest.fail("unset TRITON_INTERPRET: the gpu tests check the compiled kernels "
                    "(make test-gpu runs them without it)")


@contextlib.contextmanager
def deterministic_algorithms(on: bool):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.fixture
def atomic_dq():
    """The default backward (dQ by float atomics), whatever an earlier test left set."""
    with deterministic_algorithms(False):
        yield


@pytest.fixture
def deterministic():
    """torch's deterministic mode: the two-pass backward, dQ without float atomics (which sum
    in the order the programs finish: the default backward's dQ is not bitwise repeatable)."""
    with deterministic_algorithms(True):
        yield


def transposed_views(*tensors):
    """(B, H, S, d) views of (B, S, H, d) memory, as MultiHeadAttention passes its heads."""
    return [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors]


def problem(device, S, d, d_v, dtype, seed=0):
    q, k, v, u, kpm, qpm = padded_problem(S, S, d, d_v=d_v, B=4, H=2, seed=seed)
    q, k, v = transposed_views(*(t.to(device, dtype) for t in (q, k, v)))
    assert not q.is_contiguous() or S == 1
    g = torch.randn(4, 2, S, d_v, generator=torch.Generator().manual_seed(seed + 1))
    return q, k, v, u.to(device), kpm.to(device), qpm.to(device), g.to(device)


def relative_errors(got, ref):
    return [float((a.detach().double() - b.detach()).abs().max()
                  / b.detach().abs().max().clamp_min(1e-30))
            for a, b in zip(got, ref)]


def sdpa_errors(q, k, v, kpm, qpm, g):
    """SDPA's relative errors (out, dq, dk, dv) against the float64 UNAS reference."""
    x = leaf(q, k, v)
    got = out_and_grads(lambda: sdpa.unas_sdpa(*x, kpm, qpm), x, g)
    ref_in = leaf(q, k, v, dtype=torch.float64)
    ref = out_and_grads(lambda: reference_out(*ref_in, "unas", kpm, qpm), ref_in, g)
    return relative_errors(got, ref)


def run_kernels(scheme, q, k, v, u, kpm, qpm, g, **kw):
    """(out, dq, dk, dv[, du]) of the Triton kernels, called directly (never the reference)."""
    x = leaf(q, k, v) + (leaf(u) if scheme == "hnas" else [])
    u_arg = x[3] if scheme == "hnas" else None
    return out_and_grads(lambda: triton_ops.query_normalized_attend_triton(*x[:3], u_arg, kpm, qpm, **kw),
                         x, g)


def reference(scheme, q, k, v, u, kpm, qpm, g, keep=None, p=0.0):
    x = leaf(q, k, v, dtype=torch.float64) + (leaf(u, dtype=torch.float64)
                                               if scheme == "hnas" else [])
    return out_and_grads(lambda: reference_out(*x[:3], scheme, kpm, qpm, *x[3:], keep=keep, p=p),
                         x, g)


def launched(device, before):
    """The launches since `before`: compiled on CUDA, interpreted on the CPU, and no other."""
    kind, other = ("compiled", "interpreted") if device == "cuda" else ("interpreted", "compiled")
    assert tq.LAUNCHES[other] == before[other], f"{other} kernels ran on {device}"
    return tq.LAUNCHES[kind] - before[kind]


@pytest.mark.parametrize(("device", "scheme", "S", "d", "d_v", "dtype"), MATRIX)
def test_outputs_and_gradients_match_float64_within_a_multiple_of_sdpa(device, scheme, S, d,
                                                                      d_v, dtype, atomic_dq):
    q, k, v, u, kpm, qpm, g = problem(device, S, d, d_v, dtype, seed=S + d)
    before = tq.LAUNCHES.copy()
    got = run_kernels(scheme, q, k, v, u, kpm, qpm, g)
    assert launched(device, before) == 4  # column LSE, forward, the two backward kernels
    ref = reference(scheme, q, k, v, u, kpm, qpm, g)
    anchor = sdpa_errors(q, k, v, kpm, qpm, g)
    anchor += [max(anchor[1:])]  # du: as the worst of the other gradients
    assert got[0].dtype == dtype and got[0].shape == (4, 2, S, d_v)
    for name, err, sdpa_err in zip(["out", "dq", "dk", "dv", "du"], relative_errors(got, ref),
                                   anchor):
        allowed = MULTIPLE[name] * max(sdpa_err, ROUNDING[dtype])
        assert err <= allowed, f"{name}: relative error {err:.2e} > {allowed:.2e} (SDPA {sdpa_err:.2e})"
    for t in got:
        assert torch.isfinite(t).all()
    out = got[0]
    assert (out[2] == 0).all() and (out[3] == 0).all()  # rows without keys / no query at all
    assert (out[0][:, qpm[0]] == 0).all()  # padded queries


DROPOUT_CASES = [case("cpu", "hnas", 17, 8, 8, FP32), case("cuda", "hnas", 1000, 64, 64, BF16),
                 case("cuda", "dnas", 1024, 128, 96, FP32)]


@pytest.mark.parametrize(("device", "scheme", "S", "d", "d_v", "dtype"), DROPOUT_CASES)
def test_dropout_by_seed_is_the_documented_mask_and_matches_the_reference(device, scheme, S, d,
                                                                         d_v, dtype,
                                                                         deterministic):
    q, k, v, u, kpm, qpm, g = problem(device, S, d, d_v, dtype, seed=3)
    seed, p = 2**61 + 99, 0.2
    by_seed = run_kernels(scheme, q, k, v, u, kpm, qpm, g, dropout_p=p, seed=seed)
    keep = dropout.keep_mask(seed, (4, 2, S, S), p, device=device)
    by_mask = run_kernels(scheme, q, k, v, u, kpm, qpm, g, dropout_p=p, keep_mask=keep)
    again = run_kernels(scheme, q, k, v, u, kpm, qpm, g, dropout_p=p, seed=seed)
    for a, b in zip(by_seed, again):  # the same call: the same tuned tile, the same bits
        assert torch.equal(a, b)
    # By seed and by mask are two autotuning keys (the key holds every argument's dtype): on
    # CUDA each may get its own tile, so they agree within rounding, not bitwise. Both are held
    # to the reference with the documented mask: another mask would be off by ~p, far beyond.
    ref = reference(scheme, q, k, v, u, kpm, qpm, g, keep=keep, p=p)
    with deterministic_algorithms(False):  # the error without dropout: the matrix's kernels
        no_drop = relative_errors(run_kernels(scheme, q, k, v, u, kpm, qpm, g),
                                  reference(scheme, q, k, v, u, kpm, qpm, g))
    for got in (by_seed, by_mask):
        for err, base in zip(relative_errors(got, ref), no_drop):
            assert err <= 2 * base + ROUNDING[dtype], (err, base)
    if device == "cpu":  # interpreted: one tile size whatever the arguments
        for a, b in zip(by_seed, by_mask):
            assert torch.equal(a, b)


DETERMINISM_CASES = [case("cpu", "hnas", 17, 8, 12, FP32), case("cuda", "hnas", 1024, 64, 64, BF16),
                     case("cuda", "dnas", 4097, 128, 128, BF16)]


@pytest.mark.parametrize(("device", "scheme", "S", "d", "d_v", "dtype"), DETERMINISM_CASES)
def test_two_runs_and_both_layouts_are_bitwise_equal(device, scheme, S, d, d_v, dtype,
                                                     deterministic):
    """Deterministic mode (no atomics): the same inputs give the same bits, whether the heads
    are transposed views (as MultiHeadAttention passes them) or contiguous."""
    q, k, v, u, kpm, qpm, g = problem(device, S, d, d_v, dtype, seed=5)
    first = run_kernels(scheme, q, k, v, u, kpm, qpm, g, dropout_p=0.1, seed=7)
    second = run_kernels(scheme, q, k, v, u, kpm, qpm, g, dropout_p=0.1, seed=7)
    contiguous = run_kernels(scheme, q.contiguous(), k.contiguous(), v.contiguous(), u, kpm, qpm,
                             g, dropout_p=0.1, seed=7)
    for a, b, c in zip(first, second, contiguous):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("device", ["cpu", case("cuda")])
def test_head_dims_over_the_limit_decline(device):
    q = torch.zeros(1, 1, 4, tq.MAX_HEAD_DIM + 1, device=device)
    v = torch.zeros(1, 1, 4, 8, device=device)
    assert triton_ops.query_normalized_attend_triton(q, q, v) is None
    assert triton_ops.query_normalized_attend_triton(v, v, q) is None  # d_v over the limit


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: `make test-gpu` on one")
@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas", "sinkhorn", "entmax", "coda",
                                    "realformer"])
def test_compiled_encoder_runs_every_scheme_without_recompiling(scheme):
    """torch.compile of a small encoder with each scheme: one forward + backward, then the same
    shapes again with recompilation an error; no graph break inside the Triton kernels' code."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from attnlab.attention.layers import TransformerEncoderLayer

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(64, 4, 128, 0.1, scheme).cuda()
    x = torch.randn(2, 33, 64, device="cuda")
    kpm = torch.zeros(2, 33, dtype=torch.bool, device="cuda")
    kpm[0, 20:] = True
    compiled = torch.compile(layer)
    before = tq.LAUNCHES.copy()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        compiled(x, key_padding_mask=kpm).float().square().mean().backward()
        with torch._dynamo.config.patch(error_on_recompile=True):
            compiled(x, key_padding_mask=kpm).float().square().mean().backward()
    if scheme in ("dnas", "hnas"):
        assert tq.LAUNCHES["compiled"] > before["compiled"]
    explain = torch._dynamo.explain(layer)(x, key_padding_mask=kpm)
    in_kernels = [r for r in explain.break_reasons
                  if any("triton_query_normalized" in f.filename or "triton_ops" in f.filename
                         for f in r.user_stack)]
    assert not in_kernels, in_kernels
    print(f"{scheme}: {explain.graph_break_count} graph breaks elsewhere")
