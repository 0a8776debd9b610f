"""Sigmoid, sink and SSMax attention through PyTorch's FlexAttention, never materializing S_q x S_k.

FlexAttention computes O = softmax_j(score_mod(s_ij)) V over the kept (query, key) pairs and
returns the row LSE = log sum_j exp(score_mod(s_ij)). Each row-wise scheme is one call:

- SSMax: a score_mod, s_ij * c_h * log(n_i), with n_i the valid keys of row i (from the padding
  masks and causality, counted in O(B S), captured per row);
- sink: O_sink = O * sigmoid(LSE - b_h), since exp(b) + sum exp(s) = exp(LSE) (1 + exp(b - LSE));
- sigmoid: score_mod = log sigmoid(s_ij + b) makes FlexAttention's normalizer
  exp(LSE) = sum_j sigmoid(s_ij + b), so O_sigmoid = O * exp(LSE); b per head (learned), per
  row (-log n_i) or 0.

The sink and sigmoid outputs need the gradient through the returned LSE: FlexAttention
differentiates through it (pytorch/pytorch#133159, "return LSE ... and also differentiating
through it"), both compiled on CUDA and in its eager math backward, which tests check.
Gradients reach the per-head parameters through the score_mod's captured tensors (SSMax's c,
sigmoid's b) or the LSE product (the sink's b).

Masks: key and query padding as in kernels/flex.py (block by block), causal (top-left aligned,
as reference.valid_mask) as a mask_mod, once per forward of a stack (`cache`: flex.MaskCache). A
row without any kept pair gives 0, never NaN. On CUDA the calls are compiled (flex._flex);
elsewhere eager (PyTorch's own check refuses a backward on the CPU). No attention dropout (it
drops normalized weights, which no score_mod can).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.attention.kernels import flex


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _row_mask(batch: int, s_q: int, s_k: int, device, key_padding_mask: Tensor | None,
              query_padding_mask: Tensor | None, causal: bool, cache: flex.MaskCache | None):
    """The BlockMask keeping (i, j) iff neither is padding (and j <= i when causal); from
    `cache` (a stack's, one per forward) when given, built there on first use."""
    build = flex.block_masks if cache is None else cache.get
    return build(batch, s_q, s_k, device, key_padding_mask, query_padding_mask,
                 _causal if causal else None, transposed=False).rows


def valid_keys(batch: int, s_q: int, s_k: int, device, key_padding_mask: Tensor | None = None,
               query_padding_mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """n_i, the number of valid keys of each row, float32 (B, S_q): 0 for a padded query, and
    with causal attention the valid keys j <= i. O(B S), never S_q x S_k."""
    keys = (torch.ones(batch, s_k, device=device) if key_padding_mask is None
            else (~key_padding_mask).float())
    if causal:
        rows = torch.arange(s_q, device=device).clamp(max=s_k - 1)
        n = keys.cumsum(-1)[:, rows]
    else:
        n = keys.sum(-1, keepdim=True).expand(batch, s_q)
    if query_padding_mask is not None:
        n = n.masked_fill(query_padding_mask, 0.0)
    return n


def _per_row(values: Tensor) -> Tensor:
    """(B, S) float32 padded with zeros to whole blocks: score_mods read it at any index of a
    boundary block, always in range."""
    return torch.nn.functional.pad(values.float(), (0, -values.shape[-1] % flex.BLOCK))


def _per_head(value: Tensor | float, batch: int, heads: int, device) -> Tensor:
    """A per-head input broadcastable to (B, H, 1, 1) as float32 (B, H)."""
    value = torch.as_tensor(value, device=device).float()
    return torch.broadcast_to(value, (batch, heads, 1, 1)).reshape(batch, heads)


def _run(q: Tensor, k: Tensor, v: Tensor, score_mod, block_mask) -> tuple[Tensor, Tensor]:
    """O and the row LSE (float32, 0 where a row keeps no pair: its O is 0 already)."""
    from torch.nn.attention.flex_attention import AuxRequest

    out, aux = flex._flex(q, k, v, score_mod=score_mod, block_mask=block_mask,
                          scale=q.shape[-1] ** -0.5, return_aux=AuxRequest(lse=True))
    lse = aux.lse.float()
    return out, torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def ssmax_attend_flex(q: Tensor, k: Tensor, v: Tensor, c: Tensor | float,
                      key_padding_mask: Tensor | None = None,
                      query_padding_mask: Tensor | None = None, causal: bool = False,
                      cache: flex.MaskCache | None = None) -> Tensor:
    """SSMax: softmax_j(s_ij * c_h * log n_i) V; c broadcastable to (B, H, 1, 1); out in q's dtype."""
    B, H, s_q, _ = q.shape
    log_n = _per_row(torch.log(valid_keys(B, s_q, k.shape[2], q.device, key_padding_mask,
                                          query_padding_mask, causal).clamp(min=1)))
    scale = _per_head(c, B, H, q.device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score * (scale[b, h] * log_n[b, q_idx])

    mask = _row_mask(B, s_q, k.shape[2], q.device, key_padding_mask, query_padding_mask, causal,
                     cache)
    return _run(q, k, v, score_mod, mask)[0]


def sink_attend_flex(q: Tensor, k: Tensor, v: Tensor, b: Tensor | float,
                     key_padding_mask: Tensor | None = None,
                     query_padding_mask: Tensor | None = None, causal: bool = False,
                     cache: flex.MaskCache | None = None) -> Tensor:
    """Sink: softmax(s) V * sigmoid(LSE - b_h); b broadcastable to (B, H, 1, 1)."""
    B, H, s_q, _ = q.shape
    sink = _per_head(b, B, H, q.device)
    mask = _row_mask(B, s_q, k.shape[2], q.device, key_padding_mask, query_padding_mask, causal,
                     cache)
    out, lse = _run(q, k, v, None, mask)
    kept = torch.sigmoid(lse - sink[..., None])  # the mass the keys keep: 1 - the sink's
    return (out.float() * kept[..., None]).to(q.dtype)


def _log_sigmoid(x: Tensor) -> Tensor:
    """log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)), stable for any x (elementwise ops only)."""
    return torch.clamp(x, max=0.0) - torch.log1p(torch.exp(-x.abs()))


def sigmoid_attend_flex(q: Tensor, k: Tensor, v: Tensor, bias: str = "log_n",
                        b: Tensor | float | None = None, key_padding_mask: Tensor | None = None,
                        query_padding_mask: Tensor | None = None, causal: bool = False,
                        cache: flex.MaskCache | None = None) -> Tensor:
    """Sigmoid: sum_j sigmoid(s_ij + b) v_j, with bias "log_n" (b = -log n_i), "learned" (b, one
    per head, broadcastable to (B, H, 1, 1)) or "zero". (Each: `cache`, a stack's MaskCache.)"""
    B, H, s_q, _ = q.shape
    s_k = k.shape[2]
    if bias == "log_n":
        n = valid_keys(B, s_q, s_k, q.device, key_padding_mask, query_padding_mask, causal)
        row_bias = -torch.log(n.clamp(min=1))
    else:
        row_bias = torch.zeros(B, s_q, device=q.device)
    row_bias = _per_row(row_bias)
    head_bias = _per_head(b if bias == "learned" else 0.0, B, H, q.device)

    def score_mod(score, b_, h, q_idx, kv_idx):
        return _log_sigmoid(score + head_bias[b_, h] + row_bias[b_, q_idx])

    mask = _row_mask(B, s_q, s_k, q.device, key_padding_mask, query_padding_mask, causal, cache)
    out, lse = _run(q, k, v, score_mod, mask)
    return (out.float() * torch.exp(lse)[..., None]).to(q.dtype)


__all__ = ["sigmoid_attend_flex", "sink_attend_flex", "ssmax_attend_flex", "valid_keys"]
