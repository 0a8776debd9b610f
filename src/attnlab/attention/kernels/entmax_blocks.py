"""alpha-entmax attention by strips of query rows, without the S x S map (the approach of
AdaSplash, Goncalves et al. 2025, arXiv 2502.12082, code: github.com/deep-spin/adasplash).

For each query row i the weights are

    p_ij = [(alpha - 1) z_ij - tau_i]_+ ^ (1 / (alpha - 1)),   sum_j p_ij = 1,

over the valid keys j (z = q.k / sqrt(d)), as the `entmax` package computes them (entmax15 for
alpha = 1.5, sparsemax for 2, entmax_bisect otherwise). Here the rows are taken a strip at a time:
a block of query rows against every key it may see (causal: only the keys up to the strip's last
query, so the blocks above the diagonal are never computed). A strip's scores are held once
(rows x keys, at most `BLOCK_ELEMENTS` per strip, never S x S), and on them:

1. the threshold tau_i of every row at once, by Newton's method on
   f(tau) = sum_j [x_ij - tau]_+^(1/(alpha-1)) - 1 (x = (alpha - 1)(z - max_j z)), safeguarded
   by bisection within the bracket [-1, -(1/n)^(alpha-1)] that holds tau (AdaSplash's
   `halley_bisect_update` does the same with Halley steps). f is convex for alpha <= 2 and
   concave above, so Newton started at the bracket's end where f >= 0 (alpha <= 2) or f <= 0
   (alpha > 2) moves monotonically to the root; for sparsemax it is the exact support iteration
   (f is piecewise linear) and stops at the exact tau. The loop stops when no row's tau moves by
   more than `tol`, after at most `n_iter` steps (measured at S = 4,096, random q, k: a median of
   4-9 steps a strip over alpha = 1.25, 1.5, 2, at most 10);
2. p, normalized by its sum (a no-op at the exact tau; the `entmax` package's bisection does
   the same), and out_i = sum_j p_ij v_j.

Per row only tau, the row max and the sum of p are kept for the backward, which recomputes each
strip's scores and applies the entmax Jacobian of the `entmax` package (Entmax15Function,
SparsemaxBisectFunction, EntmaxBisectFunction: all the same formula): with s_ij = p_ij^(2-alpha) on
the support (0 off it) and g_ij = dO_i . v_j,

    dz_ij = s_ij (g_ij - sum_k s_ik g_ik / sum_k s_ik).

Attention dropout uses the counter-based mask of `kernels/dropout.py`, generated per strip, so a
seed drops the same weights as on the reference. Masked keys get 0; a row without any valid key
(or a padded query) gives 0 and passes no gradient, as the reference does.

Cost: one pass of QK^T and one of PV (SDPA's forward), plus per Newton step ~4 element-wise
passes over the strip (sub, clamp, the two row sums): the floor is SDPA's seven products plus
(steps x 4 + ~8) passes over the S^2 / 2 causal scores. Measured (bench/causal_long.py, S = 4,096
causal, B=1, H=12, d=64, one thread): fwd+bwd 2.6x SDPA's CPU time, peak memory 0.81x. The strips
are torch ops, ~40 of them a strip: with several intra-op threads on a loaded machine each op
waits at a thread barrier (measured ~30 ms an op with 2 threads at load 12, whatever its size),
and that, not the arithmetic, sets the time; a fused kernel (one parallel loop over strips) would
not pay it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.attention.kernels import dropout

# Scores held at once per strip (elements of rows x keys, all heads of the strip together): 2^18
# float32 = 1 MiB; a few of them live at a time (scores, their clipped copy, p, the backward's g).
# Measured at S = 4,096 (B=1, H=12, d=64, causal, one thread): peak memory 1.09x SDPA's at 2^18,
# 1.17x at 2^19, 1.42x at 2^20, for CPU times within the noise of each other
BLOCK_ELEMENTS = 1 << 18
MIN_ROWS = 16  # a strip has at least this many rows (fewer: the per-strip overhead dominates)
# and at most this many: causal strips compute the upper half of their diagonal square in vain
# (rows^2 / 2 of the rows x S_k scores), and smaller strips stay in cache
MAX_ROWS = 256
N_ITER = 50  # the most Newton / bisection steps (bisection alone halves the bracket 50 times)


def default_tol(dtype: torch.dtype) -> float:
    """The change of tau (on the scale of the bracket, width <= 1) below which a row has
    converged: a few ulps of 1 in the computing dtype."""
    return 8 * torch.finfo(dtype).eps


def entmax_attend(q: Tensor, k: Tensor, v: Tensor, alpha: float,
                  key_padding_mask: Tensor | None = None, query_padding_mask: Tensor | None = None,
                  causal: bool = False, dropout_p: float = 0.0, n_iter: int = N_ITER,
                  tol: float | None = None, block_elements: int | None = None) -> Tensor:
    """alpha-entmax attention (B, H, S_q, d_v) in q's dtype, by strips (see the module doc).
    Masks: bool (B, S), True = padding; causal: top-left aligned (key j <= query i)."""
    seed = dropout.draw_seed() if dropout_p > 0.0 else 0
    tol = default_tol(q.dtype) if tol is None else tol
    block_elements = BLOCK_ELEMENTS if block_elements is None else block_elements
    return _EntmaxBlocks.apply(q, k, v, float(alpha), key_padding_mask, query_padding_mask,
                               bool(causal), float(dropout_p), seed, int(n_iter), float(tol),
                               int(block_elements))


def strips(n_heads: int, s_q: int, s_k: int, causal: bool, block_elements: int):
    """(head slice, first row, end row, keys seen) of each strip: `rows` query rows of `heads`
    heads, sized so that heads x rows x S_k <= block_elements (at least MIN_ROWS rows, one head);
    causal: a strip sees the keys up to its last row only."""
    rows = min(s_q, MAX_ROWS, max(MIN_ROWS, block_elements // max(s_k, 1)))
    heads = max(1, min(n_heads, block_elements // max(rows * s_k, 1)))
    for h0 in range(0, n_heads, heads):
        for i0 in range(0, s_q, rows):
            i1 = min(i0 + rows, s_q)
            yield slice(h0, min(h0 + heads, n_heads)), i0, i1, min(i1, s_k) if causal else s_k


class _EntmaxBlocks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, alpha, key_padding_mask, query_padding_mask, causal, dropout_p, seed,
                n_iter, tol, block_elements):
        B, H, S_q, _ = q.shape
        S_k = k.shape[-2]
        qf, kf, vf = (t.reshape(B * H, t.shape[-2], t.shape[-1]) for t in (q, k, v))
        key_bias = _key_bias(key_padding_mask, H, qf.dtype)
        out = q.new_zeros(B * H, S_q, v.shape[-1])
        # per row: the threshold (relative to the row max, in units of (alpha - 1) z), the row max
        # of (alpha - 1) z and the sum of p before normalization: what the backward recomputes p from
        tau = q.new_zeros(B * H, S_q, 1)
        row_max = q.new_zeros(B * H, S_q, 1)
        total = q.new_zeros(B * H, S_q, 1)
        for heads, i0, i1, keys in strips(B * H, S_q, S_k, causal, block_elements):
            x, m, has_key = _shifted_scores(qf, kf, heads, i0, i1, keys, key_bias, causal, alpha)
            t = _threshold(x, has_key, alpha, n_iter, tol)
            p = _weights(x.sub_(t).clamp_(min=0.0), alpha)
            z = p.sum(-1, keepdim=True)
            tau[heads, i0:i1], row_max[heads, i0:i1], total[heads, i0:i1] = t, m, z
            if dropout_p > 0.0:
                p = p.mul_(_keep(seed, heads, i0, i1, keys, S_q, dropout_p, q))
            # normalized by the row sum (a no-op at the exact tau) after the product, per row
            out[heads, i0:i1] = torch.matmul(p, vf[heads, :keys]).div_(_nonzero(z))
        query_pad = _per_head(query_padding_mask, H)
        if query_pad is not None:  # a padded query's row is all masked in the reference: 0
            out.masked_fill_(query_pad[..., None], 0.0)
        ctx.save_for_backward(q, k, v, tau, row_max, total, key_padding_mask, query_padding_mask)
        ctx.options = (alpha, causal, dropout_p, seed, block_elements)
        return out.view(B, H, S_q, v.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, tau, row_max, total, key_padding_mask, query_padding_mask = ctx.saved_tensors
        alpha, causal, dropout_p, seed, block_elements = ctx.options
        B, H, S_q, d = q.shape
        S_k = k.shape[-2]
        scale = 1.0 / math.sqrt(d)
        qf, kf, vf = (t.reshape(B * H, t.shape[-2], t.shape[-1]) for t in (q, k, v))
        go = grad_out.reshape(B * H, S_q, v.shape[-1]).to(q.dtype)
        query_pad = _per_head(query_padding_mask, H)
        if query_pad is not None:  # nothing flows back through a padded query's row
            go = go.masked_fill(query_pad[..., None], 0.0)
        key_bias = _key_bias(key_padding_mask, H, qf.dtype)
        # p = c^(1/(alpha-1)) / z with c = [x - tau]_+, and its slope p^(2-alpha) = s / z^(2-alpha)
        # with s = c^((2-alpha)/(alpha-1)): the per-row factors 1/z and z^(alpha-2) are applied
        # to the rows of dO and q (rows x d) instead of to the strips (rows x keys)
        z = _nonzero(total)
        slope_factor = z ** (alpha - 2.0) * scale
        dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        for heads, i0, i1, keys in strips(B * H, S_q, S_k, causal, block_elements):
            x, _, _ = _shifted_scores(qf, kf, heads, i0, i1, keys, key_bias, causal, alpha,
                                      row_max[heads, i0:i1])
            clipped = x.sub_(tau[heads, i0:i1]).clamp_(min=0.0)
            s = _slopes(clipped, alpha)
            p = _weights(clipped, alpha)
            g = torch.matmul(go[heads, i0:i1], vf[heads, :keys].transpose(-2, -1))
            if dropout_p > 0.0:
                keep = _keep(seed, heads, i0, i1, keys, S_q, dropout_p, q)
                p = p * keep
                g.mul_(keep)
            dv[heads, :keys] += torch.matmul(p.transpose(-2, -1), go[heads, i0:i1] / z[heads, i0:i1])
            # the entmax Jacobian: dz = s (g - sum(s g) / sum(s)); a row without support gives 0
            mean = _row_dot(s, g) / _nonzero(s.sum(-1, keepdim=True))
            dz = g.sub_(mean).mul_(s)
            factor = slope_factor[heads, i0:i1]
            dq[heads, i0:i1] = torch.matmul(dz, kf[heads, :keys]).mul_(factor)
            dk[heads, :keys] += torch.matmul(dz.transpose(-2, -1), qf[heads, i0:i1] * factor)
        return (dq.view(B, H, S_q, d), dk.view(B, H, S_k, d), dv.view(B, H, S_k, v.shape[-1]),
                None, None, None, None, None, None, None, None, None)


def _nonzero(total: Tensor) -> Tensor:
    """A row sum to divide by: 1 where it is 0 (a row without support, whose numerator is 0)."""
    return torch.where(total > 0, total, torch.ones_like(total))


def _per_head(mask: Tensor | None, heads: int) -> Tensor | None:
    """A (B, S) padding mask as (B * H, S), the row of each flattened head."""
    return None if mask is None else mask.repeat_interleave(heads, dim=0)


def _key_bias(mask: Tensor | None, heads: int, dtype: torch.dtype) -> Tensor | None:
    """A (B, S_k) key padding mask as an additive (B * H, 1, S_k) bias: -inf at padded keys (an
    add is several times faster than a masked_fill over a strip)."""
    if mask is None:
        return None
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    return bias.repeat_interleave(heads, dim=0)[:, None, :]


def _shifted_scores(qf, kf, heads, i0, i1, keys, key_bias, causal, alpha, row_max=None):
    """x = (alpha - 1)(z - max_j z) of one strip (rows i0:i1, keys 0:keys), -inf where masked;
    the row max of (alpha - 1) z (0 for a row without any valid key, which stays all -inf);
    whether the row has a valid key. The backward passes the forward's row max, so that it
    recomputes the same x."""
    scale = (alpha - 1.0) / math.sqrt(qf.shape[-1])  # folded into the rows of q (rows x d)
    x = torch.matmul(qf[heads, i0:i1] * scale, kf[heads, :keys].transpose(-2, -1))
    if key_bias is not None:
        x.add_(key_bias[heads, :, :keys])
    if causal and keys > i0:  # only the strip's diagonal square holds future keys
        rows = torch.arange(i0, i1, device=x.device)[:, None]
        cols = torch.arange(i0, keys, device=x.device)[None, :]
        x[..., i0:keys].masked_fill_(cols > rows, float("-inf"))
    has_key = None
    if row_max is None:
        row_max = x.amax(-1, keepdim=True)
        has_key = torch.isfinite(row_max)
        row_max = torch.where(has_key, row_max, torch.zeros_like(row_max))
    return x.sub_(row_max), row_max, has_key


def _weights(clipped: Tensor, alpha: float) -> Tensor:
    """p = c^(1/(alpha-1)) of the clipped c = [x - tau]_+ (sparsemax: c itself, not a copy)."""
    if alpha == 2.0:
        return clipped
    if alpha == 1.5:
        return clipped.square()
    return clipped.pow(1.0 / (alpha - 1.0))


def _slopes(clipped: Tensor, alpha: float) -> Tensor:
    """dp/dx = p^(2-alpha) = c^((2-alpha)/(alpha-1)) on the support, 0 off it (alpha = 1.5: c
    itself, not a copy)."""
    if alpha == 2.0:
        return torch.sign(clipped)  # 1 on the support (c > 0), 0 off it
    if alpha == 1.5:
        return clipped
    exponent = (2.0 - alpha) / (alpha - 1.0)
    if exponent > 0:
        return clipped.pow(exponent)  # 0^e = 0 off the support
    return torch.where(clipped > 0, clipped.pow(exponent), 0.0)  # alpha > 2: 0^e would be inf


def _threshold(x: Tensor, has_key: Tensor, alpha: float, n_iter: int, tol: float) -> Tensor:
    """tau (rows, 1) with sum_j [x_j - tau]_+^(1/(alpha-1)) = 1 for every row of x (row max 0),
    by Newton steps safeguarded by bisection (see the module doc). A row without any valid key
    (`has_key` False) keeps tau = -1 (its weights are all 0 whatever tau is)."""
    lo = torch.full_like(x[..., :1], -1.0)  # f(lo) >= 0: the max alone gives 1
    hi = torch.full_like(lo, -(1.0 / x.shape[-1]) ** (alpha - 1.0))  # f(hi) <= 0: n terms <= 1/n
    tau = lo.clone() if alpha <= 2.0 else hi.clone()  # the side Newton approaches monotonically
    clipped = torch.empty_like(x)
    for _ in range(n_iter):
        torch.sub(x, tau, out=clipped).clamp_(min=0.0)
        slope = _slopes(clipped, alpha)
        f = _row_dot(slope, clipped) - 1.0  # sum_j p_j - 1, as p = slope * c
        df = slope.sum(-1, keepdim=True) / (alpha - 1.0)  # -f'(tau)
        lo = torch.where(f > 0, tau, lo)
        hi = torch.where(f < 0, tau, hi)
        step = tau + f / torch.where(df > 0, df, 1.0)
        inside = (step >= lo) & (step <= hi) & (df > 0)
        new = torch.where(has_key, torch.where(inside, step, 0.5 * (lo + hi)), tau)
        moved = (new - tau).abs().max()
        tau = new
        if moved <= tol:
            break
    return tau


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """sum_j a_ij b_ij per row, (..., rows, 1), without the product a * b (einsum: measured 3x
    faster than (a * b).sum and 8x faster than a batched matrix-vector product)."""
    return torch.einsum("...j,...j->...", a, b).unsqueeze(-1)


def _keep(seed: int, heads: slice, i0: int, i1: int, keys: int, s_q: int, p: float,
          like: Tensor) -> Tensor:
    """The strip's part of `dropout.keep_mask(seed, (B, H, S_q, S_k), p)`, scaled by 1/(1-p): the
    same hash of (row = flattened head * S_q + i, key j), in the dtype of `like`."""
    device = like.device
    seed_lo, seed_hi = dropout.seed_halves(seed)
    head_ids = torch.arange(heads.start, heads.stop, device=device)[:, None]
    rows = (head_ids * s_q + torch.arange(i0, i1, device=device)[None, :]).reshape(-1)
    key = dropout.mix32((dropout.mix32(rows ^ seed_lo) + seed_hi) & 0xFFFFFFFF)
    cols = dropout._mul32(torch.arange(keys, dtype=torch.int64, device=device), 0x9E3779B9)
    h = dropout.mix32((key[:, None] + cols[None, :]) & 0xFFFFFFFF)
    keep = (h >> 1) >= dropout.threshold(p)
    return keep.view(heads.stop - heads.start, i1 - i0, keys).to(like.dtype).mul_(1.0 / (1.0 - p))
