"""Fused attention for unas / dnas / hnas that never materializes S_q x S_k (forward or backward).

Everything rests on one CPU kernel, `aten._scaled_dot_product_flash_attention_for_cpu` (flash
attention; returns the output and the row log-sum-exp) and its backward. Facts used
(/work/shared/notes/cpu-attention-facts.md): the kernel takes an additive float mask, broadcast
over queries when it is a contiguous (B, H, 1, S_k) tensor; q, k, v must share one head size;
its backward returns gradients of q, k, v only.

DNAS. pi_dnas_ij = softmax_j(s_ij - c_j) with c_j = logsumexp over valid queries i of s_ij.
  1. column pass: c is the row LSE of the transposed problem, flash(k, q, q) with query padding as
     its key mask. Its output Xo_j = sum_i xi_ij q_i (xi = column softmax) is kept for backward.
  2. main pass: flash(q, k, v) with the per-key bias -c (+ -inf on padded keys).
  Backward: flash backward of the main pass gives dq, dk, dv and, through one extra head column
  (ones in q, zeros in k), the bias gradient colsum_i dS_ij. The gradient then flows through c:
  ds_ij += dc_j xi_ij, i.e. dk_j += scale dc_j Xo_j and dq_i += scale sum_j xi_ij dc_j k_j; the
  latter is one more forward pass, flash(q, k, dc*k) with bias -c, rescaled by exp(its LSE).

HNAS. pi_unas and pi_dnas are the same matrix rescaled by keys: with P = softmax_j(s_ij - c_j/2),
  pi_unas_ij ~ P_ij a_j and pi_dnas_ij ~ P_ij b_j (rows renormalized), a_j = exp(c_j/2),
  b_j = exp(-c_j/2). So ONE main pass over the values [a v, a, b v, b] gives both outputs (the
  a / b columns give the row normalizers), and ONE backward call serves both schemes. The half
  bias -c/2 keeps a and b within exp(+-spread/2), spread = range of c over valid keys; when the
  spread is too large for float32 (> HNAS_MAX_SPREAD), HNAS is computed as
  u * dnas + (1 - u) * unas with separate passes (exact, slower).

All normalization runs in float32 (float64 stays float64). Padded queries get zero output rows
and take no part in c; a row with every key padded gives zeros; nothing is NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.attention import reference

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

# Largest range of c (over the valid keys of one head) for the shared HNAS pass: exp(-spread/2)
# must stay far from float32 underflow (exp(-87)) for the normalizers to be exact.
HNAS_MAX_SPREAD = 80.0
# Bytes of one widened (B_chunk, H, S, width) float tensor: the main passes run over batch chunks
# of about this size so that their padded temporaries stay small next to the inputs.
CHUNK_BYTES = 48 * 2**20


def flash_supported(q: Tensor) -> bool:
    return q.device.type == "cpu"


def _work_dtype(x: Tensor) -> torch.dtype:
    return reference.compute_dtype(x)


def _output_dtype(x: Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _padding_bias(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, 1, 1, S) additive mask: 0 for valid, -inf for padded; None without padding."""
    if mask is None:
        return None
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(mask, float("-inf"))[:, None, None, :]


def _key_bias(kbias: Tensor | None, c: Tensor, weight: float) -> Tensor:
    """Contiguous (B, H, 1, S_k) bias -weight*c (+ -inf on padded keys). A non-contiguous bias
    would make the kernel expand it to a full (B, H, S_q, S_k) mask."""
    bias = (-weight * c)[:, :, None, :]
    if kbias is not None:
        bias = bias + kbias
    return bias.contiguous()


def _pad(x: Tensor, width: int, extra: float | None = None) -> Tensor:
    """x (.., d) -> (.., width): optionally one column of `extra` right after x, then zeros."""
    out = x.new_zeros(*x.shape[:-1], width)
    out[..., : x.shape[-1]] = x
    if extra is not None:
        out[..., x.shape[-1]] = extra
    return out


def _chunks(batch: int, per_item_elems: int, itemsize: int):
    step = max(1, CHUNK_BYTES // max(1, per_item_elems * itemsize))
    for b0 in range(0, batch, step):
        yield slice(b0, min(batch, b0 + step))


def _sl(x: Tensor | None, s: slice) -> Tensor | None:
    return None if x is None else x[s]


def column_pass(q: Tensor, k: Tensor, qbias: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """c_j = logsumexp_i s_ij over valid queries (B, H, S_k), and Xo_j = sum_i xi_ij q_i.

    One flash call on the transposed problem (keys as queries). A column with no valid query
    gets c = 0 and Xo = 0 from the kernel.
    """
    xo, lse = _flash(k, q, q, attn_mask=qbias, scale=scale)
    return lse.contiguous(), xo


def hnas_scales(c: Tensor, key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """a = exp(c/2 - max c/2), b = exp(-c/2 - max(-c/2)) over valid keys, each in (0, 1]."""
    half = 0.5 * c
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]
        hi = half.masked_fill(pad, float("-inf")).amax(-1, keepdim=True)
        lo = half.masked_fill(pad, float("inf")).amin(-1, keepdim=True)
        hi = torch.where(torch.isfinite(hi), hi, torch.zeros_like(hi))
        lo = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
    else:
        hi = half.amax(-1, keepdim=True)
        lo = half.amin(-1, keepdim=True)
    a = torch.exp(half - hi)
    b = torch.exp(lo - half)
    if key_padding_mask is not None:  # padded keys never count; keep their scales harmless
        a = a.masked_fill(pad, 0.0)
        b = b.masked_fill(pad, 0.0)
    return a, b


def c_spread(c: Tensor, key_padding_mask: Tensor | None, query_padding_mask: Tensor | None) -> float:
    """Largest range of c over valid keys, among batch items that have a valid query."""
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]
        hi = c.masked_fill(pad, float("-inf")).amax(-1)
        lo = c.masked_fill(pad, float("inf")).amin(-1)
    else:
        hi, lo = c.amax(-1), c.amin(-1)
    spread = hi - lo  # (B, H); -inf - inf for items with no valid key
    if query_padding_mask is not None:
        spread = spread.masked_fill(query_padding_mask.all(-1)[:, None], 0.0)
    spread = torch.where(torch.isfinite(spread), spread, torch.zeros_like(spread))
    return float(spread.max()) if spread.numel() else 0.0


class _QueryNormalized(torch.autograd.Function):
    """DNAS (hybrid=False) or HNAS (hybrid=True) output from q, k, v, u and the column pass.

    c and Xo come from `column_pass` computed without autograd; this Function's backward
    carries the gradient that flows through c itself.
    """

    @staticmethod
    def forward(ctx, q, k, v, u, c, xo, key_padding_mask, query_padding_mask, hybrid: bool):
        B, H, S_q, d = q.shape
        d_v = v.shape[-1]
        scale = 1.0 / math.sqrt(d)
        kbias = _padding_bias(key_padding_mask, q.dtype)
        out_u = q.new_zeros(B, H, S_q, d_v) if hybrid else None
        out_d = q.new_zeros(B, H, S_q, d_v)
        lse = q.new_zeros(B, H, S_q)
        gamma = q.new_zeros(B, H, S_q, 2) if hybrid else None
        if hybrid:
            a, b = hnas_scales(c, key_padding_mask)
            width = 2 * d_v + 2
        else:
            width = max(d, d_v)
        per_item = H * max(S_q, k.shape[-2]) * width
        for s in _chunks(B, per_item, q.element_size()):
            qc, kc, vc, cc = q[s], k[s], v[s], c[s]
            if hybrid:
                bias = _key_bias(_sl(kbias, s), cc, 0.5)
                ac, bc = a[s][..., None], b[s][..., None]
                values = torch.cat([ac * vc, ac, bc * vc, bc], dim=-1)
                o, lse[s] = _flash(_pad(qc, width), _pad(kc, width), values, attn_mask=bias, scale=scale)
                gu, gd = o[..., d_v], o[..., 2 * d_v + 1]
                gamma[s] = torch.stack([gu, gd], dim=-1)
                # A row whose keys are all padded has gamma = 0 and output 0.
                out_u[s] = o[..., :d_v] / _safe(gu)[..., None]
                out_d[s] = o[..., d_v + 1 : 2 * d_v + 1] / _safe(gd)[..., None]
            else:
                bias = _key_bias(_sl(kbias, s), cc, 1.0)
                if d == d_v:
                    out_d[s], lse[s] = _flash(qc, kc, vc, attn_mask=bias, scale=scale)
                else:
                    o, lse[s] = _flash(
                        _pad(qc, width), _pad(kc, width), _pad(vc, width), attn_mask=bias, scale=scale
                    )
                    out_d[s] = o[..., :d_v]
        if query_padding_mask is not None:
            rows = query_padding_mask[:, None, :, None]
            out_d.masked_fill_(rows, 0.0)
            if hybrid:
                out_u.masked_fill_(rows, 0.0)
        ctx.hybrid = hybrid
        ctx.key_padding_mask = key_padding_mask
        ctx.query_padding_mask = query_padding_mask
        ctx.u_shape = u.shape if u is not None else None
        if hybrid:
            ctx.save_for_backward(q, k, v, u, c, xo, lse, out_u, out_d, gamma)
            return u * out_d + (1 - u) * out_u
        ctx.save_for_backward(q, k, v, c, xo, lse, out_d)
        return out_d

    @staticmethod
    def backward(ctx, grad):
        kpm, qpm, hybrid = ctx.key_padding_mask, ctx.query_padding_mask, ctx.hybrid
        if hybrid:
            q, k, v, u, c, xo, lse, out_u, out_d, gamma = ctx.saved_tensors
        else:
            q, k, v, c, xo, lse, out_d = ctx.saved_tensors
        B, H, S_q, d = q.shape
        d_v = v.shape[-1]
        scale = 1.0 / math.sqrt(d)
        grad = grad.to(q.dtype)
        if qpm is not None:  # padded query rows were zeroed in forward: no gradient through them
            grad = grad.masked_fill(qpm[:, None, :, None], 0.0)
        kbias = _padding_bias(kpm, q.dtype)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dc = torch.empty_like(c)
        if hybrid:
            a, b = hnas_scales(c, kpm)
            width = max(d + 1, 2 * d_v + 2)
            grad_u = None
        else:
            width = max(d + 1, d_v)
        per_item = H * max(S_q, k.shape[-2]) * width
        for s in _chunks(B, per_item, q.element_size()):
            qc, kc, vc, cc, gc = q[s], k[s], v[s], c[s], grad[s]
            # Extra head column: ones in q, zeros in k -> that column of dk is scale * colsum(dS).
            qp, kp = _pad(qc, width, extra=1.0), _pad(kc, width)
            if hybrid:
                uc = u if u.shape[0] == 1 else u[s]
                ac, bc = a[s][..., None], b[s][..., None]
                gu, gd = gamma[s][..., 0:1], gamma[s][..., 1:2]
                ou, od = out_u[s], out_d[s]
                g_u, g_d = (1 - uc) * gc, uc * gc
                values = _pad(torch.cat([ac * vc, ac, bc * vc, bc], dim=-1), width)
                out = _pad(torch.cat([ou * gu, gu, od * gd, gd], dim=-1), width)
                # out_x = N_x / gamma_x: dN = g / gamma, dgamma = -(g . out_x) / gamma.
                inv_u, inv_d = _safe_inv(gu), _safe_inv(gd)
                d_out = torch.cat(
                    [
                        g_u * inv_u,
                        -(g_u * ou).sum(-1, keepdim=True) * inv_u,
                        g_d * inv_d,
                        -(g_d * od).sum(-1, keepdim=True) * inv_d,
                    ],
                    dim=-1,
                )
                bias = _key_bias(_sl(kbias, s), cc, 0.5)
                gq, gk, gv = _flash_backward(
                    _pad(d_out, width), qp, kp, values, out, lse[s], 0.0, False,
                    attn_mask=bias, scale=scale,
                )
                dv_a, dv_b = gv[..., :d_v], gv[..., d_v + 1 : 2 * d_v + 1]
                dv[s] = ac * dv_a + bc * dv_b
                grad_a = (vc * dv_a).sum(-1) + gv[..., d_v]
                grad_b = (vc * dv_b).sum(-1) + gv[..., 2 * d_v + 1]
                grad_bias = gk[..., d] / scale
                # a = exp(c/2 - const), b = exp(-c/2 - const), bias = -c/2.
                dc[s] = 0.5 * a[s] * grad_a - 0.5 * b[s] * grad_b - 0.5 * grad_bias
                du = ((od - ou) * gc).sum((-2, -1), keepdim=True)
                grad_u = du if grad_u is None else torch.cat([grad_u, du], dim=0)
            else:
                bias = _key_bias(_sl(kbias, s), cc, 1.0)
                gq, gk, gv = _flash_backward(
                    _pad(gc, width), qp, kp, _pad(vc, width), _pad(out_d[s], width), lse[s],
                    0.0, False, attn_mask=bias, scale=scale,
                )
                dv[s] = gv[..., :d_v]
                dc[s] = -gk[..., d] / scale
            dq[s] = gq[..., :d]
            dk[s] = gk[..., :d]
            # Gradient through c_j = logsumexp_i s_ij: ds_ij += dc_j xi_ij, xi = column softmax.
            dcc = dc[s]
            dk[s] += scale * dcc[..., None] * xo[s]
            o4, lse4 = _flash(qc, kc, dcc[..., None] * kc, attn_mask=_key_bias(_sl(kbias, s), cc, 1.0), scale=scale)
            # o4_i = sum_j exp(s_ij - c_j - lse4_i) dc_j k_j; lse4 <= log S_k on valid rows.
            term = scale * torch.exp(lse4)[..., None] * o4
            if qpm is not None:
                term = torch.where(qpm[s][:, None, :, None], torch.zeros_like(term), term)
            dq[s] += term
        du_out = None
        if hybrid:
            du_out = grad_u.sum_to_size(ctx.u_shape) if ctx.needs_input_grad[3] else None
            return dq, dk, dv, du_out, None, None, None, None, None
        return dq, dk, dv, None, None, None, None, None, None


def _safe(x: Tensor) -> Tensor:
    return torch.where(x > 0, x, torch.ones_like(x))


def _safe_inv(x: Tensor) -> Tensor:
    return torch.where(x > 0, 1.0 / _safe(x), torch.zeros_like(x))


def unas_flash(q, k, v, key_padding_mask, query_padding_mask, causal) -> Tensor:
    """Standard attention on the flash kernel (autograd built in), zero rows for padded queries."""
    kbias = _padding_bias(key_padding_mask, q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    d, d_v = q.shape[-1], v.shape[-1]
    if d == d_v:
        out, _ = _flash(q, k, v, 0.0, causal, attn_mask=kbias, scale=scale)
    else:  # the kernel wants one head size: zero-pad (zeros change neither scores nor outputs)
        width = max(d, d_v)
        qp, kp, vp = (torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
        out = _flash(qp, kp, vp, 0.0, causal, attn_mask=kbias, scale=scale)[0][..., :d_v]
    if query_padding_mask is not None:
        out = out.masked_fill(query_padding_mask[:, None, :, None], 0.0)
    return out


def dnas_flash(q, k, v, key_padding_mask, query_padding_mask, c=None, xo=None) -> Tensor:
    if c is None:
        with torch.no_grad():
            c, xo = column_pass(q, k, _padding_bias(query_padding_mask, q.dtype), 1.0 / math.sqrt(q.shape[-1]))
    return _QueryNormalized.apply(q, k, v, None, c, xo, key_padding_mask, query_padding_mask, False)


def hnas_flash(q, k, v, u, key_padding_mask, query_padding_mask) -> Tensor:
    with torch.no_grad():
        c, xo = column_pass(q, k, _padding_bias(query_padding_mask, q.dtype), 1.0 / math.sqrt(q.shape[-1]))
    u = u.to(q.dtype)
    if c_spread(c, key_padding_mask, query_padding_mask) > HNAS_MAX_SPREAD:
        # Extreme logits: exp(+-c/2) would lose precision; run the two schemes separately.
        dnas = dnas_flash(q, k, v, key_padding_mask, query_padding_mask, c, xo)
        unas = unas_flash(q, k, v, key_padding_mask, query_padding_mask, False)
        return u * dnas + (1 - u) * unas
    return _QueryNormalized.apply(q, k, v, u, c, xo, key_padding_mask, query_padding_mask, True)


def efficient_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: str,
    key_padding_mask: Tensor | None,
    query_padding_mask: Tensor | None,
    u: Tensor | None,
    causal: bool,
    dropout_p: float,
) -> Tensor:
    """Output of unas / dnas / hnas without materializing the weights (see module docstring).

    The CPU flash kernel has no dropout, so with attention dropout (training) and on non-CPU
    devices this falls back to the materialized reference (exact, O(S^2) memory).
    """
    if dropout_p > 0.0 or not flash_supported(q):
        return reference.reference_attend(
            q, k, v, scheme, key_padding_mask, query_padding_mask, u, 1, causal, dropout_p
        )
    out_dtype = _output_dtype(v)
    dtype = _work_dtype(q)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
        if scheme == "unas":
            out = unas_flash(q, k, v, key_padding_mask, query_padding_mask, causal)
        elif scheme == "dnas":
            out = dnas_flash(q, k, v, key_padding_mask, query_padding_mask)
        elif scheme == "hnas":
            u = torch.as_tensor(u, device=q.device).to(dtype)
            while u.dim() < 4:  # broadcastable to (B, H, 1, 1)
                u = u[None]
            out = hnas_flash(q, k, v, u, key_padding_mask, query_padding_mask)
        else:
            raise ValueError(f"efficient_attend does not handle scheme {scheme!r}")
    return out.to(out_dtype)
