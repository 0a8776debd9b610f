"""The fast attention paths and which one `attend` runs (scheme x device x dtype x options).

Each path is a plain function `run(call) -> Tensor | None` (None: it looked at the inputs and
declines them) with a cheap predicate `supports(scheme, device_type, dtype, dropout_p, causal)`.
`route` lists the paths that support a call, in the scheme's order of preference, always ending
with the materialized reference; `attend` runs the first one that does not decline.

| path      | code                               | serves                                              |
|-----------|------------------------------------|-----------------------------------------------------|
| sdpa      | kernels/sdpa.py                    | unas on CUDA (flash + mem-efficient; dropout), on the CPU without dropout (ATen's flash; declines scores > 1e6) |
| fused_cpu | fused.py + csrc/                   | dnas / hnas on the CPU, with dropout; unas on the CPU with dropout, or scores flash declines |
| triton    | kernels/triton_query_normalized.py | dnas / hnas on CUDA, with dropout                   |
| composed  | composed.py                        | dnas / hnas on the CPU without dropout when the C++ kernel cannot be built (declines scores > 1e6) |
| sdpa_math | kernels/sdpa.py                    | unas on the CPU with dropout when the C++ kernel cannot be built, causal unas with dropout |
| reference | reference.py                       | everything else: sinkhorn n_iter > 1, float64 on CUDA, other devices |

CPU paths compute in float32 (float64 stays) with autocast off; CUDA paths take bf16 / fp16 /
fp32 as they come (the autocast dtype under autocast) and normalize in float32 inside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnlab.attention import composed, fused, reference
from attnlab.attention.kernels import sdpa, triton_query_normalized


@dataclass(frozen=True)
class Call:
    """One validated `attend` call (scheme already resolved: sinkhorn with n_iter=1 is dnas)."""

    q: Tensor
    k: Tensor
    v: Tensor
    scheme: str
    key_padding_mask: Tensor | None = None
    query_padding_mask: Tensor | None = None
    u: Tensor | None = None
    n_iter: int = 1
    causal: bool = False
    dropout_p: float = 0.0


@dataclass(frozen=True)
class Path:
    supports: Callable[[str, str, torch.dtype, float, bool], bool]
    run: Callable[[Call], Tensor | None]


def device_type(t: Tensor) -> str:
    """The device check routing uses (tests monkeypatch it to route CPU tensors as CUDA)."""
    return t.device.type


def _cpu_fused_supports(scheme, device, dtype, dropout_p, causal) -> bool:
    return (device == "cpu" and dtype in (torch.float32, torch.float64) and not causal
            and scheme in ("unas", "dnas", "hnas") and dropout_p < 1.0 and fused.load())


def _triton_supports(scheme, device, dtype, dropout_p, causal) -> bool:
    return (device == "cuda" and scheme in ("dnas", "hnas") and not causal and dropout_p < 1.0
            and dtype in (torch.float16, torch.bfloat16, torch.float32)
            and triton_query_normalized.available("cuda"))


def _composed_supports(scheme, device, dtype, dropout_p, causal) -> bool:
    return (device == "cpu" and scheme in ("dnas", "hnas") and dropout_p == 0.0
            and dtype in (torch.float32, torch.float64))


def _run_sdpa(c: Call) -> Tensor | None:
    return sdpa.unas_sdpa(c.q, c.k, c.v, c.key_padding_mask, c.query_padding_mask, c.causal,
                          c.dropout_p)


def _run_sdpa_math(c: Call) -> Tensor:
    return sdpa.unas_sdpa_math(c.q, c.k, c.v, c.key_padding_mask, c.query_padding_mask,
                               c.causal, c.dropout_p)


def _run_fused(c: Call) -> Tensor:
    masks = (c.key_padding_mask, c.query_padding_mask)
    if c.scheme == "unas":
        return fused.unas_attend(c.q, c.k, c.v, *masks, dropout_p=c.dropout_p)
    u = c.u.to(c.q.dtype) if c.scheme == "hnas" else None
    return fused.query_normalized_attend(c.q, c.k, c.v, u, *masks, dropout_p=c.dropout_p)


def _run_triton(c: Call) -> Tensor:
    u = c.u if c.scheme == "hnas" else None
    return triton_query_normalized.query_normalized_attend_triton(
        c.q, c.k, c.v, u, c.key_padding_mask, c.query_padding_mask, dropout_p=c.dropout_p
    )


def _run_composed(c: Call) -> Tensor | None:
    if sdpa.scores_may_overflow(c.q, c.k):  # it runs on ATen's CPU flash kernel too
        return None
    masks = (c.key_padding_mask, c.query_padding_mask)
    if c.scheme == "dnas":
        return composed.dnas_flash(c.q, c.k, c.v, *masks)
    return composed.hnas_flash(c.q, c.k, c.v, c.u.to(c.q.dtype), *masks)


def _run_reference(c: Call) -> Tensor:
    return reference.reference_attend(c.q, c.k, c.v, c.scheme, c.key_padding_mask,
                                      c.query_padding_mask, c.u, c.n_iter, c.causal, c.dropout_p)


PATHS: dict[str, Path] = {
    "sdpa": Path(sdpa.supports, _run_sdpa),
    "fused_cpu": Path(_cpu_fused_supports, _run_fused),
    "triton": Path(_triton_supports, _run_triton),
    "composed": Path(_composed_supports, _run_composed),
    "sdpa_math": Path(sdpa.supports_math, _run_sdpa_math),
}
# Per scheme, the fast paths in order of preference (the reference comes last, always).
ORDER = {
    "unas": ("sdpa", "fused_cpu", "sdpa_math"),
    "dnas": ("fused_cpu", "triton", "composed"),
    "hnas": ("fused_cpu", "triton", "composed"),
    "sinkhorn": (),  # n_iter > 1: see README (performance) for why it stays materialized
}


def working_dtype(q: Tensor, device: str) -> torch.dtype:
    """CPU: float32 (float64 stays), as the kernels there need; CUDA: the autocast dtype under
    autocast, else q's dtype."""
    if device != "cuda":
        return reference.compute_dtype(q)
    if q.dtype != torch.float64 and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return q.dtype


def route(scheme: str, device: str, dtype: torch.dtype, dropout_p: float = 0.0,
          causal: bool = False) -> list[str]:
    """Names of the paths that serve these options, best first, ending with "reference"."""
    fast = [name for name in ORDER[scheme]
            if PATHS[name].supports(scheme, device, dtype, dropout_p, causal)]
    return [*fast, "reference"]


def attend(call: Call) -> Tensor:
    """Run `call` on the first path of `route` that does not decline it."""
    device = device_type(call.q)
    dtype = working_dtype(call.q, device)
    for name in route(call.scheme, device, dtype, call.dropout_p, call.causal):
        if name == "reference":
            break
        out_dtype = reference.output_dtype(call.v)
        with torch.autocast(device_type=call.q.device.type, enabled=False):
            cast = replace(call, q=call.q.to(dtype), k=call.k.to(dtype), v=call.v.to(dtype))
            out = PATHS[name].run(cast)
        if out is not None:
            return out.to(out_dtype)
    return _run_reference(call)
