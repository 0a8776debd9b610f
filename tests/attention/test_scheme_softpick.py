"""Softpick (Zuhri et al. 2025): the reference in float32 against float64 under every kind of
padding, parity with a re-statement of the authors' `softpick`, its zeros, and its options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.kernel_cases import leaf, padded_problem

from attnlab.attention import AttentionSpec, attend, attention_weights
from attnlab.attention.schemes import NORMALIZERS
from attnlab.attention.schemes.softpick import SoftpickOptions, softpick_weights
from attnlab.errors import ConfigError


def authors_softpick(x: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """A re-statement of `softpick` in zaydzuhri/softpick-attention, naive_softpick_attn.py:
    shift by the (differentiable) row max, eps added to the shifted denominator, -inf entries
    left out of it. Rows must hold a finite entry (theirs gives NaN otherwise)."""
    top = x.max(dim=dim, keepdim=True).values
    diff = (x - top).exp() - (-top).exp()
    kept = torch.where(torch.isfinite(x), diff.abs(), torch.zeros_like(diff))
    return F.relu(diff) / (kept.sum(dim=dim, keepdim=True) + eps)


def run(how, q, k, v, kpm, qpm, causal, **options):
    """The materialized reference ("reference"), or whatever path `attend` takes ("attend": the
    fused CPU kernel where it is built)."""
    if how == "attend":
        return attend(q, k, v, "softpick", kpm, qpm, causal=causal, **options)
    norm = AttentionSpec("softpick", **options).build_normalizer()
    return norm.reference(norm.call(q, k, v, kpm, qpm, causal=causal))


def problem(S, dtype=torch.float64, seed=0, scale=1.5):
    q, k, v, _, kpm, qpm = padded_problem(S, S, 8, B=4, H=2, dtype=dtype, seed=seed, scale=scale)
    return q, k, v, kpm, qpm


def test_scheme_is_registered_as_not_summing_to_one():
    cls = NORMALIZERS["softpick"]
    assert cls.rows_sum_to_one is False and cls.over_queries is False and cls.causal_only is False


@pytest.mark.parametrize("how", ["reference", "attend"])
@pytest.mark.parametrize("S", [1, 2, 9])
@pytest.mark.parametrize("causal", [False, True])
def test_float32_equals_float64_values_and_gradients_under_padding(S, causal, how):
    """Padded keys and queries, an all-padded example (keys), one with every query padded, and
    S = 1 / 2 (one valid key): float32 = float64, no NaN, zeros exactly where padded."""
    q, k, v, kpm, qpm = problem(S)
    g = torch.randn(4, 2, S, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = {}
    for dtype in (torch.float32, torch.float64):
        qq, kk, vv = leaf(q, k, v, dtype=dtype)
        out = run(how, qq, kk, vv, kpm, qpm, causal)
        assert out.dtype == dtype and torch.isfinite(out).all()
        grads = torch.autograd.grad((out.double() * g).sum(), (qq, kk, vv))
        assert all(torch.isfinite(t).all() for t in grads)
        results[dtype] = (out.double(), *(t.double() for t in grads))
    for a, b in zip(results[torch.float32], results[torch.float64]):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    w = attention_weights(q, k, "softpick", kpm, qpm, causal=causal)
    assert torch.isfinite(w).all() and (w >= 0).all()
    assert (w.masked_select(kpm[:, None, None, :].expand_as(w)) == 0).all()  # padded keys: 0
    assert (w[2] == 0).all() and (w[3] == 0).all()  # no valid key / every query padded
    assert (w.sum(-1) <= 1 + 1e-12).all()


def test_one_valid_key_is_its_own_denominator():
    """One valid key with logit s > 0 gets (e^s - 1) / (e^s - 1 + eps) (about 1); with s <= 0, 0."""
    logits = torch.tensor([[[[2.0, -math.inf, -math.inf], [-0.5, -math.inf, -math.inf]]]],
                          dtype=torch.float64, requires_grad=True)
    w = softpick_weights(logits, 1e-3)
    # eps joins the denominator shifted by the row max (as theirs): eps * e^max unshifted
    expected = math.expm1(2.0) / (math.expm1(2.0) + 1e-3 * math.exp(2.0))
    torch.testing.assert_close(w[0, 0, 0], torch.tensor([expected, 0, 0], dtype=torch.float64),
                               atol=1e-15, rtol=0)
    assert (w[0, 0, 1] == 0).all()
    w.sum().backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("low", [-0.3, -50.0, -200.0, -1e4])
def test_rows_of_negative_logits_are_zero_with_finite_gradients(low):
    """All valid logits < 0: every weight 0, and the gradients stay finite even where the
    authors' exp(-max) would overflow float32 (max < -88)."""
    logits = torch.full((1, 1, 2, 5), low).requires_grad_()
    logits.data[0, 0, 1, 3:] = -math.inf
    for dtype in (torch.float32, torch.float64):
        x = logits.to(dtype)
        w = softpick_weights(x, 1e-8)
        assert (w == 0).all()
        (grad,) = torch.autograd.grad((w * torch.arange(5.0, dtype=dtype)).sum(), logits)
        assert torch.isfinite(grad).all() and (grad == 0).all()


def test_keys_with_logits_at_most_zero_get_exactly_zero_and_the_denominator_counts_them():
    s = torch.tensor([1.0, 0.0, -1.0, 2.0], dtype=torch.float64).view(1, 1, 1, 4)
    w = softpick_weights(s, 1e-8).view(4)
    den = sum(abs(math.expm1(x)) for x in (1.0, 0.0, -1.0, 2.0))
    expected = torch.tensor([math.expm1(1.0) / den, 0.0, 0.0, math.expm1(2.0) / den], dtype=torch.float64)
    torch.testing.assert_close(w, expected, atol=1e-7, rtol=1e-7)
    assert w[1] == 0 and w[2] == 0 and w.sum() < 1


@pytest.mark.parametrize("how", ["reference", "attend"])
@pytest.mark.parametrize("causal", [False, True])
def test_parity_with_the_authors_softpick_values_and_gradients(causal, how):
    """On random logits with padding (rows that keep at least one key, as theirs needs), the
    weights, the output and the gradients of q, k, v equal the authors' computation."""
    S = 11
    q, k, v, kpm, qpm = problem(S, seed=3, scale=2.0)
    kpm, qpm = kpm[:2], qpm[:2]  # partial padding and none (theirs has no row without keys)
    q, k, v = (t[:2] for t in (q, k, v))
    qq, kk, vv = leaf(q, k, v)
    ours = run(how, qq, kk, vv, kpm, None, causal)
    logits = qq @ kk.transpose(-2, -1) / math.sqrt(8)
    masked = kpm[:, None, None, :].expand_as(logits)
    if causal:
        masked = masked | ~torch.ones(S, S, dtype=torch.bool).tril()
    theirs = authors_softpick(logits.masked_fill(masked, -math.inf)) @ vv
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-10)
    g = torch.randn_like(ours)
    mine = torch.autograd.grad((ours * g).sum(), (qq, kk, vv))
    ref = torch.autograd.grad((theirs * g).sum(), (qq, kk, vv))
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    w = attention_weights(q, k, "softpick", kpm, None, causal=causal)
    assert (w == 0).any() and (w.sum(-1) < 1).all()  # sparse and sub-stochastic


def test_eps_option_reaches_the_weights():
    s = torch.tensor([0.0, 0.0, 1e-3], dtype=torch.float64).view(1, 1, 1, 3)
    spec = AttentionSpec("softpick", eps=1e-2)
    w_big = spec.build_normalizer().weights(s)
    w_small = AttentionSpec("softpick").build_normalizer().weights(s)
    assert w_big[..., 2] < 0.1 < w_small[..., 2]


def test_options_are_validated():
    assert AttentionSpec("softpick").normalizer_options == SoftpickOptions(eps=1e-8)
    for bad in (0, -1e-6, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match=r"model\.eps=.* must be a finite number > 0 .*model\.eps=1e-8"):
            AttentionSpec("softpick", eps=bad)
    with pytest.raises(ConfigError, match="model.eps='a': .* must be float"):
        AttentionSpec("softpick", eps="a")
    with pytest.raises(ConfigError, match=r"model=softpick has no option epsilon; its options are .*eps"):
        AttentionSpec("softpick", epsilon=1e-6)
    with pytest.raises(ConfigError) as err:
        SoftpickOptions(eps=0.0)
    assert "\n" not in str(err.value)
