"""Selective attention (schemes/selective.py) by query blocks, without any S x S map.

Every head's logits are z^h_ij = C^h_ij - F_ij with F_ij = sum_{k < i} S_kj, S_kj = relu(C^0_kj)
on valid, non-exempt pairs (C^0: the selecting head's scaled scores). F needs only the selecting
head's scores, and its rows are a running sum down the queries: a block of queries [a, b) gets

    F_i = carry + sum_{a <= k < i} S_k,      carry = sum_{k < a} S_k (a vector over keys)

so one pass over query blocks computes, per block, the selecting head's scores, F, every head's
scores for the block, the softmax (the paper's normalization, UNAS) and its product with V, and
carries the running sum on. Memory: (B, H, rows, S) per block instead of (B, H, S, S).

The backward (a custom autograd.Function) recomputes each block, last to first. With dz^h the
softmax's gradient of head h's logits, dL/dF_ij = -sum_h dz^h_ij, and since S_kj feeds F_ij for
every later query i > k, dL/dS_kj = sum_{i > k} dL/dF_ij: a running sum *up* the queries, carried
from the blocks after. The ReLU and the masks gate it into the selecting head's scores.

Causal self-attention only (as many queries as keys; the transform refuses the rest). Float32
inside (float64 stays), as the materialized reference.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# exp() of an argument below this is a float32 subnormal or 0 (e^-87.3 is the least normal).
# ATen's vectorized exp takes a slow path for such arguments *and for -inf* (measured on this
# CPU: 0.45 ns per element in range, 2.5 ns at -inf, 5-20 ns where the result is subnormal), and
# the penalty F pushes most of a row's logits hundreds below its max, the future to -inf. So
# `_exp_` clamps the arguments at UNDERFLOW, exponentiates in range, and sets what came from the
# clamp to exactly 0 (every weight up to e^-86: FLOOR sits an e above e^-87, far from exp's
# rounding): a weight below 1e-37 next to the row's largest, 1, is below float32's resolution of
# the sum anyway. NaN stays NaN.
UNDERFLOW = -87.0
FLOOR = math.exp(UNDERFLOW + 1.0)


def _exp_(z: Tensor) -> Tensor:
    """exp(z) in place, exactly 0 where z <= UNDERFLOW + 1 (the masked future and padding: -inf)."""
    return F.threshold_(z.clamp_min_(UNDERFLOW).exp_(), FLOOR, 0.0)


# elements of one (B, H, rows, S) block tensor: 2M floats (8 MiB in float32); the forward holds
# one such tensor at a time, the backward two or three (measured: larger blocks raise the peak
# above 1.5x unas's at S = 2048-4096, smaller ones take more time in per-operation overhead)
BLOCK_ELEMENTS = 1 << 21
MIN_ROWS = 16


def block_rows(batch: int, heads: int, length: int) -> int:
    """Queries per block: as many as fit BLOCK_ELEMENTS, at least MIN_ROWS, at most `length`."""
    return max(1, min(length, max(MIN_ROWS, BLOCK_ELEMENTS // max(1, batch * heads * length))))


def selective_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None,
                        query_padding_mask: Tensor | None, selecting_head: int, exempt_bos: bool,
                        rows: int | None = None) -> Tensor:
    """Causal selective attention with a softmax, (B, H, S, d) in, (B, H, S, d_v) out, in q's
    dtype (the caller casts: schemes/selective.py). `rows`: queries per block (None: `block_rows`)."""
    batch, heads, length, _ = q.shape
    rows = block_rows(batch, heads, length) if rows is None else int(rows)
    return _SelectiveBlocks.apply(q, k, v, key_padding_mask, query_padding_mask,
                                  int(selecting_head), bool(exempt_bos), rows)


# ----------------------------------------------------------------------------- one block
def _selection(s0: Tensor, a: int, b: int, key_padding_mask, query_padding_mask,
               exempt_bos: bool) -> Tensor:
    """S (B, n, b) of queries [a, b): the selecting head's scores s0 through a ReLU, 0 where the
    pair is not valid (the future, padding) or exempt (the query's own key, BOS)."""
    selection = torch.relu_(s0)
    # the future and the query's own key lie in the block's last n columns: keep j < i there
    i = torch.arange(a, b, device=s0.device)[:, None]
    selection[:, :, a:b].masked_fill_(torch.arange(a, b, device=s0.device)[None, :] >= i, 0.0)
    if exempt_bos:
        selection[:, :, 0] = 0.0
    if key_padding_mask is not None:
        selection.masked_fill_(key_padding_mask[:, None, :b], 0.0)
    if query_padding_mask is not None:
        selection.masked_fill_(query_padding_mask[:, a:b, None], 0.0)
    return selection


def _penalty(selection: Tensor, carry: Tensor, a: int, b: int, key_padding_mask,
             query_padding_mask) -> Tensor:
    """F (B, n, b) of queries [a, b) from their selections and the running sum before them
    (`carry`, (B, S)), +inf where the pair is not valid: what every head's scores lose."""
    # F_i = carry + the block's earlier rows: shift down by one row, then a running sum
    penalty = F.pad(selection[:, :-1], (0, 0, 1, 0)).cumsum_(dim=-2).add_(carry[:, None, :b])
    i = torch.arange(a, b, device=selection.device)[:, None]
    penalty[:, :, a:b].masked_fill_(torch.arange(a, b, device=selection.device)[None, :] > i,
                                    float("inf"))
    if key_padding_mask is not None:
        penalty.masked_fill_(key_padding_mask[:, None, :b], float("inf"))
    if query_padding_mask is not None:
        penalty.masked_fill_(query_padding_mask[:, a:b, None], float("inf"))
    return penalty


def _block(qs: Tensor, k: Tensor, a: int, b: int, head: int, carry: Tensor, masks,
           exempt_bos: bool) -> tuple[Tensor, Tensor]:
    """(z, S) of queries [a, b): z (B, H, n, b) = every head's scores - F (-inf where not valid),
    S (B, n, b) the selections."""
    z = torch.matmul(qs[:, :, a:b], k[:, :, :b].transpose(-2, -1))
    # the selecting head's scores are z's own (a copy: z loses F next), not a product of their own
    selection = _selection(z[:, head].clone(), a, b, *masks, exempt_bos)
    z.sub_(_penalty(selection, carry, a, b, *masks)[:, None])
    return z, selection


class _SelectiveBlocks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_padding_mask, query_padding_mask, head, exempt_bos, rows):
        batch, heads, length, d = q.shape
        masks = (key_padding_mask, query_padding_mask)
        qs = q * (1.0 / math.sqrt(d))
        out = q.new_empty(batch, heads, length, v.shape[-1])
        lse = q.new_empty(batch, heads, length, 1)
        starts = list(range(0, length, rows))
        carries = q.new_empty(len(starts), batch, length)  # sum_{k < a} S_k at each block's start
        carry = q.new_zeros(batch, length)
        for n, a in enumerate(starts):
            b = min(a + rows, length)
            carries[n] = carry
            z, selection = _block(qs, k, a, b, head, carry, masks, exempt_bos)
            carry[:, :b] += selection.sum(dim=-2)
            # softmax: a row without any valid key (a padded query) takes max 0 and sum 1, so
            # that its weights are exp(-inf) = 0 and its lse finite
            m = z.amax(dim=-1, keepdim=True).nan_to_num_(0.0, 0.0, 0.0)
            p = _exp_(z.sub_(m))
            total = p.sum(dim=-1, keepdim=True)
            total.masked_fill_(total == 0, 1.0)
            out[:, :, a:b] = torch.matmul(p, v[:, :, :b]).div_(total)
            lse[:, :, a:b] = m + total.log_()
        ctx.save_for_backward(q, k, v, out, lse, carries, key_padding_mask, query_padding_mask)
        ctx.head, ctx.exempt_bos, ctx.rows = head, exempt_bos, rows
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse, carries, key_padding_mask, query_padding_mask = ctx.saved_tensors
        masks = (key_padding_mask, query_padding_mask)
        head, rows = ctx.head, ctx.rows
        batch, _, length, d = q.shape
        scale = 1.0 / math.sqrt(d)
        qs = q * scale
        grad_out = grad_out.to(out.dtype)
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, H, S, 1): rowsum(P * dP)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        later = q.new_zeros(batch, length)  # sum over the queries after the block of -dL/dF
        starts = list(range(0, length, rows))
        for n in reversed(range(len(starts))):
            a = starts[n]
            b = min(a + rows, length)
            z, selection = _block(qs, k, a, b, head, carries[n], masks, ctx.exempt_bos)
            gate = selection > 0  # where the ReLU (and the masks) pass the selecting head a gradient
            del selection
            p = _exp_(z.sub_(lse[:, :, a:b]))
            g = grad_out[:, :, a:b]
            dv[:, :, :b] += torch.matmul(p.transpose(-2, -1), g)
            dz = torch.matmul(g, v[:, :, :b].transpose(-2, -1)).sub_(delta[:, :, a:b]).mul_(p)
            del p, z
            # dL/dF = -sum_h dz^h; dL/dS_k = sum_{i > k} dL/dF_i (this block's later rows, then
            # the blocks after it)
            summed = dz.sum(dim=1)  # (B, n, b) = -dL/dF
            total = summed.sum(dim=-2)
            after = summed.cumsum_(dim=-2).neg_().add_(total[:, None]).add_(later[:, None, :b])
            later[:, :b] += total
            dz[:, head] -= after.masked_fill_(~gate, 0.0)
            dq[:, :, a:b] = torch.matmul(dz, k[:, :, :b]).mul_(scale)
            dk[:, :, :b] += torch.matmul(dz.transpose(-2, -1), qs[:, :, a:b])
        return dq, dk, dv, None, None, None, None, None
