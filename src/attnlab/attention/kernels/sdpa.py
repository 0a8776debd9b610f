"""UNAS through torch's `scaled_dot_product_attention`, with key and query padding, causal
masks and attention dropout.

- CUDA: the flash and memory-efficient backends only (`sdpa_kernel`): in torch 2.13 the default
  cuDNN backend returns NaN `grad_q` with a mask when S % 128 == 64 on Hopper (pytorch issue
  196678). Flash takes no mask, so with padding the memory-efficient kernel runs.
- CPU: ATen's flash kernel, which has no dropout: with `dropout_p > 0` SDPA runs its math backend
  (materialized S x S, `aten::dropout` on the weights), still faster than `reference.py`
  (measured in bench/attention.py); `route` prefers the fused CPU kernel there.

Masks are bool (SDPA's convention: True = attend). A row with no key to attend to (every key
padded, or none left by the causal mask) would be NaN in SDPA: it attends to every key instead
and its output row is zeroed afterwards, as are the rows of padded queries, so that nothing
flows back through them either. The masking code is device-agnostic, so the CPU tests check it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
CPU_FLASH = [SDPBackend.FLASH_ATTENTION]
CPU_MATH = [SDPBackend.MATH]

# ATen's CPU flash kernel returns non-finite gradients when scores reach ~5e8 (q, k entries
# ~1e4, S >= 128; measured with torch 2.13): its backward recomputes exp(s - lse), whose
# rounding error grows with |s|. Above this bound on |s| the flash path declines (the fused CPU
# kernel takes over). Real models stay orders of magnitude below it.
SAFE_SCORE_BOUND = 1e6


def supports(scheme: str, device_type: str, dtype: torch.dtype, dropout_p: float,
             causal: bool) -> bool:
    """The flash / memory-efficient path: UNAS on CUDA; on the CPU without dropout."""
    if scheme != "unas":
        return False
    if device_type == "cuda":
        return dtype in (torch.float16, torch.bfloat16, torch.float32)
    return device_type == "cpu" and dtype in (torch.float32, torch.float64) and dropout_p == 0.0


def supports_math(scheme: str, device_type: str, dtype: torch.dtype, dropout_p: float,
                  causal: bool) -> bool:
    """SDPA's math backend on the CPU (materialized, exact): UNAS where flash does not serve."""
    return scheme == "unas" and device_type == "cpu" and dtype in (torch.float32, torch.float64)


def scores_may_overflow(q: Tensor, k: Tensor) -> bool:
    """|s_ij| <= |q_i| |k_j| / sqrt(d) may exceed SAFE_SCORE_BOUND (Cauchy-Schwarz; O(S d))."""
    bound = q.norm(dim=-1).amax() * k.norm(dim=-1).amax() * q.shape[-1] ** -0.5
    return bool(bound > SAFE_SCORE_BOUND)


def attend_mask(key_padding_mask: Tensor | None, causal: bool, s_q: int, s_k: int,
                device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """(SDPA bool mask or None, bool rows-without-keys or None), both broadcastable to
    (B, H, S_q, S_k) / (B, H, S_q, 1). Without key padding the causal mask stays `is_causal`
    (top-left aligned: row i sees keys 0..i, never none)."""
    if key_padding_mask is None:
        return None, None
    allowed = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, S_k)
    if causal:
        tri = torch.ones(s_q, s_k, dtype=torch.bool, device=device).tril()
        allowed = allowed & tri  # (B, 1, S_q, S_k): one per batch item, not per head
    empty = ~allowed.any(-1, keepdim=True)
    return allowed | empty, empty


def unas_sdpa(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
              query_padding_mask: Tensor | None = None, causal: bool = False,
              dropout_p: float = 0.0, backends: list | None = None) -> Tensor | None:
    """UNAS output (B, H, S_q, d_v) in q's dtype; None where the CPU flash kernel could overflow."""
    on_cpu = q.device.type == "cpu"
    if backends is None:
        backends = (CPU_FLASH if dropout_p == 0.0 else CPU_MATH) if on_cpu else CUDA_BACKENDS
    if on_cpu and SDPBackend.FLASH_ATTENTION in backends and scores_may_overflow(q, k):
        return None
    mask, empty = attend_mask(key_padding_mask, causal, q.shape[-2], k.shape[-2], q.device)
    d, d_v = q.shape[-1], v.shape[-1]
    if on_cpu and d != d_v:  # the CPU flash kernel wants one head size: zero columns change nothing
        width = max(d, d_v)
        q, k, v = (F.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                             is_causal=causal and mask is None, scale=d**-0.5)
    out = out[..., :d_v]
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    if query_padding_mask is not None:
        out = out.masked_fill(query_padding_mask[:, None, :, None], 0.0)
    return out


def unas_sdpa_math(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                   query_padding_mask: Tensor | None = None, causal: bool = False,
                   dropout_p: float = 0.0) -> Tensor:
    """UNAS on SDPA's math backend (CPU; materialized S x S, exact, dropout of the weights)."""
    return unas_sdpa(q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p, CPU_MATH)
