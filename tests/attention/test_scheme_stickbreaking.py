"""Stick-breaking attention (Tan et al., ICLR 2025): the reference in float32 against float64
under every kind of padding, parity with a re-statement of the authors' `sb_ref.stickbreaking`,
its refusal outside causal attention, the blocked kernel against the reference, and options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.kernel_cases import RecordShapes, leaf, padded_problem

from attnlab.attention import AttentionSpec, MultiHeadAttention, attend, attention_weights
from attnlab.attention.functional import candidates
from attnlab.attention.kernels import stickbreaking as sb
from attnlab.attention.schemes import NORMALIZERS
from attnlab.attention.schemes.stickbreaking import StickBreakingOptions
from attnlab.errors import ConfigError


def authors_stickbreaking(q, k, v, mask, cum_weight):
    """A re-statement of `stickbreaking` in shawntan/stickbreaking-attention,
    stickbreaking_attention/sb_ref.py: masked pairs (mask True) get log z = -1e5 and log beta = 0;
    the suffix sums are a matmul with cum_weight = ones.tril(-1) (cum_weight[j, k] = 1 for j > k).
    Returns the output and the remainder 1 - sum_j A_ij."""
    z = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    log_z = F.logsigmoid(z).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-z).masked_fill(mask, 0)
    att = (log_z + torch.einsum("bhij,jk->bhik", log_beta, cum_weight.to(log_beta))).exp()
    return att @ v, 1 - att.sum(dim=-1)


def authors_mask(S, attend_current):
    """Their test's masks: the query's own position is masked unless attend_current."""
    mask = torch.ones(S, S).triu(1 if attend_current else 0).bool()
    return mask, torch.ones(S, S).tril(-1)


def problem(S_q, S_k=None, dtype=torch.float64, seed=0, scale=1.5, d=8, H=2):
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k or S_q, d, B=4, H=H, dtype=dtype, seed=seed, scale=scale)
    return q, k, v, kpm, qpm


def test_scheme_is_registered_as_causal_only_and_sub_stochastic():
    cls = NORMALIZERS["stickbreaking"]
    assert cls.causal_only and not cls.rows_sum_to_one and not cls.over_queries
    assert [p.name for p in cls.fast_paths] == ["blocked"]


@pytest.mark.parametrize("S", [1, 2, 9])
@pytest.mark.parametrize("attend_current", [False, True])
def test_float32_equals_float64_values_and_gradients_under_padding(S, attend_current):
    """Padded keys and queries, an example with every key padded, one with every query padded,
    and S = 1 / 2 (no key or one key): float32 = float64, no NaN, zeros where padded."""
    q, k, v, kpm, qpm = problem(S)
    g = torch.randn(4, 2, S, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = {}
    for dtype in (torch.float32, torch.float64):
        qq, kk, vv = leaf(q, k, v, dtype=dtype)
        out = attend(qq, kk, vv, "stickbreaking", kpm, qpm, causal=True, attend_current=attend_current)
        assert out.dtype == dtype and torch.isfinite(out).all()
        grads = torch.autograd.grad((out.double() * g).sum(), (qq, kk, vv))
        assert all(torch.isfinite(t).all() for t in grads)
        results[dtype] = (out.double(), *(t.double() for t in grads))
    for a, b in zip(results[torch.float32], results[torch.float64]):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    w = attention_weights(q, k, "stickbreaking", kpm, qpm, causal=True, attend_current=attend_current)
    assert torch.isfinite(w).all() and (w >= 0).all()
    assert (w.masked_select(kpm[:, None, None, :].expand_as(w)) == 0).all()  # padded keys: 0
    assert (w.triu(0 if not attend_current else 1) == 0).all()  # the future (and self unless attend_current)
    assert (w[2] == 0).all() and (w[3] == 0).all()
    assert (w.sum(-1) <= 1 + 1e-12).all()  # the remainder stays unassigned
    if not attend_current:
        assert (w[..., 0, :] == 0).all()  # the first query has no key


@pytest.mark.parametrize("attend_current", [False, True])
def test_parity_with_the_authors_reference_values_gradients_and_remainder(attend_current):
    """Random logits with padded keys (absent: no share, no stick consumed, as their mask does)
    and padded queries (rows left out of the loss): output, remainder and q, k, v gradients."""
    S = 12
    q, k, v, kpm, qpm = problem(S, seed=5, scale=2.0)
    qq, kk, vv = leaf(q, k, v)
    ours = attend(qq, kk, vv, "stickbreaking", kpm, qpm, causal=True, attend_current=attend_current)
    causal_mask, cum = authors_mask(S, attend_current)
    mask = causal_mask | kpm[:, None, None, :]
    theirs, rem = authors_stickbreaking(qq, kk, vv, mask, cum)
    rows = (~qpm)[:, None, :, None].double()  # padded queries: ours are 0, theirs are not masked
    torch.testing.assert_close(ours, theirs * rows, atol=1e-12, rtol=1e-10)
    w = attention_weights(q, k, "stickbreaking", kpm, qpm, causal=True, attend_current=attend_current)
    torch.testing.assert_close((1 - w.sum(-1)) * rows[..., 0], rem.detach() * rows[..., 0],
                               atol=1e-12, rtol=0)
    g = torch.randn_like(ours) * rows
    mine = torch.autograd.grad((ours * g).sum(), (qq, kk, vv))
    ref = torch.autograd.grad((theirs * g).sum(), (qq, kk, vv))
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_a_padded_key_is_absent():
    """Padding key 2 gives the weights of the same problem with key 2 deleted."""
    q, k, _, _, _ = problem(7, seed=2)
    kpm = torch.zeros(4, 7, dtype=torch.bool)
    kpm[:, 2] = True
    w = attention_weights(q, k, "stickbreaking", kpm, causal=True)
    keep = [0, 1, 3, 4, 5, 6]
    qd, kd = q[..., keep, :], k[..., keep, :]
    wd = attention_weights(qd, kd, "stickbreaking", causal=True)
    # rows 3.. of the padded problem are rows 2.. of the deleted one (row 2 there is query 3 here)
    torch.testing.assert_close(w[..., keep, :][..., keep][..., 2:, :], wd[..., 2:, :], atol=1e-12, rtol=0)
    assert (w[..., 2] == 0).all()


def test_refused_outside_causal_attention_with_one_line():
    q, k, v, _, _ = problem(5)
    for call in (lambda: attend(q, k, v, "stickbreaking"),
                 lambda: attention_weights(q, k, "stickbreaking"),
                 lambda: MultiHeadAttention(16, 2, spec="stickbreaking")(torch.randn(2, 5, 16))):
        with pytest.raises(ConfigError, match="causal attention only") as err:
            call()
        assert "\n" not in str(err.value) and "model=unas" in str(err.value)
    # the same module runs causally (a decoder's self-attention)
    out = MultiHeadAttention(16, 2, spec="stickbreaking")(torch.randn(2, 5, 16), causal=True)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("S_q,S_k", [(13, 13), (10, 13), (13, 10), (1, 6)])
@pytest.mark.parametrize("attend_current", [False, True])
def test_blocked_kernel_equals_the_reference(S_q, S_k, attend_current):
    """Blocks of 4 queries (the last one short), padding of every kind, S_q != S_k (top-left
    aligned causal mask): values and gradients equal the materialized reference."""
    q, k, v, kpm, qpm = problem(S_q, S_k, seed=7)
    norm = AttentionSpec("stickbreaking", attend_current=attend_current).build_normalizer()
    g = torch.randn(4, 2, S_q, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    q1, k1, v1 = leaf(q, k, v)
    ref = norm.reference(norm.call(q1, k1, v1, kpm, qpm, causal=True))
    q2, k2, v2 = leaf(q, k, v)
    blocked = sb.stickbreaking_attend(q2, k2, v2, kpm, qpm, attend_current, block_size=4)
    torch.testing.assert_close(blocked, ref, atol=1e-12, rtol=1e-10)
    for a, b in zip(torch.autograd.grad((blocked * g).sum(), (q2, k2, v2)),
                    torch.autograd.grad((ref * g).sum(), (q1, k1, v1))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    with torch.no_grad():  # without autograd: no checkpoint, same values
        torch.testing.assert_close(sb.stickbreaking_attend(q, k, v, kpm, qpm, attend_current, 4), ref.detach())


def test_the_path_serves_long_causal_calls_only(monkeypatch):
    assert candidates("stickbreaking", "cpu", torch.float32, causal=True) == ["blocked", "reference"]
    assert candidates("stickbreaking", "cuda", torch.bfloat16, causal=True) == ["blocked", "reference"]
    assert candidates("stickbreaking", "cpu", torch.float32, dropout_p=0.1, causal=True) == ["reference"]
    assert candidates("stickbreaking", "cpu", torch.float16, causal=True) == ["reference"]
    served = []
    real = sb.stickbreaking_attend
    monkeypatch.setattr(sb, "stickbreaking_attend", lambda *a, **kw: served.append(1) or real(*a, **kw))
    q, k, v, kpm, qpm = problem(9)
    attend(q, k, v, "stickbreaking", kpm, qpm, causal=True)  # 81 pairs: the reference
    assert not served
    monkeypatch.setattr(sb, "MIN_PAIRS", 16)
    monkeypatch.setitem(sb.BLOCK_SIZE, "cpu", 4)
    out = attend(q, k, v, "stickbreaking", kpm, qpm, causal=True)
    assert served
    ref = attention_weights(q, k, "stickbreaking", kpm, qpm, causal=True) @ v
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    # float32 in, float32 out, through the path
    out32 = attend(q.float(), k.float(), v.float(), "stickbreaking", kpm, qpm, causal=True)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), ref, atol=1e-5, rtol=1e-4)


def test_s2048_runs_blocked_without_an_s_by_s_tensor():
    """At S = 2048 the blocked path serves, no tensor of the forward or the backward holds S x S
    entries (the blocks live inside the C++ kernel on the CPU), and autograd keeps O(S) for the
    backward (the blocks are recomputed there, not stored)."""
    S = 2048
    assert S * S > sb.MIN_PAIRS
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, S, 8, generator=g).requires_grad_() for _ in range(3))
    kpm = torch.zeros(1, S, dtype=torch.bool)
    kpm[0, -100:] = True
    saved = []  # what autograd keeps for the backward (a checkpointed block keeps its inputs only)

    def pack(t):
        saved.append(t.numel())
        return t

    with RecordShapes() as rec:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = attend(q, k, v, "stickbreaking", kpm, causal=True)
        out.square().sum().backward()
    assert sum(saved) < 64 * S * 8  # O(S d), not O(S^2)
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert rec.largest <= sb.BLOCK_SIZE["cpu"] * S < S * S
    # spot check: the last 64 rows equal the reference's rows (computed for those rows only)
    with torch.no_grad():
        logits = q[..., -64:, :] @ k.transpose(-2, -1) / math.sqrt(8)
        logits = logits.masked_fill(kpm[:, None, None, :], -math.inf)
        w = sb.stickbreaking_weights(logits, False, query_offset=S - 64)
        torch.testing.assert_close(out[..., -64:, :], w @ v, atol=1e-5, rtol=1e-5)


def test_options_are_validated():
    assert AttentionSpec("stickbreaking").normalizer_options == StickBreakingOptions(attend_current=False)
    assert AttentionSpec("stickbreaking", attend_current=True).normalizer_options.attend_current
    with pytest.raises(ConfigError, match="model.attend_current='yes': .* must be bool"):
        AttentionSpec("stickbreaking", attend_current="yes")
    with pytest.raises(ConfigError, match=r"model=stickbreaking has no option attend_self; its options are .*attend_current"):
        AttentionSpec("stickbreaking", attend_self=True)
    with pytest.raises(ConfigError, match=r"model\.attend_current=1 must be true or false .*model\.attend_current=false") as err:
        StickBreakingOptions(attend_current=1)
    assert "\n" not in str(err.value)
