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

CPU flash with padding and no causal mask (`_PaddedFlash`; where the fused CPU kernel cannot be
built: with it, `paths` sends padded non-causal UNAS there, faster): ATen's kernel is called directly
with the key padding as a (B, 1, 1, S_k) additive bias, and the rows to zero are zeroed in
its fresh output in place, with their row log-sum-exp set to +inf, so that its backward sees
P = 0 there and nothing flows back through them. Through SDPA the same took two out-of-place
masked_fill (a copy of the output each, and of the gradient each in the backward): measured
1.32x bare SDPA at S = 1,024 with key and query padding (bench/attention.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

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
    """|s_ij| <= |q_i| |k_j| / sqrt(d) <= sqrt(d) max|q| max|k| may exceed SAFE_SCORE_BOUND
    (Cauchy-Schwarz; the entry-wise bound takes one `aminmax` sweep per tensor, a fifth of the
    time of row norms: measured 2.4 vs 12 ms at B=8, H=12, S=1024, d=64)."""
    q_max, k_max = (torch.aminmax(t) for t in (q, k))
    bound = (torch.maximum(-q_max.min, q_max.max) * torch.maximum(-k_max.min, k_max.max)
             * q.shape[-1] ** 0.5)
    return bool(bound > SAFE_SCORE_BOUND)


def flash_fits(q: Tensor, k: Tensor, dropout_p: float) -> bool:
    """Whether `unas_sdpa` may run this call: on the CPU without dropout (ATen's flash kernel),
    only where the scores cannot overflow it. Not checked under torch.compile: a check of the
    values would break the graph at every call, and the bound is orders of magnitude above a real
    model's scores."""
    if q.device.type != "cpu" or dropout_p != 0.0 or torch.compiler.is_compiling():
        return True
    return not scores_may_overflow(q, k)


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


class _PaddedFlash(torch.autograd.Function):
    """ATen's CPU flash kernel with an additive key bias; the query rows in `zero_rows` (bool
    (B, S_q)) get output 0 and no gradient (their LSE is set to +inf: P = 0 in the backward)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, zero_rows, scale):
        out, lse = _flash(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
        if zero_rows is not None:  # out and lse are this call's own tensors: in place is safe
            _zero_query_rows(out, zero_rows)
            lse.masked_fill_(zero_rows[:, None, :], float("inf"))
        ctx.save_for_backward(q, k, v, out, lse, bias)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, bias = ctx.saved_tensors
        dq, dk, dv = _flash_backward(grad, q, k, v, out, lse, 0.0, False, attn_mask=bias,
                                     scale=ctx.scale)
        return dq, dk, dv, None, None, None


def _zero_query_rows(out: Tensor, rows: Tensor) -> None:
    """out[b, :, i] = 0 where rows[b, i]. The kernel's output is (B, S_q, H, d) memory: there
    the padded rows are whole (H d) rows, zeroed by index (a masked_fill_ sweeps all of out)."""
    B, H, S_q, d = out.shape
    by_query = out.transpose(1, 2)
    if by_query.is_contiguous():
        by_query.view(B * S_q, H * d).index_fill_(0, rows.flatten().nonzero().squeeze(1), 0.0)
    else:
        out.masked_fill_(rows[:, None, :, None], 0.0)


def _padded_flash(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None,
                  query_padding_mask: Tensor | None, scale: float) -> Tensor:
    """UNAS with padding on the CPU flash kernel (one head size), rows without keys zeroed."""
    zero_rows = query_padding_mask
    bias = None
    if key_padding_mask is not None:
        empty = key_padding_mask.all(-1)  # items with every key padded: attend to all, zero
        bias = torch.zeros(key_padding_mask.shape, dtype=q.dtype)
        bias.masked_fill_(key_padding_mask & ~empty[:, None], float("-inf"))
        bias = bias[:, None, None, :]  # contiguous: the kernel broadcasts it over queries
        if torch.compiler.is_compiling() or bool(empty.any()):  # compiled: no data-dependent branch
            empty = empty[:, None].expand(-1, q.shape[-2])
            zero_rows = empty if zero_rows is None else zero_rows | empty
    return _PaddedFlash.apply(q, k, v, bias, zero_rows, scale)


def unas_sdpa(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
              query_padding_mask: Tensor | None = None, causal: bool = False,
              dropout_p: float = 0.0, backends: list | None = None) -> Tensor:
    """UNAS output (B, H, S_q, d_v) in q's dtype (on the CPU, ATen's flash kernel without
    dropout: callers check `flash_fits` first)."""
    on_cpu = q.device.type == "cpu"
    if backends is None:
        backends = (CPU_FLASH if dropout_p == 0.0 else CPU_MATH) if on_cpu else CUDA_BACKENDS
    d, d_v = q.shape[-1], v.shape[-1]
    if on_cpu and d != d_v:  # the CPU flash kernel wants one head size: zero columns change nothing
        width = max(d, d_v)
        q, k, v = (F.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
    if SDPBackend.EFFICIENT_ATTENTION in backends and (d % 8 or d_v % 8):
        # CUDA: with a mask only the memory-efficient kernel serves, and it wants head sizes that
        # are multiples of 8 ("No available kernel" otherwise, seen on an H200 with d = 52);
        # zero columns change neither the scores (the scale is d's) nor the kept output columns.
        # Decided by the backends, not the device, so the CPU tests run it (backends= given)
        q, k, v = (F.pad(x, (0, -x.shape[-1] % 8)) for x in (q, k, v))
    padded = key_padding_mask is not None or query_padding_mask is not None
    if on_cpu and backends == CPU_FLASH and padded and not causal:
        return _padded_flash(q, k, v, key_padding_mask, query_padding_mask, d**-0.5)[..., :d_v]
    mask, empty = attend_mask(key_padding_mask, causal, q.shape[-2], k.shape[-2], q.device)
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
