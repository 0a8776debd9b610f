"""Fast paths: the kernels that schemes list in `fast_paths`, each with the checks that say
whether it serves a call.

A `FastPath` has a cheap `supports(normalizer, device, dtype, dropout_p, causal)` and a `run`
that may still decline (return None) after looking at the inputs; then the scheme tries its next
path, and finally its materialized reference. CPU paths compute in float32 (float64 stays) with
autocast off; CUDA paths take bf16 / fp16 / fp32 as they come (the autocast dtype under autocast)
and normalize in float32 inside. Outputs come back in the caller's dtype (or the autocast dtype).

On CUDA, DNAS / HNAS have two kernels, Triton and FlexAttention; which one serves a shape is
the measured table `cuda_choices.json` (written by `bench/attention.py --device cuda
--write-choices`), Triton where nothing was measured (see `preferred_cuda_path`).

Which path serves what: the table in docs/attention.md. Everything a scheme's paths decline runs
on its reference; `attnlab.attention.functional.route` lists the paths that would serve a call.

`AttentionCall` (one computation, as every path and the reference see it) is defined here, with
the paths: the schemes import this module, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from attnlab.attention import notices
from attnlab.attention.cuda_table import (  # noqa: F401  (paths.pinned_cuda_path etc.: docs, bench)
    CHOICE_LENGTHS,
    CUDA_CHOICES_FILE,
    DEFAULT_CUDA_PATH,
    choice_key,
    cuda_choices,
    length_bucket,
    measured_head_dims,
    pinned_cuda_path,
    preferred_cuda_path,
)
from attnlab.attention.kernels import (
    composed,
    flex,
    fused,
    sdpa,
    triton_ops,
    triton_query_normalized,
)
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
    # the FlexAttention block masks of this forward of a stack (run_stack), shared by its layers
    mask_cache: flex.MaskCache | None = None

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
        notices.fp32_without_tf32(self.name, device, dtype)
        with torch.autocast(device_type=call.q.device.type, enabled=False):
            cast = replace(call, q=call.q.to(dtype), k=call.k.to(dtype), v=call.v.to(dtype))
            out = self.run(normalizer, cast)
        return None if out is None else out.to(output_dtype(call.v))

    def when(self, condition: Callable[..., bool]) -> FastPath:
        """This path, for the normalizers that satisfy `condition` (e.g. Sinkhorn with n_iter=1)."""
        return replace(self, supports=partial(_supports_when, condition, self.supports))


# The paths are built at import; what they call later is module-level (partials, no closures),
# so that mutation testing (make mutate) can switch it per test
def _supports_when(condition, supports, normalizer, *args) -> bool:
    return condition(normalizer) and supports(normalizer, *args)


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


def _run_unas_sdpa(normalizer, call: AttentionCall) -> Tensor | None:
    # CPU with a padding mask (task batches usually carry one), not causal: the fused kernel,
    # next, takes the padding at no cost and measured faster than ATen's flash kernel with a
    # mask (docs/results.md, Benchmarks)
    padded = call.key_padding_mask is not None or call.query_padding_mask is not None
    if device_type(call.q) == "cpu" and padded and not call.causal and fused.load():
        return None
    notices.key_padding_keeps_flash_off(device_type(call.q), call.q.dtype, call.key_padding_mask is not None)
    return sdpa.unas_sdpa(call.q, call.k, call.v, *_masks(call), call.causal, call.dropout_p)


UNAS_SDPA = FastPath(
    "sdpa",
    lambda n, device, dtype, p, causal: sdpa.supports("unas", device, dtype, p, causal),
    _run_unas_sdpa,
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
def _run_triton(normalizer, call: AttentionCall) -> Tensor | None:
    if _flex_preferred(normalizer, call):  # measured faster: the flex path, next, serves it
        return None
    return triton_ops.query_normalized_attend_triton(
        call.q, call.k, call.v, call.inputs.get("u"), *_masks(call), dropout_p=call.dropout_p)


def _flex_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    # no dropout: FlexAttention cannot drop normalized weights (kernels/flex.py)
    return (device == "cuda" and dtype in CUDA_DTYPES and not causal and dropout_p == 0.0
            and flex.available("cuda"))


def _run_flex(normalizer, call: AttentionCall) -> Tensor | None:
    reason = flex.declines(call.q.shape[-1], call.v.shape[-1])
    if reason is not None:
        flex.log_decline_once(reason)
        return None
    n_iter = getattr(normalizer.options, "n_iter", 1)  # Sinkhorn's rounds; DNAS / HNAS: 1
    cache = call.mask_cache  # None outside run_stack: the kernel builds the masks of this call
    masks = None if cache is None else cache.get(call.q.shape[0], call.q.shape[-2], call.k.shape[-2],
                                                 call.q.device, *_masks(call))
    return flex.query_normalized_attend_flex(call.q, call.k, call.v, call.inputs.get("u"),
                                             *_masks(call), n_iter=n_iter, masks=masks)


QUERY_NORMALIZED_TRITON = FastPath("triton", _triton_supports, _run_triton)
QUERY_NORMALIZED_FLEX = FastPath("flex", _flex_supports, _run_flex)
QUERY_NORMALIZED_COMPOSED = FastPath("composed", _composed_supports, _run_composed)

UNAS_PATHS = (UNAS_SDPA, UNAS_FUSED_CPU, UNAS_SDPA_MATH)
QUERY_NORMALIZED_PATHS = (QUERY_NORMALIZED_FUSED_CPU, QUERY_NORMALIZED_TRITON, QUERY_NORMALIZED_FLEX,
                          QUERY_NORMALIZED_COMPOSED)
# Sinkhorn: one round is DNAS, on DNAS's kernels; FlexAttention serves any number of rounds
SINKHORN_PATHS = tuple(p if p is QUERY_NORMALIZED_FLEX else p.when(lambda n: n.options.n_iter == 1)
                       for p in QUERY_NORMALIZED_PATHS)


# ----------------------------------------------------------------------------- Triton or Flex
def _flex_preferred(normalizer, call: AttentionCall) -> bool:
    # Plain Python values from the shapes, also where torch.compile made them symbolic (dynamic
    # lengths): the bucket of the longer side, and the head dim if the table names it (else the
    # default serves). Comparisons only, which guard ranges (a new bucket compiles once more)
    # and break no graph, where reading a symbolic size as an int would.
    bucket = max(length_bucket(call.q.shape[-2]), length_bucket(call.k.shape[-2]))
    head_dim = next((d for d in measured_head_dims() if call.q.shape[-1] == d), 0)
    return (preferred_cuda_path(bucket, head_dim, call.q.dtype) == "flex"
            and _flex_supports(normalizer, "cuda", call.q.dtype, call.dropout_p, call.causal))


# ----------------------------------------------------------------------------- row-wise schemes
# sigmoid, sink, softpick, ssmax (each row of weights depends on that row's logits alone) and
# stick-breaking (causal): each tuple lists the scheme's paths in order (the fused CPU kernel,
# FlexAttention on CUDA); what they decline runs on the scheme's materialized reference.


# sigmoid, sink and softpick on the fused row-wise CPU kernel (kernels/rowwise.py, csrc/rowwise.cpp):
# padding, causal, dropout; exact gradients of q, k, v and b
def _rowwise_cpu_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return device == "cpu" and dtype in CPU_DTYPES and dropout_p < 1.0 and fused.load()


def _rowwise_cpu_run(attend: Callable[..., Tensor], normalizer, call: AttentionCall) -> Tensor | None:
    return attend(normalizer, call, *_masks(call), causal=call.causal, dropout_p=call.dropout_p)


def _sigmoid_cpu(normalizer, call: AttentionCall, *masks, **kw) -> Tensor:
    from attnlab.attention.kernels import rowwise

    return rowwise.sigmoid_attend(call.q, call.k, call.v, normalizer.options.bias,
                                  call.inputs.get("b"), *masks, **kw)


def _sink_cpu(normalizer, call: AttentionCall, *masks, **kw) -> Tensor:
    from attnlab.attention.kernels import rowwise

    return rowwise.sink_attend(call.q, call.k, call.v, call.inputs["b"], *masks, **kw)


def _softpick_cpu(normalizer, call: AttentionCall, *masks, **kw) -> Tensor:
    from attnlab.attention.kernels import rowwise

    return rowwise.softpick_attend(call.q, call.k, call.v, normalizer.options.eps, *masks, **kw)


# SSMax: UNAS on q_i scaled by c_h log(n_i) (exact; autograd gives dq and dc), on the UNAS path
# that serves the call: ATen's flash kernel (causal too), or the fused kernel (padding, dropout)
def _ssmax_cpu_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return any(p.supports(normalizer, device, dtype, dropout_p, causal)
               for p in (UNAS_SDPA, UNAS_FUSED_CPU)) and device == "cpu"


def _run_ssmax_cpu(normalizer, call: AttentionCall) -> Tensor | None:
    from attnlab.attention.kernels import rowwise

    q = rowwise.ssmax_query(call.q, call.inputs["c"], call.key_padding_mask, call.causal,
                            call.k.shape[-2])
    scaled = replace(call, q=q)
    for path in (UNAS_SDPA, UNAS_FUSED_CPU):
        if path.supports(normalizer, "cpu", q.dtype, call.dropout_p, call.causal):
            out = path.run(normalizer, scaled)
            if out is not None:
                return out
    return None


SIGMOID_FUSED_CPU = FastPath("fused_cpu", _rowwise_cpu_supports, partial(_rowwise_cpu_run, _sigmoid_cpu))
SINK_FUSED_CPU = FastPath("fused_cpu", _rowwise_cpu_supports, partial(_rowwise_cpu_run, _sink_cpu))
SOFTPICK_FUSED_CPU = FastPath("fused_cpu", _rowwise_cpu_supports, partial(_rowwise_cpu_run, _softpick_cpu))
SSMAX_SCALED_CPU = FastPath("scaled_unas_cpu", _ssmax_cpu_supports, _run_ssmax_cpu)


# sigmoid, sink and SSMax through FlexAttention (kernels/flex_rowwise.py): CUDA, no dropout,
# causal or not; head dims outside flex's kernels decline (logged once) to the reference
def _rowwise_flex_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return device == "cuda" and dtype in CUDA_DTYPES and dropout_p == 0.0 and flex.available("cuda")


def _rowwise_flex_run(attend: Callable[..., Tensor], normalizer, call: AttentionCall) -> Tensor | None:
    reason = flex.declines(call.q.shape[-1], call.v.shape[-1])
    if reason is not None:
        flex.log_decline_once(reason)
        return None
    return attend(normalizer, call)


def _sigmoid_flex(normalizer, call: AttentionCall) -> Tensor:
    from attnlab.attention.kernels import flex_rowwise

    return flex_rowwise.sigmoid_attend_flex(call.q, call.k, call.v, normalizer.options.bias,
                                            call.inputs.get("b"), *_masks(call), call.causal,
                                            call.mask_cache)


def _sink_flex(normalizer, call: AttentionCall) -> Tensor:
    from attnlab.attention.kernels import flex_rowwise

    return flex_rowwise.sink_attend_flex(call.q, call.k, call.v, call.inputs["b"], *_masks(call),
                                         call.causal, call.mask_cache)


def _ssmax_flex(normalizer, call: AttentionCall) -> Tensor:
    from attnlab.attention.kernels import flex_rowwise

    return flex_rowwise.ssmax_attend_flex(call.q, call.k, call.v, call.inputs["c"], *_masks(call),
                                          call.causal, call.mask_cache)


SIGMOID_FLEX = FastPath("flex", _rowwise_flex_supports, partial(_rowwise_flex_run, _sigmoid_flex))
SINK_FLEX = FastPath("flex", _rowwise_flex_supports, partial(_rowwise_flex_run, _sink_flex))
SSMAX_FLEX = FastPath("flex", _rowwise_flex_supports, partial(_rowwise_flex_run, _ssmax_flex))

SIGMOID_PATHS: tuple[FastPath, ...] = (SIGMOID_FUSED_CPU, SIGMOID_FLEX)
SINK_PATHS: tuple[FastPath, ...] = (SINK_FUSED_CPU, SINK_FLEX)
SOFTPICK_PATHS: tuple[FastPath, ...] = (SOFTPICK_FUSED_CPU,)
SSMAX_PATHS: tuple[FastPath, ...] = (SSMAX_SCALED_CPU, SSMAX_FLEX)


# stick-breaking by query blocks (kernels/stickbreaking.py): no S x S memory, CPU and CUDA
def _stickbreaking_blocked_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    fits = dtype in CPU_DTYPES if device == "cpu" else device == "cuda" and dtype in CUDA_DTYPES
    return fits and causal and dropout_p == 0.0


def _run_stickbreaking_blocked(normalizer, call: AttentionCall) -> Tensor | None:
    from attnlab.attention.kernels import stickbreaking as sb

    if call.q.shape[-2] * call.k.shape[-2] <= sb.MIN_PAIRS:  # one block: the reference is as lean
        return None
    return sb.stickbreaking_attend(call.q, call.k, call.v, *_masks(call),
                                   attend_current=normalizer.options.attend_current)


STICKBREAKING_BLOCKED = FastPath("blocked", _stickbreaking_blocked_supports, _run_stickbreaking_blocked)
STICKBREAKING_PATHS: tuple[FastPath, ...] = (STICKBREAKING_BLOCKED,)

