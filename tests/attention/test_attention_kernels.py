"""Which path `attend` runs (each scheme's fast paths, `route`), UNAS through SDPA, and attention
dropout inside the fused CPU kernel (exact against the reference given the same keep mask;
statistics)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from helpers.kernel_cases import RecordShapes, leaf, out_and_grads, padded_problem, reference_out

from attnlab.attention import MultiHeadAttention, Normalizer, attend, paths
from attnlab.attention.functional import candidates
from attnlab.attention.kernels import dropout, fused, sdpa, triton_query_normalized

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64

# (scheme, device, dtype, dropout_p, causal) -> the path attend tries first
ROUTES = [
    ("unas", "cpu", F32, 0.0, False, "sdpa"),
    ("unas", "cpu", F32, 0.0, True, "sdpa"),
    ("unas", "cpu", F32, 0.1, False, "fused_cpu"),
    ("unas", "cpu", F32, 0.1, True, "rowwise_cpu"),  # a value wider than q; else sdpa_math
    ("unas", "cuda", BF16, 0.1, True, "sdpa"),
    ("unas", "cuda", F64, 0.0, False, "reference"),
    ("dnas", "cpu", F32, 0.0, False, "fused_cpu"),
    ("hnas", "cpu", F64, 0.1, False, "fused_cpu"),
    ("dnas", "cuda", BF16, 0.1, False, "triton"),
    ("hnas", "cuda", F32, 0.0, False, "triton"),
    ("hnas", "cuda", F64, 0.0, False, "reference"),
    ("sinkhorn", "cpu", F32, 0.0, False, "reference"),  # n_iter=3 below
    ("sinkhorn", "cuda", BF16, 0.0, False, "flex"),  # any n_iter on FlexAttention
    ("entmax", "cpu", F32, 0.0, False, "blocked"),
    ("entmax", "cuda", BF16, 0.0, False, "reference"),
    ("hnas", "mps", F32, 0.0, False, "reference"),
]


@pytest.fixture
def triton_on_cuda(monkeypatch):
    monkeypatch.setattr(triton_query_normalized, "available", lambda device: device == "cuda")


@pytest.mark.parametrize(("scheme", "device", "dtype", "dropout_p", "causal", "first"), ROUTES)
def test_route_picks_the_path_serving_the_options(scheme, device, dtype, dropout_p, causal, first,
                                                  triton_on_cuda):
    names = candidates(scheme, device, dtype, dropout_p, causal, n_iter=3)
    assert names[0] == first and names[-1] == "reference"
    # Sinkhorn with one iteration is DNAS, and runs on DNAS's kernels
    if scheme == "dnas":
        assert candidates("sinkhorn", device, dtype, dropout_p, causal, n_iter=1) == names


def test_route_without_the_compiled_kernels(monkeypatch):
    monkeypatch.setattr(fused, "load", lambda: False)
    monkeypatch.setattr(triton_query_normalized, "available", lambda device: False)
    assert candidates("dnas", "cpu", F32) == ["composed", "reference"]
    assert candidates("dnas", "cpu", F32, 0.1) == ["reference"]
    assert candidates("unas", "cpu", F32, 0.1) == ["sdpa_math", "reference"]
    assert candidates("hnas", "cuda", BF16) == ["flex", "reference"]  # FlexAttention is torch's own


@pytest.fixture
def spied_paths(monkeypatch):
    """Every path records its name when attend runs it (the triton one returns zeros)."""
    ran = []
    real_call, real_reference = paths.FastPath.__call__, Normalizer.reference

    def call(self, normalizer, c):
        ran.append(self.name)
        return torch.zeros_like(c.q) if self.name == "triton" else real_call(self, normalizer, c)

    monkeypatch.setattr(paths.FastPath, "__call__", call)
    monkeypatch.setattr(Normalizer, "reference", lambda self, c: ran.append("reference") or real_reference(self, c))
    return ran


@pytest.mark.parametrize(("device", "scheme", "dropout_p", "expected"), [
    # padded UNAS on the CPU: the fused kernel, listed first for padded calls (unpadded: next test)
    ("cpu", "unas", 0.0, ["fused_cpu"]), ("cpu", "unas", 0.2, ["fused_cpu"]),
    ("cpu", "hnas", 0.2, ["fused_cpu"]),
    ("cuda", "unas", 0.0, ["sdpa"]), ("cuda", "dnas", 0.2, ["triton"]),  # sinkhorn on cuda: test_flex_paths.py
])
def test_attend_runs_the_routed_path(device, scheme, dropout_p, expected, spied_paths,
                                     triton_on_cuda, monkeypatch):
    monkeypatch.setattr(paths, "device_type", lambda t: device)
    q, k, v, u, kpm, qpm = padded_problem(6, 5, 8, B=2, seed=1)
    attend(q, k, v, scheme, kpm, qpm, u=u, n_iter=3, dropout_p=dropout_p)
    assert spied_paths == expected


@pytest.mark.parametrize("causal", [False, True])
def test_padded_unas_on_the_cpu_takes_the_fused_kernel_unpadded_and_causal_stay_on_flash(
        causal, spied_paths):
    """UNAS with padding (not causal) runs on the fused CPU kernel, which takes padding at no cost;
    without padding, or causal, it stays on ATen's flash kernel. Both match the reference."""
    q, k, v, _, kpm, qpm = padded_problem(6, 5, 8, B=2, seed=2)
    inputs = leaf(q, k, v)
    g_out = torch.randn(2, 1, 6, 8)
    for masks, expected in (((kpm, qpm), ["fused_cpu"] if not causal else ["sdpa"]),
                            ((None, None), ["sdpa"])):
        spied_paths.clear()
        got = out_and_grads(lambda m=masks: attend(*inputs, "unas", *m, causal=causal), inputs, g_out)
        assert spied_paths == expected
        ref = out_and_grads(lambda m=masks: reference_out_causal(*inputs, *m, causal), inputs, g_out)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=0)


def test_unas_flash_declines_huge_scores_and_the_fused_kernel_stays_finite(spied_paths):
    """ATen's CPU flash kernel gives non-finite gradients from |s| ~ 5e8 (S >= 128)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = leaf(*(torch.randn(1, 2, 256, 8, generator=g) * m for m in (1e4, 1e4, 1)))
    out = attend(q, k, v, "unas")
    out.square().sum().backward()
    assert spied_paths == ["fused_cpu"]  # SDPA does not accept the call
    assert all(torch.isfinite(t).all() for t in (out, q.grad, k.grad, v.grad))
    spied_paths.clear()
    attend(q / 1e3, k / 1e3, v, "unas")  # ordinary scores stay on flash
    assert spied_paths == ["sdpa"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backends", [sdpa.CPU_FLASH, sdpa.CPU_MATH])
def test_sdpa_masking_matches_reference(causal, backends):
    """Key and query padding, rows with no key (every key padded, or before the first valid key
    under the causal mask): zeros and finite gradients, as in the reference."""
    q, k, v, _, kpm, qpm = padded_problem(7, 7, 8, d_v=6, seed=2)
    kpm[1, :3] = True  # causal rows 0-2 of item 1 have no key left
    inputs = leaf(q, k, v)
    g_out = torch.randn(4, 1, 7, 6)
    got = out_and_grads(lambda: sdpa.unas_sdpa(*inputs, kpm, qpm, causal, backends=backends),
                        inputs, g_out)
    ref_in = leaf(q, k, v, dtype=F64)
    ref = out_and_grads(lambda: reference_out_causal(*ref_in, kpm, qpm, causal), ref_in, g_out)
    for a, b in zip(got, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("d, d_v", [(52, 52), (52, 20), (64, 13)])
def test_cuda_backends_get_head_dims_padded_to_a_multiple_of_8(monkeypatch, d, d_v):
    """CUDA's backend list (flash, memory-efficient) with a mask: only the memory-efficient
    kernel serves, and it refuses head dims that are not multiples of 8 (VQA's d = 52 crashed on
    an H200). The same decision runs here with the math backend added, so that the CPU has a
    kernel: SDPA sees widths padded to multiples of 8, the scale stays d's, the output and the
    gradients are the reference's."""
    q, k, v, _, kpm, qpm = padded_problem(9, 9, d, d_v=d_v, seed=5)
    widths = []
    sdpa_call = sdpa.F.scaled_dot_product_attention

    def spy(q_, k_, v_, **kw):
        widths.append((q_.shape[-1], v_.shape[-1], kw["scale"]))
        return sdpa_call(q_, k_, v_, **kw)

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", spy)
    inputs = leaf(q, k, v)
    g_out = torch.randn(4, 1, 9, d_v)
    got = out_and_grads(lambda: sdpa.unas_sdpa(*inputs, kpm, qpm, backends=sdpa.CUDA_BACKENDS
                                               + sdpa.CPU_MATH), inputs, g_out)
    [(width, width_v, scale)] = widths  # (the CPU also gives q and v one width: its flash's rule)
    assert width % 8 == 0 and width_v % 8 == 0 and d <= width < d + 8 and scale == d**-0.5
    assert d_v <= width_v < max(d, d_v) + 8
    assert got[0].shape[-1] == d_v and [t.shape for t in got[1:]] == [q.shape, k.shape, v.shape]
    ref_in = leaf(q, k, v, dtype=F64)
    ref = out_and_grads(lambda: reference_out_causal(*ref_in, kpm, qpm, False), ref_in, g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["by_query", "by_head"])
def test_padded_flash_zeroes_query_rows_in_either_layout(layout):
    """The CPU flash output is (B, S_q, H, d) memory (zeroed by row index); any other layout
    takes masked_fill_: the same result."""
    g = torch.Generator().manual_seed(4)
    out = torch.randn(3, 5, 2, 4, generator=g).transpose(1, 2)  # (B, H, S_q, d), by query
    if layout == "by_head":
        out = out.contiguous()
    rows = torch.rand(3, 5, generator=g) < 0.4
    expected = out.masked_fill(rows[:, None, :, None], 0.0)
    sdpa._zero_query_rows(out, rows)
    assert rows.any() and torch.equal(out, expected)


def reference_out_causal(q, k, v, kpm, qpm, causal):
    from attnlab.attention import reference_attend

    return reference_attend(q, k, v, "unas", kpm, qpm, causal=causal)


@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
def test_cpu_kernel_dropout_matches_reference_with_the_same_mask(scheme):
    """Through attend: the seed drawn from torch's generator gives kernels/dropout.py's mask, in
    the forward and (regenerated) in the backward; an explicit keep mask matches too."""
    q, k, v, u, kpm, qpm = padded_problem(33, 29, 8, B=3, H=2, seed=3)
    inputs = leaf(q, k, v, u)
    uu = inputs[3] if scheme == "hnas" else None
    g_out = torch.randn(3, 2, 33, 8)
    torch.manual_seed(7)
    got = out_and_grads(lambda: attend(*inputs[:3], scheme, kpm, qpm, u=uu, dropout_p=0.3),
                        inputs[:3], g_out)
    torch.manual_seed(7)
    keep = dropout.keep_mask(dropout.draw_seed(), (3, 2, 33, 29), 0.3)
    ref_in = leaf(*inputs, dtype=F64)
    ref = out_and_grads(lambda: reference_out(*ref_in[:3], scheme, kpm, qpm, ref_in[3],
                                              keep=keep, p=0.3), ref_in[:3], g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=0)
    explicit = {"unas": lambda: fused.unas_attend(*inputs[:3], kpm, qpm, 0.3, keep_mask=keep),
                "dnas": lambda: fused.query_normalized_attend(*inputs[:3], None, kpm, qpm, 0.3,
                                                              keep_mask=keep),
                "hnas": lambda: fused.query_normalized_attend(*inputs, kpm, qpm, 0.3,
                                                              keep_mask=keep)}[scheme]
    torch.testing.assert_close(explicit().double(), ref[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
def test_cpu_kernel_backward_over_several_key_blocks(scheme, dropout_p):
    """The fused backward runs over blocks of at most 256 keys against every query (csrc/backward.h):
    603 keys are three blocks, the last with a scalar tail. Values and every gradient (u's too),
    with padding, d_v != d and dropout (the seed's mask, and the same mask given explicitly),
    against the float64 reference with that mask."""
    assert fused.load()
    B, H, S_q, S_k = 4, 2, 7, 603
    q, k, v, u, kpm, qpm = padded_problem(S_q, S_k, 4, d_v=3, B=B, H=H, dtype=F64, seed=8)
    inputs = leaf(q, k, v, u)
    uu = inputs[3] if scheme == "hnas" else None
    keep = dropout.keep_mask(11, (B, H, S_q, S_k), dropout_p) if dropout_p else None
    g_out = torch.randn(B, H, S_q, 3, dtype=F64)
    wrt = inputs if scheme == "hnas" else inputs[:3]
    ref = out_and_grads(lambda: reference_out(*inputs[:3], scheme, kpm, qpm, uu, keep=keep,
                                              p=dropout_p), wrt, g_out)
    def run(**mask):
        if scheme == "unas":
            return fused.unas_attend(*inputs[:3], kpm, qpm, dropout_p, **mask)
        return fused.query_normalized_attend(*inputs[:3], uu, kpm, qpm, dropout_p, **mask)

    for mask in ({"seed": 11}, {"keep_mask": keep}):
        for a, b in zip(out_and_grads(lambda m=mask: run(**m), wrt, g_out), ref):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_counter_dropout_keep_rate_and_mean(p):
    """With v = identity the output is the dropped weight matrix: about 1 - p of the weights
    survive, scaled by 1/(1-p), so that the mean weight is unchanged."""
    S = 128
    q, k = (torch.randn(2, 4, S, 16) for _ in range(2))
    v = torch.eye(S).expand(2, 4, S, S)
    dropped = fused.query_normalized_attend(q, k, v, None, dropout_p=p, seed=5)
    weights = reference_out(q, k, v, "dnas", None, None).float()
    kept = dropped != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01  # 131072 draws: sigma <= 0.0014
    torch.testing.assert_close(dropped[kept], weights[kept] / (1 - p), atol=1e-6, rtol=1e-4)
    assert abs(dropped.sum().item() / weights.sum().item() - 1) < 0.02


def test_mlm_style_attention_dropout_stays_fused():
    """MultiHeadAttention in training with attention dropout: the fused kernel, nothing S x S."""
    B, S, E = 2, 256, 32
    x = torch.randn(B, S, E)
    mask = torch.zeros(B, S, dtype=torch.bool)
    mask[0, -20:] = True
    for scheme in ("unas", "dnas", "hnas"):
        mha = MultiHeadAttention(E, 2, spec=scheme, dropout=0.1).train()
        with RecordShapes() as rec:
            mha(x, key_padding_mask=mask, query_padding_mask=mask).sum().backward()
        assert rec.largest < B * 2 * S * S / 8, scheme


def test_cpu_kernel_memory_is_linear_in_sequence_length():
    """The C++ kernels' own buffers are invisible to dispatch modes: measure the process. In one
    fresh process, after a warm-up, fwd+bwd at S=4096 (B=H=1, d=64) of dnas and hnas, then of
    unas, dnas and hnas with dropout, must each grow the peak RSS (reset before each) by less
    than half of one S x S float32 matrix (64 MiB): inputs, grads and per-row buffers take
    ~21 MiB, and an S x S buffer of even one byte per weight would add 16 MiB or more."""
    script = textwrap.dedent("""
        import ctypes, re, torch
        from attnlab.attention import attend
        from attnlab.attention.kernels import fused
        assert fused.load()
        torch.set_num_threads(1)
        def peak_mib():
            return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
        def run(S, schemes, dropout_p):
            q, k, v = (torch.randn(1, 1, S, 64, requires_grad=True) for _ in range(3))
            u = torch.full((1, 1, 1, 1), 0.5, requires_grad=True)
            for scheme in schemes:
                attend(q, k, v, scheme, u=u, dropout_p=dropout_p).sum().backward()
        cases = {"plain": (("dnas", "hnas"), 0.0), "dropout": (("unas", "dnas", "hnas"), 0.1)}
        for schemes, p in cases.values():
            run(64, schemes, p)
        for name, (schemes, p) in cases.items():
            ctypes.CDLL(None).malloc_trim(0)  # glibc: what the last case freed leaves the process
            with open("/proc/self/clear_refs", "w") as f:  # and the peak RSS starts again from now
                f.write("5")
            before = peak_mib()
            run(4096, schemes, p)
            print(name, peak_mib() - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    grown = {name: float(mib) for name, mib in (line.split() for line in out.stdout.strip().splitlines()[-2:])}
    assert grown["plain"] < 32 and grown["dropout"] < 32, f"peak RSS grew by {grown} MiB at S=4096"


@pytest.mark.parametrize("kernel", ["dnas", "hnas", "sigmoid", "softpick"])
def test_the_fused_cpu_kernels_compile_without_graph_breaks(kernel):
    """The fused C++ kernels are torch.library custom ops (fake implementations, autograd):
    torch.compile (dynamic shapes, aot_eager) traces a padded call with dropout through them in
    one graph for three lengths, and gives the eager output and gradients (same dropout seed)."""
    from torch._dynamo.utils import counters

    from attnlab.attention.kernels import rowwise

    assert fused.load()

    def run(q, k, v, u, kpm, qpm):
        if kernel in ("dnas", "hnas"):
            return fused.query_normalized_attend(q, k, v, u if kernel == "hnas" else None, kpm,
                                                 qpm, dropout_p=0.2, seed=7)
        if kernel == "sigmoid":
            return rowwise.sigmoid_attend(q, k, v, "learned", u, kpm, qpm, dropout_p=0.2, seed=7)
        return rowwise.softpick_attend(q, k, v, 0.01, kpm, qpm, dropout_p=0.2, seed=7)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(run, backend="aot_eager", dynamic=True)
    for S in (5, 9, 14):
        q, k, v, u, kpm, qpm = padded_problem(S, S, 8, H=2, seed=S)
        inputs = leaf(q, k, v, u)
        wrt = inputs if kernel in ("hnas", "sigmoid") else inputs[:3]  # the others ignore u
        g_out = torch.randn(*q.shape[:3], v.shape[-1])
        args = (*inputs, kpm, qpm)
        eager = out_and_grads(lambda args=args: run(*args), wrt, g_out)
        got = out_and_grads(lambda args=args: compiled(*args), wrt, g_out)
        for a, b in zip(got, eager):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("scheme", ["dnas", "unas", "sigmoid"])
def test_attend_through_the_dispatch_compiles_in_one_graph(scheme):
    """`attend` picks its CPU path per call (`paths`), asking whether the fused kernel is built:
    compiled with dynamic shapes and padding, that question is a constant (no graph break at the
    build code, as when `fused.load` was a functools.cache that torch.compile traced through)."""
    from torch._dynamo.utils import counters

    from attnlab.attention.functional import normalizer

    assert fused.load()
    norm, _ = normalizer(scheme)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(norm.attend, backend="aot_eager", dynamic=True)
    for S in (6, 11):
        q, k, v, _, kpm, qpm = padded_problem(S, S, 8, H=2, seed=S)
        torch.testing.assert_close(compiled(q, k, v, kpm, qpm), norm.attend(q, k, v, kpm, qpm),
                                   atol=1e-6, rtol=1e-5)
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()
