"""Every scheme against an independent float64 statement of its formula, written here element by
element from the papers (not from the schemes' code), to 1e-12: the weights `attention_weights`
gives and the output `attend` gives on its fast path (float64 runs on the CPU paths in float64),
with key and query padding, and causal masks where the scheme takes them. Constants a scheme
fixes (SSMax's scale, the sink's logit, sigmoid's bias) must be in the working dtype for this."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention import attend, attention_weights
from attnlab.attention.schemes import NORMALIZERS

F64 = torch.float64
B, H, Q, K, D = 2, 3, 6, 7, 8


def softmax_rows(s: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    e = torch.where(valid, torch.exp(s - s.masked_fill(~valid, -1e300).amax(-1, keepdim=True)), 0.0)
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)


def normalized(p: torch.Tensor, dim: int) -> torch.Tensor:
    total = p.sum(dim, keepdim=True)
    return torch.where(total > 0, p / torch.where(total > 0, total, 1.0), 0.0)


def dnas(s, valid, n_iter=1):
    """n_iter rounds of: each key's column over the queries, then each row over the keys (the
    doubly-normalized attention paper, Eq. 5; Sinkhorn for n_iter > 1)."""
    p = torch.where(valid, torch.exp(s), 0.0)
    for _ in range(n_iter):
        p = normalized(normalized(p, -2), -1)
    return p


def entmax15(s, valid):
    """argmax_p <p, s> + (1 - sum p^1.5) / (1.5 * 0.5): p = [0.5 s - tau]_+^2, sum 1, tau by
    bisection in float64 (Peters et al. 2019, Eq. 4)."""
    z = torch.where(valid, 0.5 * s, -math.inf)
    hi = z.amax(-1, keepdim=True)
    lo = hi - 1.0
    hi, lo = torch.where(torch.isfinite(hi), hi, 0.0), torch.where(torch.isfinite(lo), lo, 0.0)
    for _ in range(200):
        tau = (lo + hi) / 2
        mass = (torch.clamp(z - tau, min=0) ** 2).sum(-1, keepdim=True)
        lo, hi = torch.where(mass > 1, tau, lo), torch.where(mass > 1, hi, tau)
    return torch.where(valid, torch.clamp(z - (lo + hi) / 2, min=0) ** 2, 0.0)


def stickbreaking(s, valid):
    """A_ij = sigmoid(z_ij) prod_{j<k<i} (1 - sigmoid(z_ik)), j < i (Tan et al. 2025, Eq. 2)."""
    w = torch.zeros_like(s)
    for i in range(s.shape[-2]):
        left = torch.ones(s.shape[:2], dtype=s.dtype)
        for j in reversed(range(i)):
            take = torch.sigmoid(s[..., i, j]) * valid[..., i, j]
            w[..., i, j] = take * left
            left = left * (1 - take)
    return w


def softpick(s, valid, eps=1e-8):
    """relu(e^s - 1) / (sum |e^s - 1| + eps), as the authors compute it: numerator and
    denominator scaled by e^-m, m = max(0, the row's max) (Zuhri et al. 2025; their eps is added
    to the scaled denominator)."""
    m = s.masked_fill(~valid, -math.inf).amax(-1, keepdim=True).clamp(min=0)
    shifted = torch.where(valid, torch.exp(s - m) - torch.exp(-m), 0.0)
    return torch.relu(shifted) / (shifted.abs().sum(-1, keepdim=True) + eps)


def valid_keys(valid):
    return valid.sum(-1, keepdim=True).to(F64)


# the formula of each scheme: (logits, valid pairs) -> weights; its options and inputs
FORMULAS = {
    "unas": (softmax_rows, {}),
    "dnas": (dnas, {}),
    "hnas": (lambda s, v: 0.3 * dnas(s, v) + 0.7 * softmax_rows(s, v), {"u": 0.3}),
    "sinkhorn": (lambda s, v: dnas(s, v, n_iter=4), {"n_iter": 4}),
    "entmax": (entmax15, {"alpha": 1.5}),
    # the bias a learned b starts at, -log(bias_init_n): a constant (log_n: test_rowwise_fused.py)
    "sigmoid": (lambda s, v: torch.where(v, torch.sigmoid(s - math.log(50)), 0.0),
                {"bias": "learned", "bias_init_n": 50}),
    "sink": (lambda s, v: torch.where(v, torch.exp(s), 0.0)
             / (math.exp(0.3) + torch.where(v, torch.exp(s), 0.0).sum(-1, keepdim=True)),
             {"sink_init": 0.3, "learned": False}),
    "softpick": (softpick, {}),
    "ssmax": (lambda s, v: softmax_rows(0.7 * torch.log(valid_keys(v).clamp(min=1)) * s, v),
              {"scale_init": 0.7, "learned": False}),
    "stickbreaking": (stickbreaking, {}),
}


def problem(causal: bool):
    g = torch.Generator().manual_seed(3)
    q, k = (1.3 * torch.randn(B, H, n, D, generator=g, dtype=F64) for n in (Q, K))
    v = torch.randn(B, H, K, D, generator=g, dtype=F64)
    kpm = torch.zeros(B, K, dtype=torch.bool)
    kpm[1, -2:] = True
    qpm = torch.zeros(B, Q, dtype=torch.bool)
    qpm[1, -1] = True
    valid = ~kpm[:, None, None, :] & ~qpm[:, None, :, None]
    if causal:
        valid = valid & torch.ones(Q, K, dtype=torch.bool).tril()
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    return q, k, v, kpm, qpm, valid.expand(B, H, Q, K), s


@pytest.mark.parametrize("scheme", sorted(NORMALIZERS))
def test_float64_weights_and_output_equal_the_formula(scheme):
    if scheme not in FORMULAS:
        pytest.skip(f"no independent float64 statement of {scheme} here (esp: its transport plans "
                    f"are checked against the authors' in test_scheme_esp.py)")
    formula, options = FORMULAS[scheme]
    cls = NORMALIZERS[scheme]
    for causal in ((True,) if cls.causal_only else (False, True) if not cls.over_queries else (False,)):
        q, k, v, kpm, qpm, valid, s = problem(causal)
        expected = formula(s, valid)
        weights = attention_weights(q, k, scheme, kpm, qpm, causal, **options)
        assert weights.dtype == F64
        torch.testing.assert_close(weights, expected, atol=1e-12, rtol=0, msg=f"{scheme} causal={causal}")
        out = attend(q, k, v, scheme, kpm, qpm, causal, **options)
        torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0, msg=f"{scheme} causal={causal}")
