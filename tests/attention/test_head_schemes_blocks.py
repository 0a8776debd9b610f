"""Differential and selective attention without S x S maps: diff's two plain calls of the
normalizer's fast path (schemes/diff.py) and selective attention by query blocks
(kernels/selective_blocks.py) give the materialized computation's outputs and gradients (float64,
causal, padded, several blocks of a length no block divides), keep their weights for recorders,
and never build an S x S tensor."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import MultiHeadAttention, record_attention
from attnlab.attention.kernels import selective_blocks
from attnlab.attention.schemes import unas
from attnlab.attention.schemes.base import Heads
from attnlab.attention.schemes.transform import LogitTransform

E, H = 16, 2


def batch(S=11, seed=0, scale=2.0):
    """x (3, S, E) float64 with sizeable scores, and padding: right (example 1), left (example 2:
    key 0 is a pad)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, S, E, generator=g, dtype=torch.float64) * scale
    mask = torch.zeros(3, S, dtype=torch.bool)
    mask[1, -3:] = True
    mask[2, :2] = True
    return x, mask


def materialized(m: MultiHeadAttention, monkeypatch) -> None:
    """Send `m`'s scheme to its materialized computation (the reference of these tests)."""
    if m.head_scheme is not None:
        monkeypatch.setattr(m.head_scheme, "_fast_calls", lambda *args: None)
    else:
        monkeypatch.setattr(m.transform, "route", lambda *args: "materialized")


def outputs_and_grads(m, x, params, **kwargs):
    x = x.clone().requires_grad_(True)
    out = m(x, **kwargs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return out, torch.autograd.grad((out * g).sum(), [x, *params])


def assert_same_as_materialized(m, x, params, monkeypatch, **kwargs):
    out, grads = outputs_and_grads(m, x, params, **kwargs)
    with monkeypatch.context() as patch:
        materialized(m, patch)
        ref, ref_grads = outputs_and_grads(m, x, params, **kwargs)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def diff_module(version, normalization="unas", causal=True):
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": version,
                                       "normalization": normalization}, is_decoder=causal).double()
    with torch.no_grad():  # lambda away from its init: a wrong weight of the second map shows
        for p in m.head_scheme.parameters(recurse=False):
            p.normal_(0, 0.5)
    return m


def diff_params(m):
    s = m.head_scheme
    own = [s.lambda_q1, s.lambda_k1, s.lambda_q2, s.lambda_k2, s.subln.weight] if s.version == 1 \
        else [s.q2_proj.weight, s.lambda_proj.weight]
    return [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight, *own]


def heads_of(m, x, mask, causal):
    q, k, v = (m._split(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
    return Heads(q, k, v, mask, mask, causal, query=x)


# ----------------------------------------------------------------------------- diff
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("normalization, causal, routes", [
    # v1's half-width maps over the whole value: one call on a kernel that takes any value width
    # (UNAS causal: the row-wise kernel's softmax); v2's full-width ones on ATen's flash kernel
    ("unas", True, ("rowwise_cpu", "sdpa")), ("unas", False, ("fused_cpu", "fused_cpu")),
    ("sigmoid", True, ("fused_cpu", "fused_cpu")),
    ("ssmax", True, ("scaled_rowwise_cpu", "scaled_sdpa")),
])
def test_diff_from_the_normalizers_fast_path_equals_the_materialized_maps(
        version, normalization, causal, routes, monkeypatch):
    m = diff_module(version, normalization, causal)
    x, mask = batch()
    assert m.head_scheme.route(m.normalizer, heads_of(m, x, mask, causal)) == routes[version - 1]
    calls = m.head_scheme._fast_calls(m.normalizer, heads_of(m, x, None, causal))
    assert [len(pieces) for pieces in calls] == [1, 1]  # one call per map: no value split
    # values and gradients of the projections and of lambda (v1's vectors, v2's W_lambda)
    assert_same_as_materialized(m, x, diff_params(m), monkeypatch, key_padding_mask=mask,
                                query_padding_mask=mask, causal=causal)
    assert_same_as_materialized(m, x, diff_params(m), monkeypatch, causal=causal)


def test_diff_splits_the_value_for_a_kernel_of_one_head_size(monkeypatch):
    """Where the normalizer's kernel takes one head size (flash-attn, Triton; here UNAS without
    the row-wise kernel), v1's value is split into pieces of the query's width, one call each."""
    monkeypatch.setattr(unas.UNAS, "fast_paths", (unas.SDPA, unas.SDPA_MATH))
    m = diff_module(1, "unas", True)
    x, _ = batch()
    calls = m.head_scheme._fast_calls(m.normalizer, heads_of(m, x, None, True))
    assert [[path.name for path, _ in pieces] for pieces in calls] == [["sdpa"] * 2] * 2
    assert_same_as_materialized(m, x, diff_params(m), monkeypatch, causal=True)


def test_diff_materializes_without_a_fast_path_or_with_dropout(monkeypatch):
    x, mask = batch()
    entmax = diff_module(1, "entmax")
    assert entmax.head_scheme.route(entmax.normalizer, heads_of(entmax, x, mask, True)) == "blocked"
    monkeypatch.setattr(type(entmax.normalizer), "fast_paths", ())  # a normalizer without one
    assert entmax.head_scheme.route(entmax.normalizer, heads_of(entmax, x, mask, True)) == "materialized"
    m = diff_module(1)
    h = heads_of(m, x, mask, True)
    dropped = Heads(h.q, h.k, h.v, mask, mask, True, dropout_p=0.1)
    assert m.head_scheme.route(m.normalizer, dropped) == "materialized"


@pytest.mark.parametrize("version", [1, 2])
def test_diff_records_its_effective_weights_from_the_fast_path(version):
    m = diff_module(version).eval()
    x, mask = batch()
    with torch.no_grad(), record_attention(m) as rec:
        out = m(x, key_padding_mask=mask, query_padding_mask=mask, causal=True)
    h = heads_of(m, x, mask, True)
    with torch.no_grad():
        _, weights = m.head_scheme(m.normalizer, h.q, h.k, h.v, mask, mask, True, query=x)
    (record,) = rec.records.values()
    torch.testing.assert_close(record.weights, weights.float())
    torch.testing.assert_close(record.head_outputs, m.head_scheme.attend_heads(m.normalizer, h).out.float())
    assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------- selective
def selective_module(**options):
    torch.manual_seed(0)
    return MultiHeadAttention(E, H, spec={"scheme": "selective", **options}, is_decoder=True).double()


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 queries for these shapes (3 x 2 x 11): three blocks, the last of 3."""
    monkeypatch.setattr(selective_blocks, "MIN_ROWS", 1)
    monkeypatch.setattr(selective_blocks, "BLOCK_ELEMENTS", 3 * H * 11 * 4)
    assert selective_blocks.block_rows(3, H, 11) == 4


@pytest.mark.parametrize("options", [{}, {"exempt_bos": False, "selecting_head": 1}])
def test_selective_by_blocks_equals_the_materialized_logits(options, small_blocks, monkeypatch):
    m = selective_module(**options)
    x, mask = batch()
    assert m.transform.route(m.normalizer, heads_of(m, x, mask, True)) == "blocks"
    params = [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]
    assert_same_as_materialized(m, x, params, monkeypatch, key_padding_mask=mask,
                                query_padding_mask=mask, causal=True)
    assert_same_as_materialized(m, x, params, monkeypatch, causal=True)


@pytest.mark.parametrize("rows", [1, 3, 11])
def test_selective_kernel_for_any_block_size(rows):
    """The kernel alone against the materialized step, values and gradients of q, k, v: one row
    a block, blocks that do not divide the length, one block."""
    m = selective_module()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, H, 11, 8, generator=g, dtype=torch.float64).mul(2).requires_grad_()
               for _ in range(3))
    _, mask = batch()
    out = selective_blocks.selective_attention(q, k, v, mask, mask, 0, True, rows)
    ref = LogitTransform.attend_heads(m.transform, m.normalizer, Heads(q, k, v, mask, mask, True)).out
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    w = torch.randn(out.shape, generator=g, dtype=out.dtype)
    for a, b in zip(torch.autograd.grad((out * w).sum(), [q, k, v]),
                    torch.autograd.grad((ref * w).sum(), [q, k, v])):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_selective_kernel_gives_padded_keys_exactly_nothing_in_float32():
    """float32, logits far below the row's max (where exp is clamped, then set to 0): a padded
    key's value gets exactly no gradient and changes no output, the future's value neither."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, H, 11, 8, generator=g).mul(6).requires_grad_() for _ in range(3))
    _, mask = batch()
    out = selective_blocks.selective_attention(q, k, v, mask, None, 0, True, 4)
    (dv,) = torch.autograd.grad(out.sum(), [v])
    assert (dv[mask[:, None, :, None].expand_as(dv)] == 0).all()
    with torch.no_grad():
        moved = v.detach().clone()
        moved[mask[:, None, :, None].expand_as(moved)] = 1e3
        moved[..., 7:, :] += 1e3  # the future of queries 0-6
        again = selective_blocks.selective_attention(q, k, moved, mask, None, 0, True, 4)
    assert torch.equal(again[..., :7, :], out[..., :7, :])


def test_selective_records_its_weights_and_materializes_elsewhere(small_blocks):
    m = selective_module().eval()
    x, mask = batch()
    h = heads_of(m, x, mask, True)
    with torch.no_grad(), record_attention(m) as rec:
        m(x, key_padding_mask=mask, query_padding_mask=mask, causal=True)
    (record,) = rec.records.values()
    ref = LogitTransform.attend_heads(m.transform, m.normalizer, h)
    torch.testing.assert_close(record.weights, ref.weights.float())
    torch.testing.assert_close(record.head_outputs, ref.out.float())
    # another normalization, or attention dropout: the materialized logits
    sigmoid = MultiHeadAttention(E, H, spec={"scheme": "selective", "normalization": "sigmoid"},
                                 is_decoder=True).double()
    assert sigmoid.transform.route(sigmoid.normalizer, h) == "materialized"
    dropped = Heads(h.q, h.k, h.v, mask, mask, True, dropout_p=0.1)
    assert m.transform.route(m.normalizer, dropped) == "materialized"


# ----------------------------------------------------------------------------- no S x S map
@pytest.mark.parametrize("spec", ["diff", {"scheme": "diff", "version": 2}, "selective"])
def test_no_s_by_s_tensor_is_built_or_kept_for_the_backward(spec, monkeypatch):
    """The materialized weights are never computed, and no tensor the backward keeps has S x S
    entries per example (the materialized path keeps several)."""
    S = 64
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec=spec, is_decoder=True)
    x = torch.randn(2, S, E, requires_grad=True)
    kept = []

    def keep(t):
        kept.append(t.numel())
        return t

    def run():
        kept.clear()
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            out = m(x, causal=True)
        out.sum().backward()
        return max(kept)

    with monkeypatch.context() as patch:
        materialized(m, patch)
        assert run() >= 2 * H * S * S  # the check sees the maps where they are kept
    monkeypatch.setattr(type(m.normalizer), "weights", lambda *a, **k: pytest.fail("materialized"))
    assert run() < 2 * S * S
