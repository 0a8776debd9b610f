"""Fast paths: the kernels that schemes list in `fast_paths`, each with the checks that say
whether it serves a call (else it returns None and the scheme tries its next path, then its
materialized reference).

CPU:
- `unas_cpu_flash`: ATen's CPU flash-attention kernel (composed.unas_flash); no dropout.
- `query_normalized_cpu_fused`: the fused C++ DNAS/HNAS kernel (fused.py, csrc/); HNAS when the
  call carries `u`, DNAS otherwise; no dropout, never causal; needs the compiled kernel.
- `query_normalized_cpu_composed`: the same schemes composed from the flash kernel (composed.py),
  where the fused kernel cannot be built (no compiler, or ATTNLAB_FUSED_KERNEL=0).

Every CPU path computes in float32 (float64 stays) with autocast off, and returns the caller's
dtype (or the autocast dtype), as the reference does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnlab.attention import composed, fused
from attnlab.attention.reference import compute_dtype, output_dtype
from attnlab.attention.schemes.base import AttentionCall


def _cpu_float32(call: AttentionCall, kernel: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Tensor:
    dtype, out_dtype = compute_dtype(call.q), output_dtype(call.v)
    with torch.autocast(device_type="cpu", enabled=False):
        out = kernel(*(x.to(dtype) for x in (call.q, call.k, call.v)))
    return out.to(out_dtype)


def _u(call: AttentionCall, dtype: torch.dtype) -> Tensor | None:
    u = call.inputs.get("u")
    return None if u is None else u.to(dtype)


def unas_cpu_flash(normalizer, call: AttentionCall) -> Tensor | None:
    if call.device_type != "cpu" or call.dropout_p > 0:
        return None
    return _cpu_float32(call, lambda q, k, v: composed.unas_flash(
        q, k, v, call.key_padding_mask, call.query_padding_mask, call.causal))


def query_normalized_cpu_fused(normalizer, call: AttentionCall) -> Tensor | None:
    if call.device_type != "cpu" or call.dropout_p > 0 or call.causal or not fused.load():
        return None
    return _cpu_float32(call, lambda q, k, v: fused.query_normalized_attend(
        q, k, v, _u(call, q.dtype), call.key_padding_mask, call.query_padding_mask))


def query_normalized_cpu_composed(normalizer, call: AttentionCall) -> Tensor | None:
    if call.device_type != "cpu" or call.dropout_p > 0 or call.causal:
        return None

    def kernel(q, k, v):
        u = _u(call, q.dtype)
        if u is None:
            return composed.dnas_flash(q, k, v, call.key_padding_mask, call.query_padding_mask)
        return composed.hnas_flash(q, k, v, u, call.key_padding_mask, call.query_padding_mask)

    return _cpu_float32(call, kernel)
