"""The functional attention API: fused path vs materialized reference, gradients, invariants."""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import pytest
import torch
from helpers.kernel_cases import RecordShapes
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import attend, attention_weights, reference_attend
from attnlab.attention.functional import route
from attnlab.attention.kernels import fused
from attnlab.attention.schemes import NORMALIZERS
from attnlab.errors import ConfigError

# every registered normalization (a new scheme file is tested here without editing this list)
SCHEMES = sorted(NORMALIZERS)
# How `attend` computes dnas / hnas: the fused C++ kernel, or (where it cannot be built) ATen's
# flash kernel composed in Python. Both must match the reference.
BACKENDS = ["fused", "composed"]
LOAD = fused.load  # the real one (the composed backend replaces it)


@contextlib.contextmanager
def use_backend(backend: str):
    if backend == "fused":
        assert fused.load(), "the fused kernel did not build (see the warning)"
        yield
    else:
        with mock.patch.object(fused, "load", lambda: False):
            yield


@pytest.fixture(params=BACKENDS)
def backend(request):
    with use_backend(request.param):
        yield request.param


def make_inputs(B=3, H=2, S_q=7, S_k=5, d=8, d_v=8, dtype=torch.float32, seed=0, logit_scale=1.0,
                pad=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S_q, d, generator=g, dtype=dtype) * logit_scale
    k = torch.randn(B, H, S_k, d, generator=g, dtype=dtype)
    v = torch.randn(B, H, S_k, d_v, generator=g, dtype=dtype)
    u = torch.rand(1, H, 1, 1, generator=g, dtype=dtype)
    kpm = qpm = None
    if pad:
        kpm = torch.rand(B, S_k, generator=g) < 0.3
        qpm = torch.rand(B, S_q, generator=g) < 0.3
        kpm[0] = True  # batch item 0: every key padded -> all-zero rows
        kpm[1] = False
        qpm[1, :] = True  # batch item 1: every query padded -> all-zero columns
        qpm[2] = False
        kpm[2, 0] = False  # item 2: at least one valid key
    return q, k, v, u, kpm, qpm


def grads(fn, tensors, g_out):
    out = fn()
    return (out, *torch.autograd.grad((out * g_out).sum(), tensors))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", [(6, 6, 8, 8), (7, 4, 8, 8), (3, 9, 4, 6), (300, 20, 64, 64)],
                         ids=["self", "cross", "dv", "blocks"])
def test_efficient_matches_reference(scheme, shape, backend):
    S_q, S_k, d, d_v = shape
    q, k, v, u, kpm, qpm = make_inputs(S_q=S_q, S_k=S_k, d=d, d_v=d_v, seed=S_q * 31 + S_k)
    tensors = [t.requires_grad_() for t in (q, k, v, u)]
    g_out = torch.randn(q.shape[0], q.shape[1], S_q, d_v)
    causal = NORMALIZERS[scheme].causal_only  # stick-breaking: causal attention only
    kw = {"key_padding_mask": kpm, "query_padding_mask": qpm, "causal": causal,
          "u": u if scheme == "hnas" else None}
    if backend == "composed":
        with mock.patch.object(fused, "load", LOAD):
            fused_route = route(q, k, v, scheme, **kw)
        if route(q, k, v, scheme, **kw) == fused_route:  # e.g. esp's chunked path: ~20 s at "blocks"
            pytest.skip("the kernel this scheme runs is the same on both backends: its fused case checks it")
    if scheme != "hnas":
        tensors = tensors[:3]  # u is an input of hnas only
    got = grads(lambda: attend(q, k, v, scheme, **kw), tensors, g_out)
    ref = grads(lambda: reference_attend(q, k, v, scheme, kpm, qpm, causal, u=kw["u"]), tensors,
                g_out)
    out_f, out_r = got[0], ref[0]
    assert torch.isfinite(out_f).all()
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=0)
    for gf, gr in zip(got[1:], ref[1:]):
        assert torch.isfinite(gf).all()
        # relative to the gradient's scale where it exceeds 1 (ESP's soft sort at temperature
        # 1e-3 has gradients ~1e2, whose float32 sums run in another order on each path)
        torch.testing.assert_close(gf, gr, atol=1e-4 * max(1.0, gr.abs().max().item()), rtol=0)
    # Padded queries give zero rows; batch item 0 has no valid key at all -> zeros.
    assert (out_f[qpm[:, None, :, None].expand_as(out_f)] == 0).all()
    assert (out_f[0] == 0).all()


@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
def test_gradcheck_float64(scheme, backend):
    q, k, v, u, _, _ = make_inputs(B=2, H=2, S_q=4, S_k=3, d=3, d_v=2, dtype=torch.float64, seed=5,
                                   pad=False)
    kpm = torch.tensor([[False, False, True], [False, False, False]])
    qpm = torch.tensor([[False, True, False, False], [False, False, False, True]])
    inputs = [t.requires_grad_() for t in (q, k, v)]
    if scheme == "hnas":
        inputs.append(u.requires_grad_())

    def fn(q, k, v, u=None):
        return attend(q, k, v, scheme, key_padding_mask=kpm, query_padding_mask=qpm, u=u)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)


def test_hnas_endpoints_equal_unas_and_dnas(backend):
    q, k, v, _, kpm, qpm = make_inputs(seed=3)
    kw = {"key_padding_mask": kpm, "query_padding_mask": qpm}
    for fn in (attend, lambda q, k, v, s, **kw: attention_weights(q, k, s, **kw)):
        unas, dnas = fn(q, k, v, "unas", **kw), fn(q, k, v, "dnas", **kw)
        torch.testing.assert_close(fn(q, k, v, "hnas", u=torch.tensor(0.0), **kw), unas, atol=1e-6, rtol=0)
        torch.testing.assert_close(fn(q, k, v, "hnas", u=torch.tensor(1.0), **kw), dnas, atol=1e-6, rtol=0)
        # and it is linear in u in between
        mid = fn(q, k, v, "hnas", u=torch.tensor(0.25), **kw)
        torch.testing.assert_close(mid, 0.25 * dnas + 0.75 * unas, atol=1e-6, rtol=0)


def test_unas_weights_equal_softmax_and_sdpa():
    q, k, v, _, _kpm, _ = make_inputs(pad=False, seed=4)
    w = attention_weights(q, k, "unas")
    torch.testing.assert_close(w, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)
    torch.testing.assert_close(attend(q, k, v, "unas"), sdpa, atol=1e-6, rtol=0)


def test_dnas_weights_match_paper_formula():
    """xi = exp(s) / sum_i exp(s), pi = xi / sum_j xi (seed paper, Eq. 5) for moderate logits."""
    q, k, *_ = make_inputs(pad=False, seed=6)
    s = (q @ k.transpose(-1, -2) / math.sqrt(8)).double()
    xi = s.exp() / s.exp().sum(-2, keepdim=True)
    pi = xi / xi.sum(-1, keepdim=True)
    torch.testing.assert_close(attention_weights(q, k, "dnas").double(), pi, atol=1e-6, rtol=0)


def test_causal_unas_matches_reference_and_masks_future():
    q, k, v, _, kpm, qpm = make_inputs(S_q=6, S_k=6, seed=7)
    out = attend(q, k, v, "unas", key_padding_mask=kpm, query_padding_mask=qpm, causal=True)
    ref = reference_attend(q, k, v, "unas", kpm, qpm, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    w = attention_weights(q, k, "unas", causal=True)
    assert (w.triu(diagonal=1) == 0).all()


@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn"])
def test_causal_guard_names_the_fix(scheme):
    q, k, v, u, *_ = make_inputs(pad=False)
    for call in (lambda: attend(q, k, v, scheme, u=u, causal=True),
                 lambda: attention_weights(q, k, scheme, u=u, causal=True)):
        with pytest.raises(ValueError, match="leaks the future") as err:
            call()
        assert "unas" in str(err.value)


def test_bad_inputs_raise_one_clear_error():
    q, k, v, *_ = make_inputs(pad=False)
    with pytest.raises(ConfigError, match="bool"):
        attend(q, k, v, "dnas", key_padding_mask=torch.zeros(3, 5))
    with pytest.raises(ConfigError, match=r"\(B, S\)"):
        attend(q, k, v, "dnas", query_padding_mask=torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(ConfigError, match="needs u"):
        attend(q, k, v, "hnas")
    with pytest.raises(ConfigError, match="unknown attention scheme"):
        attend(q, k, v, "softmax")
    with pytest.raises(ConfigError, match="4-D"):
        attend(q[0], k[0], v[0])


def test_sinkhorn_one_iteration_is_dnas():
    q, k, v, _, kpm, qpm = make_inputs(seed=8)
    kw = {"key_padding_mask": kpm, "query_padding_mask": qpm}
    torch.testing.assert_close(
        attention_weights(q, k, "sinkhorn", n_iter=1, **kw), attention_weights(q, k, "dnas", **kw)
    )
    torch.testing.assert_close(
        attend(q, k, v, "sinkhorn", n_iter=1, **kw), attend(q, k, v, "dnas", **kw), atol=1e-6, rtol=0
    )


def test_sinkhorn_converges_to_doubly_stochastic():
    q, k, v, *_ = make_inputs(S_q=6, S_k=6, pad=False, seed=9)
    w = attention_weights(q, k, "sinkhorn", n_iter=200)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 6), atol=1e-4, rtol=0)
    torch.testing.assert_close(w.sum(-2), torch.ones(3, 2, 6), atol=1e-4, rtol=0)
    # a few iterations are not doubly stochastic yet: the test above is not vacuous
    assert (attention_weights(q, k, "dnas").sum(-2) - 1).abs().max() > 1e-2
    out = attend(q, k, v, "sinkhorn", n_iter=200)
    torch.testing.assert_close(out, w @ v, atol=1e-5, rtol=0)


def test_the_reference_math_at_its_edges():
    """attention/reference.py where the schemes' tests do not reach (survivors of `make mutate`):
    rows of very different scales, huge logits, a query mask alone, three heads, the compute
    and output dtypes, HNAS's mix in the logits' dtype, Sinkhorn's option error."""
    from attnlab.attention import reference
    from attnlab.attention.schemes.hnas import HNAS
    from attnlab.attention.schemes.sinkhorn import SinkhornOptions

    # each row shifted by its own maximum: a global one would underflow the low row to zeros
    mixed = torch.tensor([[0.0, 1.0, 2.0], [-1e4, -1e4 + 1.0, -1e4 + 2.0]])
    row = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1)
    torch.testing.assert_close(reference.safe_log_normalize(mixed, -1).exp(), row.expand(2, 3))
    # logits of 1e4: the maximum is subtracted (adding it, exp overflows)
    big = reference.safe_log_normalize(torch.tensor([[1e4, 1e4 - 1.0]]), -1).exp()
    torch.testing.assert_close(big, torch.softmax(torch.tensor([[0.0, -1.0]]), -1))
    # q.k / sqrt(d) in float32 from half inputs (float64 stays), nothing masked by default
    g = torch.Generator().manual_seed(11)
    q, k = torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 3, 5, 8, generator=g)
    scores = reference.masked_logits(q.half(), k.half())
    assert scores.dtype == torch.float32 and torch.isfinite(scores).all()
    torch.testing.assert_close(scores, q.half().float() @ k.half().float().transpose(-1, -2) / math.sqrt(8))
    assert reference.masked_logits(q.double(), k.double()).dtype == torch.float64
    # a query mask alone, on three heads: the padded queries' rows are -inf, the rest finite
    qpm = torch.tensor([[False, False, True, True], [False] * 4])
    masked = reference.masked_logits(q, k, query_padding_mask=qpm)
    assert masked.shape == (2, 3, 4, 5) and torch.isinf(masked[0, :, 2:]).all()
    assert torch.isfinite(masked[0, :, :2]).all() and torch.isfinite(masked[1]).all()
    # the output dtype a fused kernel gives: the autocast dtype under autocast, float64 stays
    v = torch.zeros(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert reference.output_dtype(v) == torch.bfloat16
        assert reference.output_dtype(v.double()) == torch.float64
    assert reference.output_dtype(v) == torch.float32
    # HNAS's u * DNAS + (1 - u) * UNAS in the logits' dtype, whatever u's
    logits = reference.masked_logits(q, k)
    mix = HNAS().weights(logits, torch.full((1, 3, 1, 1), 0.25, dtype=torch.float64))
    dnas = reference.sinkhorn_log_weights(logits, 1).exp()
    assert mix.dtype == torch.float32
    torch.testing.assert_close(mix, 0.25 * dnas + 0.75 * torch.softmax(logits, -1))
    with pytest.raises(ConfigError, match=r"^model.n_iter=0 must be >= 1 \(1 equals dnas\)$"):
        SinkhornOptions(n_iter=0)


@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
def test_fused_path_never_materializes_scores(scheme, backend):
    B, H, S, d = 2, 2, 256, 16
    q, k, v = (torch.randn(B, H, S, d, requires_grad=True) for _ in range(3))
    u = torch.full((1, H, 1, 1), 0.3, requires_grad=True)
    mask = torch.zeros(B, S, dtype=torch.bool)
    mask[0, -10:] = True
    with RecordShapes() as rec:
        out = attend(q, k, v, scheme, key_padding_mask=mask, query_padding_mask=mask, u=u)
        out.sum().backward()
    assert rec.largest < B * H * S * S / 8  # largest tensor is O(S d), far below S x S
    with RecordShapes() as rec:
        attention_weights(q, k, scheme, u=u).sum()
    assert rec.largest >= B * H * S * S  # (and the probe does see a materialized matrix)


# ---- property-based tests -------------------------------------------------------------------

@st.composite
def attention_problems(draw):
    B = draw(st.integers(1, 3))
    H = draw(st.integers(1, 2))
    S_q = draw(st.integers(1, 6))
    S_k = draw(st.integers(1, 6))
    d = draw(st.sampled_from([1, 2, 4]))
    magnitude = draw(st.sampled_from([1.0, 10.0, 1e4]))
    seed = draw(st.integers(0, 2**16))
    kpm = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=S_k, max_size=S_k),
                                     min_size=B, max_size=B)))
    qpm = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=S_q, max_size=S_q),
                                     min_size=B, max_size=B)))
    g = torch.Generator().manual_seed(seed)
    # logits of magnitude ~ `magnitude`: q . k / sqrt(d) with |q| ~ magnitude
    q = torch.randn(B, H, S_q, d, generator=g) * magnitude
    k = torch.randn(B, H, S_k, d, generator=g)
    v = torch.randn(B, H, S_k, 3, generator=g)
    u = torch.rand(1, H, 1, 1, generator=g)
    scheme = draw(st.sampled_from(SCHEMES))
    n_iter = draw(st.integers(1, 4))
    autocast = draw(st.booleans())
    causal = NORMALIZERS[scheme].causal_only  # stick-breaking is defined in causal attention only
    return {"q": q, "k": k, "v": v, "u": u, "kpm": kpm, "qpm": qpm, "scheme": scheme, "n_iter": n_iter,
            "autocast": autocast, "causal": causal}


def _maybe_autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


@settings(max_examples=60, deadline=None, derandomize=True)  # the same examples in every run
@given(attention_problems())
def test_weight_invariants(p):
    kpm, qpm, scheme = p["kpm"], p["qpm"], p["scheme"]
    q, k = p["q"], p["k"]
    if p["autocast"]:  # model activations in bf16, as under bf16-mixed training
        q, k = q.bfloat16(), k.bfloat16()
    with _maybe_autocast(p["autocast"]):
        w = attention_weights(q, k, scheme, key_padding_mask=kpm, query_padding_mask=qpm,
                              causal=p["causal"], u=p["u"], n_iter=p["n_iter"])
    assert w.dtype == torch.float32  # normalized in float32 even under bf16 autocast
    assert torch.isfinite(w).all()
    assert (w >= 0).all()
    valid_k, valid_q = ~kpm[:, None, None, :], ~qpm[:, None, :, None]
    assert (w[~(valid_k & valid_q).expand_as(w)] == 0).all()  # padded keys / queries: weight 0
    rows = w.sum(-1)  # (B, H, S_q)
    live_rows = (valid_q[..., 0] & valid_k.any(-1)).expand_as(rows)
    if NORMALIZERS[scheme].rows_sum_to_one:
        torch.testing.assert_close(rows[live_rows], torch.ones_like(rows[live_rows]), atol=1e-5, rtol=0)
    elif scheme != "sigmoid":  # sink, softpick, stick-breaking: a row spends at most all its mass
        assert (rows <= 1 + 1e-5).all()  # (sigmoid's rows are not bounded by 1: up to n / (1 + 1/n))
    if scheme in ("dnas", "hnas", "sinkhorn"):
        # Lemma: every valid key gets total weight >= 1 / (number of valid keys) (times u in HNAS).
        # Sinkhorn too: after a column step every entry is <= 1, so a row sum is <= S_k.
        n_keys = valid_k.sum(-1, keepdim=True).clamp(min=1).float()  # (B, 1, 1, 1)
        bound = 1.0 / n_keys[..., 0]  # (B, 1, 1)
        if scheme == "hnas":
            bound = bound * p["u"][..., 0]  # (B, H, 1)
        cols = w.sum(-2)  # (B, H, S_k)
        live_cols = (valid_k[:, :, 0, :] & valid_q.any(-2)).expand_as(cols)
        slack = (cols - bound * (1 - 1e-4))[live_cols]
        assert (slack >= 0).all(), f"lemma violated by {slack.min()}"


@settings(max_examples=40, deadline=None, derandomize=True)
@given(attention_problems())
def test_attend_is_finite_with_zero_padded_rows(p):
    for backend in BACKENDS:
        with use_backend(backend):
            _check_attend_is_finite(p)


def _check_attend_is_finite(p):
    kpm, qpm, scheme = p["kpm"], p["qpm"], p["scheme"]
    q, k, v, u = (p[n].clone().requires_grad_() for n in ("q", "k", "v", "u"))
    with _maybe_autocast(p["autocast"]):
        out = attend(q, k, v, scheme, key_padding_mask=kpm, query_padding_mask=qpm,
                     causal=p["causal"], u=u, n_iter=p["n_iter"])
    assert out.dtype == (torch.bfloat16 if p["autocast"] else torch.float32)
    assert torch.isfinite(out).all()
    assert (out.float()[qpm[:, None, :, None].expand_as(out)] == 0).all()
    assert (out.float()[kpm.all(-1)] == 0).all()  # no valid key: zeros, not NaN
    out.float().square().sum().backward()
    for t in (q, k, v, u):
        assert t.grad is None or torch.isfinite(t.grad).all()
    if not p["autocast"] and p["q"].abs().max() < 100:
        ref = reference_attend(p["q"], p["k"], p["v"], scheme, kpm, qpm, p["causal"], u=p["u"],
                               n_iter=p["n_iter"])
        torch.testing.assert_close(out.detach(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_backward_in_batch_chunks_matches_reference(scheme, monkeypatch):
    """Composed path: large inputs run the backward over batch chunks; force one item per chunk."""
    from attnlab.attention.kernels import composed

    monkeypatch.setattr(composed, "CHUNK_BYTES", 1)
    monkeypatch.setattr(fused, "load", lambda: False)
    q, k, v, u, kpm, qpm = make_inputs(S_q=5, S_k=6, seed=11)
    tensors = [t.requires_grad_() for t in (q, k, v)]
    g_out = torch.randn(3, 2, 5, 8)
    u = u if scheme == "hnas" else None
    got = grads(lambda: attend(q, k, v, scheme, kpm, qpm, u=u), tensors, g_out)
    ref = grads(lambda: reference_attend(q, k, v, scheme, kpm, qpm, u=u), tensors, g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_hnas_backward_without_the_folded_c_gradient(monkeypatch):
    """Composed path: extreme logit ranges switch the HNAS backward to the extra forward pass."""
    from attnlab.attention.kernels import composed

    monkeypatch.setattr(composed, "FOLD_MAX_RANGE", -1.0)
    monkeypatch.setattr(fused, "load", lambda: False)
    q, k, v, u, kpm, qpm = make_inputs(S_q=6, S_k=4, seed=12)
    tensors = [t.requires_grad_() for t in (q, k, v, u)]
    g_out = torch.randn(3, 2, 6, 8)
    got = grads(lambda: attend(q, k, v, "hnas", kpm, qpm, u=u), tensors, g_out)
    ref = grads(lambda: reference_attend(q, k, v, "hnas", kpm, qpm, u=u), tensors, g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("logit_scale", [1.0, 60.0], ids=["fold", "two_exponentials"])
def test_fused_hnas_on_both_sides_of_the_fold_range(logit_scale):
    """The fused HNAS kernel takes Pu = Pd a_i b_j (one exp per score) while the column LSEs of
    the valid keys span <= 60 (csrc/fold.h), separate exponentials beyond: both exact."""
    assert fused.load()
    q, k, v, u, kpm, qpm = make_inputs(B=3, S_q=9, S_k=6, d=4, d_v=3, dtype=torch.float64,
                                       seed=21, logit_scale=logit_scale)
    s = (q @ k.transpose(-2, -1) / 2).masked_fill(qpm[:, None, :, None], float("-inf"))
    c = s.logsumexp(-2).masked_fill(kpm[:, None, :], float("nan"))[2]  # item 2: both padded
    span = (c.nan_to_num(float("-inf")).amax(-1) - c.nan_to_num(float("inf")).amin(-1)).max()
    assert (span <= fused.FOLD_RANGE) == (logit_scale == 1.0)
    tensors = [t.requires_grad_() for t in (q, k, v, u)]
    g_out = torch.randn(3, 2, 9, 3, dtype=torch.float64)
    got = grads(lambda: attend(q, k, v, "hnas", kpm, qpm, u=u), tensors, g_out)
    ref = grads(lambda: reference_attend(q, k, v, "hnas", kpm, qpm, u=u), tensors, g_out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("logit_scale", [1.0, 60.0], ids=["fold", "two_exponentials"])
def test_fused_hnas_forward_without_a_backward_to_come(logit_scale, dropout_p, monkeypatch):
    """Under no_grad (evaluation: the inputs still require gradients) the fused HNAS forward mixes
    the weights before one P V product and returns no DNAS-branch output (od): the same output
    as with gradients (same dropout seed), on both sides of the fold range, with padding."""
    assert fused.load()
    q, k, v, u, kpm, qpm = make_inputs(B=3, S_q=9, S_k=6, d=4, d_v=3, dtype=torch.float64,
                                       seed=22, logit_scale=logit_scale)
    for t in (q, k, v, u):
        t.requires_grad_()
    kernel = torch.ops.attnlab.query_normalized_forward
    od_sizes = []

    def spy(*args):
        results = kernel(*args)
        od_sizes.append(results[1].numel())
        return results

    monkeypatch.setattr(torch.ops.attnlab, "query_normalized_forward", spy)

    def run():
        return fused.query_normalized_attend(q, k, v, u, kpm, qpm, dropout_p, seed=5)

    with torch.no_grad():
        mixed = run()
    with_branch = run()
    assert od_sizes[0] == 0 and od_sizes[1] == with_branch.numel()
    torch.testing.assert_close(mixed, with_branch.detach(), atol=1e-13, rtol=1e-12)
    if dropout_p == 0.0:
        ref = reference_attend(q.detach(), k.detach(), v.detach(), "hnas", kpm, qpm, u=u.detach())
        torch.testing.assert_close(mixed, ref, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_rows_outweighed_in_every_column(dtype):
    """The fused forward exponentiates the DNAS log-weights s_ij - c_j <= 0 without a row
    maximum; a query outweighed by others in every column (all its log-weights < -20) takes the
    fallback with its maximum. Query 0 scores 0 against every key, the others >= 150: its weights underflow without it."""
    assert fused.load()
    g = torch.Generator().manual_seed(5)
    k = torch.randn(1, 2, 6, 4, generator=g, dtype=dtype)
    k[..., 0] = 1 + 0.1 * torch.rand(1, 2, 6, generator=g, dtype=dtype)
    q = torch.zeros(1, 2, 5, 4, dtype=dtype)
    q[:, :, 1:, 0] = 300 + torch.rand(1, 2, 4, generator=g, dtype=dtype)
    v = torch.randn(1, 2, 6, 3, generator=g, dtype=dtype)
    u = torch.tensor([0.3, 0.8], dtype=dtype).view(1, 2, 1, 1)
    s = q @ k.transpose(-2, -1) / 2
    assert (s - s.logsumexp(-2, keepdim=True))[:, :, 0].amax() < -100  # row 0: the fallback
    tensors = [t.requires_grad_() for t in (q, k, v, u)]
    g_out = torch.randn(1, 2, 5, 3, generator=g, dtype=dtype)
    # float32 with scores of 150 (an ulp ~1e-5): relative to each tensor's largest entry
    rel = 1e-10 if dtype == torch.float64 else 2e-4
    for scheme, wrt in (("dnas", tensors[:3]), ("hnas", tensors)):
        got = grads(lambda s=scheme: attend(q, k, v, s, u=u), wrt, g_out)
        ref = grads(lambda s=scheme: reference_attend(q.double(), k.double(), v.double(), s,
                                                      u=u.double()).to(dtype), wrt, g_out)
        for a, b in zip(got, ref):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, atol=rel * b.abs().max().item(), rtol=0)


def test_fused_kernel_is_what_attend_runs():
    """On this machine (a C++ compiler is present) dnas/hnas must not silently fall back."""
    assert fused.load()
    q, k, v, u, kpm, qpm = make_inputs(seed=13)
    with mock.patch.object(fused, "query_normalized_attend", wraps=fused.query_normalized_attend) as spy:
        attend(q, k, v, "dnas", kpm, qpm)
        attend(q, k, v, "hnas", kpm, qpm, u=u)
        attend(q, k, v, "sinkhorn", kpm, qpm, n_iter=1)
    assert spy.call_count == 3


