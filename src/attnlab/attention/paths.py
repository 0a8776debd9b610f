"""Fast paths: the kernels that schemes list in `fast_paths`, each with the checks that say
whether it serves a call.

A `FastPath` has a cheap `supports(normalizer, device, dtype, dropout_p, causal)` and a `run`
that may still decline (return None) after looking at the inputs; then the scheme tries its next
path, and finally its materialized reference. CPU paths compute in float32 (float64 stays) with
autocast off; CUDA paths take bf16 / fp16 / fp32 as they come (the autocast dtype under autocast)
and normalize in float32 inside. Outputs come back in the caller's dtype (or the autocast dtype).

Which path serves what: the table in docs/attention.md. Everything a scheme's paths decline runs
on its reference; `attnlab.attention.functional.route` lists the paths that would serve a call.

`AttentionCall` (one computation, as every path and the reference see it) is defined here, with
the paths: the schemes import this module, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from attnlab.attention.kernels import composed, fused, sdpa, triton_query_normalized
from attnlab.attention.reference import compute_dtype, output_dtype

CPU_DTYPES = (torch.float32, torch.float64)
CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def device_type(t: Tensor) -> str:
    """The device check of every path (tests patch it to route CPU tensors as CUDA ones)."""
    return t.device.type


def working_dtype(q: Tensor, device: str) -> torch.dtype:
    """CPU: float32 (float64 stays); CUDA: the autocast dtype under autocast, else q's dtype."""
    if device != "cuda":
        return compute_dtype(q)
    if q.dtype != torch.float64 and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return q.dtype


@dataclass(frozen=True)
class AttentionCall:
    """One attention computation, as every path sees it (masks: bool (B, S), True = padding)."""

    q: Tensor  # (B, H, S_q, d)
    k: Tensor  # (B, H, S_k, d)
    v: Tensor  # (B, H, S_k, d_v)
    key_padding_mask: Tensor | None = None
    query_padding_mask: Tensor | None = None
    causal: bool = False
    dropout_p: float = 0.0
    inputs: dict[str, Tensor] = field(default_factory=dict)  # scheme inputs, e.g. HNAS's u

    @property
    def device_type(self) -> str:
        return self.q.device.type


# What a scheme lists in `fast_paths`: (normalizer, call) -> output, or None to decline. A
# `FastPath` is one; any such callable serves.
PathFunction = Callable[[Any, AttentionCall], "Tensor | None"]


@dataclass(frozen=True)
class FastPath:
    name: str
    supports: Callable[..., bool]  # (normalizer, device, dtype, dropout_p, causal) -> bool
    run: Callable[..., Tensor | None]  # (normalizer, call in the working dtype) -> out or None

    def __call__(self, normalizer, call: AttentionCall) -> Tensor | None:
        device = device_type(call.q)
        dtype = working_dtype(call.q, device)
        if not self.supports(normalizer, device, dtype, call.dropout_p, call.causal):
            return None
        with torch.autocast(device_type=call.q.device.type, enabled=False):
            cast = replace(call, q=call.q.to(dtype), k=call.k.to(dtype), v=call.v.to(dtype))
            out = self.run(normalizer, cast)
        return None if out is None else out.to(output_dtype(call.v))

    def when(self, condition: Callable[..., bool]) -> FastPath:
        """This path, for the normalizers that satisfy `condition` (e.g. Sinkhorn with n_iter=1)."""
        return replace(self, supports=lambda n, *args: condition(n) and self.supports(n, *args))


def _u(call: AttentionCall) -> Tensor | None:
    u = call.inputs.get("u")
    return None if u is None else u.to(call.q.dtype)


def _masks(call: AttentionCall) -> tuple:
    return call.key_padding_mask, call.query_padding_mask


def _cpu_fused_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return device == "cpu" and dtype in CPU_DTYPES and not causal and dropout_p < 1.0 and fused.load()


def _triton_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return (device == "cuda" and dtype in CUDA_DTYPES and not causal and dropout_p < 1.0
            and triton_query_normalized.available("cuda"))


def _composed_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return device == "cpu" and dtype in CPU_DTYPES and dropout_p == 0.0 and not causal


def _run_composed(normalizer, call: AttentionCall) -> Tensor | None:
    if sdpa.scores_may_overflow(call.q, call.k):  # it runs on ATen's CPU flash kernel too
        return None
    u = _u(call)
    if u is None:
        return composed.dnas_flash(call.q, call.k, call.v, *_masks(call))
    return composed.hnas_flash(call.q, call.k, call.v, u, *_masks(call))


UNAS_SDPA = FastPath(
    "sdpa",
    lambda n, device, dtype, p, causal: sdpa.supports("unas", device, dtype, p, causal),
    lambda n, c: sdpa.unas_sdpa(c.q, c.k, c.v, *_masks(c), c.causal, c.dropout_p),
)
UNAS_FUSED_CPU = FastPath(
    "fused_cpu", _cpu_fused_supports,
    lambda n, c: fused.unas_attend(c.q, c.k, c.v, *_masks(c), dropout_p=c.dropout_p),
)
UNAS_SDPA_MATH = FastPath(
    "sdpa_math",
    lambda n, device, dtype, p, causal: sdpa.supports_math("unas", device, dtype, p, causal),
    lambda n, c: sdpa.unas_sdpa_math(c.q, c.k, c.v, *_masks(c), c.causal, c.dropout_p),
)
# DNAS when the call carries no `u`, HNAS when it does (the scheme's `input_names` decide)
QUERY_NORMALIZED_FUSED_CPU = FastPath(
    "fused_cpu", _cpu_fused_supports,
    lambda n, c: fused.query_normalized_attend(c.q, c.k, c.v, _u(c), *_masks(c), dropout_p=c.dropout_p),
)
QUERY_NORMALIZED_TRITON = FastPath(
    "triton", _triton_supports,
    lambda n, c: triton_query_normalized.query_normalized_attend_triton(
        c.q, c.k, c.v, c.inputs.get("u"), *_masks(c), dropout_p=c.dropout_p),
)
QUERY_NORMALIZED_COMPOSED = FastPath("composed", _composed_supports, _run_composed)

UNAS_PATHS = (UNAS_SDPA, UNAS_FUSED_CPU, UNAS_SDPA_MATH)
QUERY_NORMALIZED_PATHS = (QUERY_NORMALIZED_FUSED_CPU, QUERY_NORMALIZED_TRITON, QUERY_NORMALIZED_COMPOSED)
