"""The Triton DNAS / HNAS kernels, run on CPU tensors by Triton's interpreter (CI has no GPU).

CPU tensors always run interpreted (no TRITON_INTERPRET needed), CUDA ones compiled: the same
checks on a GPU, and the compiled-kernel matrix, are tests/gpu/test_compiled_kernels.py. bf16
has no arithmetic in the interpreter: the kernels cast it to float32 after loading there, so
these tests use fp32 and fp16.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

pytest.importorskip("triton")

from helpers.kernel_cases import leaf, out_and_grads, padded_problem, reference_out
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.attention import attend, paths
from attnlab.attention.functional import candidates
from attnlab.attention.kernels import dropout, triton_ops
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


@pytest.fixture(params=["deterministic", "atomic_dq"])
def backward(request):
    """Each gradient test runs both backwards: the two-pass one that torch's deterministic mode
    selects, and the one summing dQ by atomics (the default, as for flash attention)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(request.param == "deterministic")
    yield request.param
    torch.use_deterministic_algorithms(before)


def triton_attend(q, k, v, u, kpm, qpm, **kw):
    return triton_ops.query_normalized_attend_triton(q, k, v, u, kpm, qpm, **kw)


@pytest.mark.parametrize(("S_q", "S_k", "d", "u_value", "dtype"), CASES)
def test_forward_c_and_gradients_match_reference(S_q, S_k, d, u_value, dtype, backward):
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
    # c: logsumexp over valid queries (kept in log2 units), at the keys of items that have one
    c = tq.column_lse(inputs[0].detach(), inputs[1].detach(), qpm)
    c_ref = torch.logsumexp(masked_logits(ref_inputs[0].detach(), ref_inputs[1].detach(),
                                          None, qpm), dim=-2)
    torch.testing.assert_close(c[:3].double() * math.log(2), c_ref[:3], atol=out_tol, rtol=0)


def test_several_blocks_with_dropout_match_reference(monkeypatch, backward):
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


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_folded_and_wide_heads_with_seed_dropout_and_d_v_match_reference(monkeypatch, scheme,
                                                                         backward):
    """Every output of the backward (dq, dk, dv, du) against the float64 reference over several
    blocks, d != d_v, dropout by seed, padding (rows and columns with nothing valid), and two
    heads: one whose column LSEs span a few nats (HNAS: Pu = Pd a_i b_j, one exponential) and
    one whose span exceeds FOLD_RANGE (a few keys of large norm: Pu's own exponential)."""
    monkeypatch.setattr(tq, "INTERPRET_BLOCK", 16)
    q, k, v, u, kpm, qpm = padded_problem(20, 18, 8, d_v=12, H=2, seed=14)
    k[:, 1, ::5] *= 40.0  # head 1: scores of ~100 on every 5th key
    c = tq.column_lse(q, k, qpm)
    folds = torch.isfinite(tq.fold_reference(c, kpm).view(4, 2))
    # items 0, 1: head 0 folds, head 1 does not; item 2 has no valid key (no fold), item 3 no
    # valid query (c = 0 everywhere: folds)
    assert folds[:, 0].tolist() == [True, True, False, True] and not folds[:2, 1].any()
    seed, p = 2**40 + 7, 0.2
    keep = dropout.keep_mask(seed, (4, 2, 20, 18), p)
    inputs = leaf(q, k, v) + (leaf(u) if scheme == "hnas" else [])
    uu = inputs[3] if scheme == "hnas" else None
    g_out = torch.randn(4, 2, 20, 12)
    got = out_and_grads(lambda: triton_attend(*inputs[:3], uu, kpm, qpm, dropout_p=p, seed=seed),
                        inputs, g_out)
    ref_in = leaf(*inputs, dtype=torch.float64)
    ref = out_and_grads(lambda: reference_out(*ref_in[:3], scheme, kpm, qpm, *ref_in[3:],
                                              keep=keep, p=p), ref_in, g_out)
    for name, a, b in zip(["out", "dq", "dk", "dv", "du"], got, ref):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, atol=2e-4, rtol=1e-4, msg=name)


def test_offsets_past_2_31_elements_are_computed_in_int64(backward):
    """Heads 2**30 elements apart, so head 2 starts 2**31 elements into its tensor, where int32
    offset arithmetic (h * stride_h, or row * stride_row) wraps to -2**31. q, k and v are views
    of one fp16 buffer of 2**32 elements (8 GiB of address space; only the pages written are
    ever backed by memory); the elements that a wrapped offset would read hold NaN."""
    M, N, d, step, start = 16, 12, 8, 2**30, 2**31
    # deterministic mode would fill the whole buffer (8 GiB written, ~10 s): reserve it unfilled
    fill, torch.utils.deterministic.fill_uninitialized_memory = \
        torch.utils.deterministic.fill_uninitialized_memory, False
    try:
        big = torch.empty(start + 2 * step + (M + 2 * N) * d, dtype=torch.float16)
    except RuntimeError as error:  # an address space this large refused
        pytest.skip(f"cannot reserve 8 GiB of address space: {error}")
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
    big[: (M + 2 * N) * d] = float("nan")

    def heads(offset, rows):
        return big.as_strided((1, 3, rows, d), (3 * step, step, d, 1), start + offset)

    q, k, v = heads(0, M), heads(M * d, N), heads((M + N) * d, N)
    g = torch.Generator().manual_seed(15)
    for t in (q, k, v):
        t.copy_(torch.randn(t.shape, generator=g))
    u = torch.rand(1, 3, 1, 1, generator=g)
    inputs = leaf(q, k, v, u)
    assert inputs[0].stride(1) == step  # the kernels get the views themselves
    g_out = torch.randn(1, 3, M, d, generator=g)
    got = out_and_grads(lambda: triton_attend(*inputs, None, None), inputs, g_out)
    ref_in = leaf(*(t.contiguous() for t in inputs), dtype=torch.float64)
    ref = out_and_grads(lambda: reference_out(*ref_in[:3], "hnas", None, None, ref_in[3]),
                        ref_in, g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=TOL[torch.float16][1], rtol=0)


def test_declines_only_what_32_bit_program_ids_cannot_number():
    """Shapes past 2**31 elements run (offsets are int64); past 2**31 rows of (b, h, i) they
    decline (1-D grid and dropout counter). Meta tensors: nothing is allocated."""
    def qkv(B, H, S, d):
        return [torch.empty(B, H, S, d, device="meta") for _ in range(3)]

    assert tq.declines(*qkv(2, 32, 2**20, 256)) is None  # 2**26 rows, 2**34 elements
    reason = tq.declines(*qkv(4, 32, 2**24, 64))
    assert reason is not None and "2**31" in reason and "rows" in reason


def test_gradients_agree_with_float64_finite_differences(backward):
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
def test_dropout_with_explicit_mask_matches_reference(scheme, backward):
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


def test_counter_dropout_is_the_documented_mask_in_forward_and_backward(backward):
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


@pytest.mark.parametrize(("deterministic", "kernels"), [
    (True, ["column_lse", "forward", "backward_kv", "backward_q"]),
    (False, ["column_lse", "forward", "backward_dv_dc", "backward_dk_dq"]),
])
def test_the_backward_follows_torchs_determinism_setting(monkeypatch, deterministic, kernels):
    """torch.use_deterministic_algorithms (Lightning's trainer.deterministic) keeps dQ free of
    float atomics; otherwise the 2-products-shorter backward with atomic dQ runs."""
    launched = []
    launch = tq._launch
    monkeypatch.setattr(tq, "_launch", lambda name, *a, **kw: (launched.append(name),
                                                                 launch(name, *a, **kw)))
    q, k, v, u, kpm, qpm = padded_problem(9, 7, 8, B=2, H=2, seed=8)
    inputs = leaf(q, k, v, u)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        triton_attend(*inputs, kpm, qpm).sum().backward()
    finally:
        torch.use_deterministic_algorithms(before)
    assert launched == kernels
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in inputs)


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
    assert candidates("hnas", "cuda", torch.float32)[0] == "triton"
    q, k, v, u, kpm, qpm = padded_problem(6, 5, 8, B=2, seed=9)
    calls = []
    real = triton_ops.query_normalized_attend_triton

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(triton_ops, "query_normalized_attend_triton", spy)
    out = attend(q, k, v, "hnas", kpm, qpm, u=u)
    assert calls
    torch.testing.assert_close(out.double(), reference_out(q, k, v, "hnas", kpm, qpm, u),
                               atol=1e-5, rtol=0)


def test_head_dims_over_the_limit_decline_once_and_attend_falls_back(monkeypatch, caplog):
    """d > MAX_HEAD_DIM: the kernels decline (None, one log line per shape) instead of asking
    for tiles past the GPU's registers; attend then runs the reference."""
    d = tq.MAX_HEAD_DIM + 4
    q, k, v, u, kpm, qpm = padded_problem(3, 2, d, d_v=8, B=1, seed=10)
    tq.log_decline.cache_clear()  # once per process: whatever ran before must not have used it
    with caplog.at_level(logging.WARNING, logger=tq.__name__):
        assert triton_attend(q, k, v, u, kpm, qpm) is None
        assert triton_attend(q, k, v, None, kpm, qpm) is None
    declined = [r for r in caplog.records if "exceed" in r.getMessage()]
    assert len(declined) == 1 and f"d={d}" in declined[0].getMessage()
    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    launched = sum(tq.LAUNCHES.values())
    out = attend(q, k, v, "hnas", kpm, qpm, u=u)
    assert sum(tq.LAUNCHES.values()) == launched  # no kernel ran
    torch.testing.assert_close(out.double(), reference_out(q, k, v, "hnas", kpm, qpm, u),
                               atol=1e-5, rtol=0)


def test_cpu_tensors_run_interpreted_without_the_environment_variable(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v, u, kpm, qpm = padded_problem(5, 4, 8, B=1, seed=11)
    before = dict(tq.LAUNCHES)
    triton_attend(q, k, v, u, kpm, qpm)
    assert tq.LAUNCHES["interpreted"] == before.get("interpreted", 0) + 2  # column + forward
    assert tq.LAUNCHES["compiled"] == before.get("compiled", 0)


@pytest.mark.parametrize(("dtype", "allow_tf32", "expected"), [
    (torch.float32, False, "ieee"), (torch.float32, True, "tf32"),
    (torch.bfloat16, False, "tf32"), (torch.float16, False, "tf32"),  # Triton's default: unused
])
def test_fp32_dot_precision_follows_torch_matmul_policy(dtype, allow_tf32, expected):
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        q = torch.zeros(1, 1, 4, 8, dtype=dtype)
        assert tq._meta(q, 8, 8, 4, 4)["PRECISION"] == expected
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_tile_configs_shrink_with_the_head_dim():
    from attnlab.attention.kernels import _triton_configs as tc

    assert len(tc.configs("column")) >= 3  # one (keys x d) tile: no accumulator to spill
    for kernel in ("forward", "backward_kv", "backward_q"):
        configs = tc.configs(kernel)
        prune = tc._prune(kernel)
        small = prune(configs, {}, BLOCK_D=64, BLOCK_DV=64)
        large = prune(configs, {}, BLOCK_D=256, BLOCK_DV=256)
        assert len(small) >= 3 and 1 <= len(large) < len(small)
        assert max(tc._owned(kernel, c) for c in large) * 256 <= max(tc._MAX_TILE[kernel], 32 * 256)
        assert prune(configs, {}, BLOCK_D=512, BLOCK_DV=512)  # never empty


def test_pinned_tiles_keep_the_largest_config_that_fits(monkeypatch):
    """ATTNLAB_TRITON_AUTOTUNE=0: one config per kernel and head dim, the same in every process
    (bitwise reproducible; one compile), the largest tile that the autotuned list keeps."""
    import itertools

    from attnlab.attention.kernels import _triton_configs as tc

    for arch, kernel, hybrid, width in itertools.product(
            (80, 90), ("column", "forward", "backward_kv", "backward_q"), (False, True),
            (64, 128, 256, 512)):
        monkeypatch.setattr(tc, "_arch", lambda named_args, a=arch: a, raising=False)
        configs, prune = tc.configs(kernel), tc._prune(kernel)
        monkeypatch.delenv("ATTNLAB_TRITON_AUTOTUNE", raising=False)
        tuned = prune(configs, {}, BLOCK_D=width, BLOCK_DV=width, HYBRID=hybrid)
        monkeypatch.setenv("ATTNLAB_TRITON_AUTOTUNE", "0")
        pinned = prune(configs, {}, BLOCK_D=width, BLOCK_DV=width, HYBRID=hybrid)
        assert pinned == [tuned[0]]
        assert tc._owned(kernel, tuned[0]) == max(tc._owned(kernel, c) for c in tuned)


def test_double_backward_refuses_with_one_clear_error():
    from attnlab.attention.kernels.triton_ops import DOUBLE_BACKWARD

    q, k, v, _, kpm, qpm = padded_problem(5, 4, 8, B=1, seed=12)
    q, k, v = leaf(q, k, v)
    out = triton_attend(q, k, v, None, kpm, qpm)
    (gq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)  # allowed
    with pytest.raises(RuntimeError, match="double backward through the Triton"):
        gq.sum().backward()
    assert "reference_attend" in DOUBLE_BACKWARD


def test_torch_compile_traces_the_registered_ops_in_one_graph():
    """fullgraph=True: no graph break around the kernels (the dropout seed is drawn without
    .item()); aot_eager runs the fake implementations and the registered autograd formula."""
    from torch._dynamo.utils import counters

    q, k, v, u, kpm, qpm = padded_problem(6, 5, 8, B=2, seed=13)
    inputs = leaf(q, k, v, u)

    def run(q, k, v, u):
        return triton_attend(q, k, v, u, kpm, qpm, dropout_p=0.1)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
    torch.manual_seed(5)
    out = compiled(*inputs)
    grads = torch.autograd.grad(out.sum(), inputs)
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(*inputs)
    assert counters["stats"]["unique_graphs"] == 1
    eager_inputs = leaf(q, k, v, u)
    torch.manual_seed(5)
    eager = run(*eager_inputs)
    # eager draws the seed from the same generator: the same mask, the same numbers
    torch.testing.assert_close(out, eager, atol=1e-6, rtol=0)
    for a, b in zip(grads, torch.autograd.grad(eager.sum(), eager_inputs)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
