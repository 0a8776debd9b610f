"""Stick-breaking attention (causal) without S x S memory: a C++ kernel on the CPU, query blocks
elsewhere.

Math (schemes/stickbreaking.py): z_ij = q_i.k_j / sqrt(d); key j is valid for query i when j < i
(j <= i with attend_current) and neither is padded;

    log A_ij = z_ij - sum_{valid k >= j} softplus(z_ik)      (= logsigmoid(z_ij) + the log of
    A_ij = sigmoid(z_ij) prod_{valid j < k} sigmoid(-z_ik)      what the keys nearer i left over)

a sum that runs from the diagonal leftwards over the keys. Its gradient, with dA_ij = g_i.v_j
(g = dL/dout) and d log A_ij / d z_ik = [j = k] - sigmoid(z_ik) [j <= k]:

    dz_ik = A_ik dA_ik - sigmoid(z_ik) P_ik,
    P_ik  = sum_{j <= k} A_ij dA_ij = D_i - sum_{j > k} A_ij dA_ij,   D_i = g_i.out_i,

i.e. the gradient through the cumulative sums is a reverse cumulative sum over keys of the
A_ij dA_ij terms, carried leftwards from the diagonal together with the stick. Then dq = dz k /
sqrt(d), dk = dz^T q / sqrt(d), dv = A^T g.

CPU (float32 / float64, the fused library built by kernels/fused.py): `csrc/stickbreaking.cpp`,
flash style: the forward keeps only the output, the backward recomputes the scores block by block
(two products forward, five backward, as flash attention); one exp and one division per score each
way (the stick carried as a product, see the C++ file). The authors' Triton backward instead
saves each row's total log-stick and runs the keys left to right; here both passes run from the
diagonal leftwards, so the backward recomputes the forward's weights exactly. Memory beyond the
inputs and gradients: two (queries per block x S) buffers per thread.

Elsewhere (CUDA, or no C++ compiler): blocks of `block_size` queries [i0, i1), each materializing
only its (block, i1) logits (a causal query never sees a key at or past i1) under
`torch.utils.checkpoint`: autograd keeps the block's inputs and output, and the backward recomputes
one block at a time. Memory: O(block x S) at a time, O(S) kept.

`stickbreaking_weights` is that computation on materialized logits (the scheme's reference calls it
on the whole matrix, the query-block path on one block). Nothing here imports the schemes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnlab.attention.kernels import fused

# queries per block, per device (the CUDA loop wants fewer, larger blocks)
BLOCK_SIZE = {"cpu": 128, "cuda": 512}
# the path serves a call when S_q * S_k exceeds this (below it one block is the whole matrix)
MIN_PAIRS = 128 * 128


def stickbreaking_weights(logits: Tensor, attend_current: bool = False, query_offset: int = 0) -> Tensor:
    """Stick-breaking weights over the last dim of logits that are -inf where masked: key j is a
    key of query i (row i is position i + query_offset) when its logit is finite and j < i
    (j <= i when attend_current). log A_ij = logsigmoid(z_ij) + sum_{j<k<i} logsigmoid(-z_ik),
    the sum a reversed cumulative sum along keys; masked keys take no share and consume none of
    the stick. A row without keys is all 0; never NaN."""
    s_q, s_k = logits.shape[-2], logits.shape[-1]
    rows = torch.arange(query_offset, query_offset + s_q, device=logits.device)[:, None]
    cols = torch.arange(s_k, device=logits.device)[None, :]
    before = cols <= rows if attend_current else cols < rows
    valid = torch.isfinite(logits) & before
    z = torch.where(valid, logits, torch.zeros_like(logits))
    log_beta = torch.where(valid, F.logsigmoid(-z), torch.zeros_like(z))  # log(1 - sigmoid(z))
    # sum_{k > j} log_beta_k: shift left by one, then a reversed cumulative sum (no cancellation)
    after = torch.cat([log_beta[..., 1:], torch.zeros_like(log_beta[..., :1])], dim=-1)
    remaining = after.flip(-1).cumsum(-1).flip(-1)
    log_a = F.logsigmoid(z) + remaining
    return torch.where(valid, torch.exp(log_a), torch.zeros_like(log_a))


def _block(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None,
           query_padding_mask: Tensor | None, offset: int, attend_current: bool) -> Tensor:
    """Output rows of queries [offset, offset + q's length) over the keys k (a prefix)."""
    logits = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if key_padding_mask is not None:
        logits = logits.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if query_padding_mask is not None:
        logits = logits.masked_fill(query_padding_mask[:, None, :, None], float("-inf"))
    return torch.matmul(stickbreaking_weights(logits, attend_current, offset), v)


# The C++ kernel as `torch.library.custom_op`s (fake implementations, the forward's autograd
# formula), as kernels/rowwise.py's: torch.compile keeps one graph through them.
@torch.library.custom_op("attnlab::fused_stickbreaking_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None,
             query_padding_mask: Tensor | None, attend_current: bool) -> Tensor:
    return torch.ops.attnlab.stickbreaking_forward(q, k, v, key_padding_mask, query_padding_mask,
                                                   attend_current)


@_forward.register_fake
def _(q, k, v, key_padding_mask, query_padding_mask, attend_current):
    B, H, M, _ = q.shape
    return q.new_empty(B, M, H, v.shape[-1]).transpose(1, 2)  # (B, S_q, H, d_v) memory, as C++'s


@torch.library.custom_op("attnlab::fused_stickbreaking_backward", mutates_args=())
def _backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 key_padding_mask: Tensor | None, query_padding_mask: Tensor | None,
                 attend_current: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv)."""
    return torch.ops.attnlab.stickbreaking_backward(grad, q, k, v, out, key_padding_mask,
                                                    query_padding_mask, attend_current)


@_backward_op.register_fake
def _(grad, q, k, v, *rest):
    return fused._like(q), fused._like(k), fused._like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, kpm, qpm, attend_current = inputs
    ctx.save_for_backward(q, k, v, output, kpm, qpm)
    ctx.attend_current = attend_current


def _backward(ctx, grad):
    q, k, v, out, kpm, qpm = ctx.saved_tensors
    dq, dk, dv = _backward_op(grad.to(q.dtype), q, k, v, out, kpm, qpm, ctx.attend_current)
    return dq, dk, dv, None, None, None


_forward.register_autograd(_backward, setup_context=_setup_context)


def stickbreaking_attend(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                         query_padding_mask: Tensor | None = None, attend_current: bool = False,
                         block_size: int | None = None) -> Tensor:
    """Causal (top-left aligned) stick-breaking attention (B, H, S_q, d_v) in float32 (float64
    stays): the C++ kernel on the CPU when the fused library is built (`block_size` not given),
    else by blocks of `block_size` queries (default: BLOCK_SIZE of the device)."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if q.device.type == "cpu" and block_size is None and fused.load():
        masks = [None if m is None else m.to(torch.bool).contiguous()
                 for m in (key_padding_mask, query_padding_mask)]
        return _forward(q, k, v, *masks, bool(attend_current))
    return query_blocks_attend(q, k, v, key_padding_mask, query_padding_mask, attend_current,
                               block_size)


def query_blocks_attend(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                        query_padding_mask: Tensor | None = None, attend_current: bool = False,
                        block_size: int | None = None) -> Tensor:
    """The same by blocks of `block_size` queries under checkpointing (CUDA, or no compiler)."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    s_q, s_k = q.shape[-2], k.shape[-2]
    block = block_size or BLOCK_SIZE.get(q.device.type, BLOCK_SIZE["cpu"])
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs = []
    for i0 in range(0, s_q, block):
        i1 = min(i0 + block, s_q)
        n_k = min(i1, s_k)  # keys at or past i1 are in no row's past
        if n_k == 0:
            outs.append(q.new_zeros(*q.shape[:2], i1 - i0, v.shape[-1]))
            continue
        args = (q[..., i0:i1, :], k[..., :n_k, :], v[..., :n_k, :],
                None if key_padding_mask is None else key_padding_mask[:, :n_k],
                None if query_padding_mask is None else query_padding_mask[:, i0:i1],
                i0, attend_current)
        if recompute:
            outs.append(checkpoint(_block, *args, use_reentrant=False))
        else:
            outs.append(_block(*args))
    if not outs:
        return q.new_zeros(*q.shape[:2], 0, v.shape[-1])
    return torch.cat(outs, dim=-2)
