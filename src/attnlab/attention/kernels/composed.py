"""Attention for unas / dnas / hnas composed from ATen's CPU flash-attention kernel: never
materializes S_q x S_k (forward or backward).

For DNAS / HNAS this module is the fallback path where the fused kernel (`fused.py`) cannot be
built; it is exact, but each of its passes
recomputes the scores, so it is slower (measured in bench/attention.py: method *_composed).

Everything runs on one CPU kernel, `aten._scaled_dot_product_flash_attention_for_cpu` (flash
attention; it returns the output and the row log-sum-exp) and its backward. Facts used
(measured with torch 2.13; bench/attention.py): the kernel takes an additive float mask, broadcast
over queries when it is a contiguous (B, H, 1, S_k) tensor; q, k, v must share one head size;
its backward returns gradients of q, k, v only.

DNAS: pi_ij = softmax_j(s_ij - c_j) with c_j = logsumexp over valid queries i of s_ij.
  forward  1. column pass: c is the row LSE of the transposed problem, flash(k, q, q) with the
              query padding as its key mask; its output Xo_j = sum_i xi_ij q_i (xi = the column
              softmax) is kept for the backward.
           2. main pass: flash(q, k, v) with the per-key bias -c (and -inf on padded keys).
  backward 3. flash backward of the main pass gives dq, dk, dv and, through one extra head
              column (ones in q, zeros in k), the bias gradient: that column of dk is
              scale * sum_i dS_ij, so dc_j = -sum_i dS_ij.
           4. the gradient through c_j = logsumexp_i s_ij is ds_ij = dc_j xi_ij, i.e.
              dk_j += scale dc_j Xo_j, and dq_i += scale sum_j xi_ij dc_j k_j, which is one
              forward pass flash(q, k, dc * k) with bias -c, times exp(its LSE).
  Cost: 3 forward passes + 1 backward (head size d + 1); memory O(S) beyond the inputs.

HNAS: u * dnas + (1 - u) * unas; the two weight matrices differ, so each needs its own main
pass and backward. What is shared: the column pass, and step 4 disappears. Since
xi_ij = P_unas_ij exp(r_i - c_j) (r = UNAS row LSE), the term dc_j xi_ij is a rank-one
correction inside the UNAS backward: one extra head column, exp(r_i - m) in dout and
dc_j exp(m - c_j) in v (0 in out, so the kernel's D_i is unchanged), makes that single call
return dq, dk with the c-gradient included. Cost: 3 forward passes + 2 backward (head size
d + 1). When exp(+-(range)) could leave float32 (FOLD_MAX_RANGE), step 4 is used instead.
(Tried and dropped: one main pass over the values [a v, a, b v, b] with a, b = exp(+-c/2) gives
both outputs exactly, but the kernel wants q, k padded to that head size (130) and its cost
grows linearly with it: measured slower than two passes at 64.)

All normalization runs in float32 (float64 stays float64). Padded queries get zero output rows
and are left out of c; a row with every key padded gives zeros; nothing is ever NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

# Bytes of one (B_chunk, H, S, d + 1) float tensor in the backward: it runs over batch chunks of
# about this size so that its padded temporaries stay small next to the inputs.
CHUNK_BYTES = 16 * 2**20


def padding_bias(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, 1, 1, S) additive mask: 0 for valid, -inf for padded; None without padding."""
    if mask is None:
        return None
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(mask, float("-inf"))[:, None, None, :]


def key_bias(kbias: Tensor | None, c: Tensor) -> Tensor:
    """Contiguous (B, H, 1, S_k) bias -c (+ -inf on padded keys). A non-contiguous bias would
    make the kernel expand it to a full (B, H, S_q, S_k) mask."""
    bias = -c[:, :, None, :]
    if kbias is not None:
        bias = bias + kbias
    return bias.contiguous()


def _widen(x: Tensor, width: int) -> Tensor:
    """Zero-pad the head dim to `width` (zero columns change neither scores nor outputs)."""
    return F.pad(x, (0, width - x.shape[-1]))


def _batch_chunks(batch: int, per_item_bytes: int) -> list[slice]:
    step = max(1, CHUNK_BYTES // max(1, per_item_bytes))
    return [slice(b0, min(batch, b0 + step)) for b0 in range(0, batch, step)]


def _sl(x: Tensor | None, s: slice) -> Tensor | None:
    return None if x is None else x[s]


def column_pass(q: Tensor, k: Tensor, query_padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """c_j = logsumexp_i s_ij over valid queries (B, H, S_k), and Xo_j = sum_i xi_ij q_i.

    One flash call on the transposed problem (keys act as queries). A column with no valid
    query gets c = 0 and Xo = 0 from the kernel.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    xo, lse = _flash(k, q, q, attn_mask=padding_bias(query_padding_mask, q.dtype), scale=scale)
    return lse.contiguous(), xo


def _flash_any(q, k, v, bias, scale, causal=False):
    """Flash forward for any head sizes (zero-padded to one; zeros change no score or output)."""
    d, d_v = q.shape[-1], v.shape[-1]
    if d == d_v:
        return _flash(q, k, v, 0.0, causal, attn_mask=bias, scale=scale)
    width = max(d, d_v)
    out, lse = _flash(_widen(q, width), _widen(k, width), _widen(v, width), 0.0, causal,
                      attn_mask=bias, scale=scale)
    return out[..., :d_v], lse


def _backward_with_column(grad, q, k, v, out, lse, bias, scale, q_col=None, v_col=None,
                          grad_col=None):
    """Flash backward with one extra head column (the last, after zero padding) in q, v and grad.

    - q_col=1 (k's column is 0): the scores do not change and that column of dk returns
      scale * sum_i dS_ij, the gradient of a per-key bias (times scale).
    - v_col = f_j and grad_col = e_i (out's column 0, so D_i is unchanged): dS_ij gains
      P_ij * e_i * f_j, which adds a rank-one term to the score gradient inside this same call.
    Returns gq, gk, gv trimmed to the input head sizes, and the extra column of gk.
    """
    d, d_v = q.shape[-1], v.shape[-1]
    width = max(d, d_v) + 1

    def widen(x, col):
        wide = F.pad(x, (0, width - x.shape[-1]))
        if col is not None:
            wide[..., -1] = col
        return wide

    gq, gk, gv = _flash_backward(
        widen(grad, grad_col), widen(q, q_col), widen(k, None), widen(v, v_col), widen(out, None),
        lse, 0.0, False, attn_mask=bias, scale=scale,
    )
    return gq[..., :d], gk[..., :d], gv[..., :d_v], gk[..., -1]


# Largest exponent range allowed when the HNAS backward folds the gradient through c into the
# UNAS backward as exp(r_i - m) * exp(m - c_j) (r = UNAS row LSE): both factors must stay far
# from float32 overflow / underflow (exp(88)). Beyond it the extra forward pass is used instead.
FOLD_MAX_RANGE = 60.0


def _fold_shift(lse_u, c, key_padding_mask, query_padding_mask) -> Tensor | None:
    """m (B, H, 1) for the folded c-gradient, or None when exp(r - m) / exp(m - c) could
    under/overflow. Only rows with a valid query and a valid key, and keys of a batch item
    with a valid query, count."""
    B = lse_u.shape[0]
    rows = torch.ones(B, 1, lse_u.shape[-1], dtype=torch.bool, device=lse_u.device)
    cols = torch.ones(B, 1, c.shape[-1], dtype=torch.bool, device=c.device)
    if query_padding_mask is not None:
        rows = rows & ~query_padding_mask[:, None, :]
        cols = cols & (~query_padding_mask).any(-1)[:, None, None]
    if key_padding_mask is not None:
        rows = rows & (~key_padding_mask).any(-1)[:, None, None]
        cols = cols & ~key_padding_mask[:, None, :]
    inf = float("inf")
    m = lse_u.masked_fill(~rows, -inf).amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    low_r = lse_u.masked_fill(~rows, inf).amin(-1, keepdim=True)
    low_c = c.masked_fill(~cols, inf).amin(-1, keepdim=True)
    if ((m - low_r) > FOLD_MAX_RANGE).any() or ((m - low_c) > FOLD_MAX_RANGE).any():
        return None
    return m


class _QueryNormalized(torch.autograd.Function):
    """DNAS (u is None) or HNAS output from q, k, v, u and the column pass (c, and Xo or None,
    computed without autograd); the backward adds the gradient that flows through c."""

    @staticmethod
    def forward(ctx, q, k, v, u, c, xo, key_padding_mask, query_padding_mask):
        scale = 1.0 / math.sqrt(q.shape[-1])
        kbias = padding_bias(key_padding_mask, q.dtype)
        out_d, lse_d = _flash_any(q, k, v, key_bias(kbias, c), scale)
        out_u = lse_u = shift = None
        if u is not None:
            out_u, lse_u = _flash_any(q, k, v, kbias, scale)
            shift = _fold_shift(lse_u, c, key_padding_mask, query_padding_mask)
        if query_padding_mask is not None:
            rows = query_padding_mask[:, None, :, None]
            out_d = out_d.masked_fill(rows, 0.0)
            out_u = None if out_u is None else out_u.masked_fill(rows, 0.0)
        ctx.masks = (key_padding_mask, query_padding_mask)
        ctx.hybrid = u is not None
        ctx.u_shape = None if u is None else u.shape
        ctx.save_for_backward(q, k, v, u, c, xo, out_d, lse_d, out_u, lse_u, shift)
        return out_d if u is None else torch.lerp(out_u, out_d, u)

    @staticmethod
    def backward(ctx, grad):
        key_padding_mask, query_padding_mask = ctx.masks
        q, k, v, u, c, xo, out_d, lse_d, out_u, lse_u, shift = ctx.saved_tensors
        B, H, S_q, d = q.shape
        scale = 1.0 / math.sqrt(d)
        grad = grad.to(q.dtype)
        if query_padding_mask is not None:  # those rows were zeroed: nothing flows through them
            grad = grad.masked_fill(query_padding_mask[:, None, :, None], 0.0)
        grad_u = None
        if ctx.hybrid and ctx.needs_input_grad[3]:
            # d/du of lerp(out_u, out_d, u), reduced per batch item (no full-size temporaries)
            grad_u = torch.stack([
                torch.einsum("hsf,hsf->h", out_d[b] - out_u[b], grad[b]) for b in range(B)
            ])[..., None, None].sum_to_size(ctx.u_shape)
        kbias = padding_bias(key_padding_mask, q.dtype)
        width = max(d, v.shape[-1]) + 1
        chunks = _batch_chunks(B, H * max(S_q, k.shape[-2]) * width * q.element_size())
        if len(chunks) > 1:  # gradients are gathered chunk by chunk; temporaries stay per chunk
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for s in chunks:
            qc, kc, vc, cc = q[s], k[s], v[s], c[s]
            kb = _sl(kbias, s)
            bias = key_bias(kb, cc)
            # Per-chunk gradients of the two branches of lerp(out_u, out_d, u).
            uc = None if u is None else (u if u.shape[0] == 1 else u[s])
            grad_d = grad[s] if uc is None else uc * grad[s]
            gq, gk, gv, colsum = _backward_with_column(
                grad_d, qc, kc, vc, out_d[s], lse_d[s], bias, scale, q_col=1.0
            )
            dc = -colsum / scale  # the DNAS bias is -c
            # The gradient through c_j = logsumexp_i s_ij is ds_ij = dc_j xi_ij, with
            # xi_ij = exp(s_ij - c_j) over valid queries i.
            if ctx.hybrid and shift is not None:
                # xi_ij = P_unas_ij exp(r_i - c_j): fold it into the UNAS backward as the
                # rank-one term e_i f_j with e_i = exp(r_i - m), f_j = dc_j exp(m - c_j).
                m = shift[s]
                e = torch.exp(lse_u[s] - m)
                if query_padding_mask is not None:
                    e = e.masked_fill(query_padding_mask[s][:, None, :], 0.0)
                f = dc * torch.exp(m - cc)
                if key_padding_mask is not None:
                    f = f.masked_fill(key_padding_mask[s][:, None, :], 0.0)
                uq, uk, uv, _ = _backward_with_column(
                    (1 - uc) * grad[s], qc, kc, vc, out_u[s], lse_u[s], kb, scale, v_col=f, grad_col=e
                )
                gq, gk, gv = gq + uq, gk + uk, gv + uv
            else:
                # dk_j += scale dc_j Xo_j; dq_i += scale sum_j xi_ij dc_j k_j, one forward pass
                # flash(q, k, dc * k) with bias -c, rescaled by exp(its LSE) (<= S_k).
                xoc = xo[s] if xo is not None else column_pass(qc, kc, _sl(query_padding_mask, s))[1]
                gk += (scale * dc)[..., None] * xoc
                o4, lse4 = _flash(qc, kc, dc[..., None] * kc, attn_mask=bias, scale=scale)
                term = (scale * torch.exp(lse4))[..., None] * o4
                if query_padding_mask is not None:  # padded queries are not in xi
                    term = term.masked_fill(query_padding_mask[s][:, None, :, None], 0.0)
                gq += term
                if ctx.hybrid:  # plain UNAS backward (the extra column stays unused)
                    uq, uk, uv, _ = _backward_with_column(
                        (1 - uc) * grad[s], qc, kc, vc, out_u[s], lse_u[s], kb, scale
                    )
                    gq, gk, gv = gq + uq, gk + uk, gv + uv
            if len(chunks) == 1:
                return gq, gk, gv, grad_u, None, None, None, None
            dq[s], dk[s], dv[s] = gq, gk, gv
        return dq, dk, dv, grad_u, None, None, None, None


def dnas_flash(q, k, v, key_padding_mask=None, query_padding_mask=None) -> Tensor:
    with torch.no_grad():
        c, xo = column_pass(q, k, query_padding_mask)
    return _QueryNormalized.apply(q, k, v, None, c, xo, key_padding_mask, query_padding_mask)


def hnas_flash(q, k, v, u, key_padding_mask=None, query_padding_mask=None) -> Tensor:
    # Xo is not kept: the backward folds the c-gradient into the UNAS backward (and recomputes
    # Xo in the rare case where that fold is numerically unsafe).
    with torch.no_grad():
        c, _ = column_pass(q, k, query_padding_mask)
    return _QueryNormalized.apply(q, k, v, u, c, None, key_padding_mask, query_padding_mask)
