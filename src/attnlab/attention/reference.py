"""The math that the schemes' materialized references share: masked logits and log-space
normalization.

Everything is computed in float32 (or float64 when the inputs are float64) in log space, with
masks on both sides. Masked entries are -inf logits; a row or column with no valid entry is
normalized against 0 instead of -inf so that it yields zeros (and zero gradients), never NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def compute_dtype(x: Tensor) -> torch.dtype:
    """Normalization runs in float32 at least (float64 stays float64, e.g. for gradcheck)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def valid_mask(
    batch: int,
    s_q: int,
    s_k: int,
    device: torch.device,
    key_padding_mask: Tensor | None,
    query_padding_mask: Tensor | None,
    causal: bool,
) -> Tensor | None:
    """Bool (B, 1, S_q, S_k) [or broadcastable] mask of valid (query, key) pairs; None if all valid."""
    valid = None
    if key_padding_mask is not None:
        valid = ~key_padding_mask[:, None, None, :]
    if query_padding_mask is not None:
        rows = ~query_padding_mask[:, None, :, None]
        valid = rows if valid is None else valid & rows
    if causal:  # top-left aligned, as in scaled_dot_product_attention(is_causal=True)
        tri = torch.ones(s_q, s_k, dtype=torch.bool, device=device).tril()
        valid = tri[None, None] if valid is None else valid & tri
    if valid is not None:
        valid = valid.expand(batch, 1, s_q, s_k)
    return valid


def safe_log_normalize(logits: Tensor, dim: int) -> Tensor:
    """logits - logsumexp(logits, dim), where an all -inf slice stays all -inf (not NaN).

    Computed as (x - m) - log(sum exp(x - m)) with m the (detached) maximum, so that large
    logits (1e4) do not lose the sum's precision to the rounding of m + log(sum): rows still
    sum to 1 within float32 epsilon. An all -inf slice takes m = 0 and log(1) instead, so that
    neither its value nor its gradient is ever -inf - -inf = NaN; exp() of the result gives 0.
    """
    m = logits.detach().amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    shifted = logits - m
    total = torch.exp(shifted).sum(dim=dim, keepdim=True)
    return shifted - torch.log(torch.where(total > 0, total, torch.ones_like(total)))


def masked_logits(
    q: Tensor,
    k: Tensor,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    causal: bool = False,
) -> Tensor:
    """Scores q.k / sqrt(d) in float32 (float64 stays), -inf where the pair is masked."""
    dtype = compute_dtype(q)
    with torch.autocast(device_type=q.device.type, enabled=False):
        scale = 1.0 / math.sqrt(q.shape[-1])
        logits = torch.matmul(q.to(dtype), k.to(dtype).transpose(-2, -1)) * scale
    valid = valid_mask(
        q.shape[0], q.shape[-2], k.shape[-2], q.device, key_padding_mask, query_padding_mask, causal
    )
    if valid is not None:
        logits = logits.masked_fill(~valid, float("-inf"))
    return logits


def sinkhorn_log_weights(logits: Tensor, n_iter: int) -> Tensor:
    """n_iter rounds of (normalize over queries, then over keys): n_iter=1 is DNAS."""
    log_w = logits
    for _ in range(n_iter):
        log_w = safe_log_normalize(log_w, dim=-2)  # columns: over queries i
        log_w = safe_log_normalize(log_w, dim=-1)  # rows: over keys j
    return log_w


def output_dtype(v: Tensor) -> torch.dtype:
    """The input dtype, or under autocast the autocast dtype (as a fused kernel would give)."""
    if v.dtype != torch.float64 and torch.is_autocast_enabled(v.device.type):
        return torch.get_autocast_dtype(v.device.type)
    return v.dtype
