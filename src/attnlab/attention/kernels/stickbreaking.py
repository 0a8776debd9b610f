"""Stick-breaking attention (causal) by query blocks, without S x S memory (CPU and CUDA).

Each block of `block_size` queries [i0, i1) materializes only its (block, i1) logits: a causal
query never sees a key at or past i1, so the keys after the block are never touched (half the
work of the full product). Each block runs under `torch.utils.checkpoint`: autograd keeps the
block's inputs (views of q, k, v) and its output, not its logits or weights, and the backward
recomputes one block at a time. Memory beyond the inputs: O(block x S) at a time, O(S) kept;
exact: the same float32 (float64 stays) computation as the scheme's reference, row by row.

`stickbreaking_weights` is that computation on materialized logits (the scheme's reference calls
it on the whole matrix, this kernel on one block). Nothing here imports the schemes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

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


def stickbreaking_attend(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                         query_padding_mask: Tensor | None = None, attend_current: bool = False,
                         block_size: int | None = None) -> Tensor:
    """Causal (top-left aligned) stick-breaking attention (B, H, S_q, d_v) in float32 (float64
    stays), by blocks of `block_size` queries (default: BLOCK_SIZE of the device)."""
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
