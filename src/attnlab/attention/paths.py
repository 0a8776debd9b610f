"""Fast paths, the mechanism: `AttentionCall` (one computation, as every path and the reference
see it), `FastPath` (a kernel and the calls it serves) and `choose` (the first path of a scheme's
list that accepts a call). Which kernels a scheme has, and in which order, the scheme says
itself: its `fast_paths`, beside it in its file under attention/schemes/. This module knows no
scheme and no option.

A path accepts a call in two steps, both decided before anything runs:
- `supports(normalizer, device, dtype, dropout_p, causal)`: the kinds of call it serves (cheap;
  what `candidates` lists);
- `serves(normalizer, call)`: what the kind alone cannot tell: masks, shapes, values (e.g. a
  head size a kernel lacks, scores that would overflow). None: every call of a supported kind.
Then `run` computes; it never declines, so the path `choose` names is the kernel that runs
(`Normalizer.route(call)`). Priority is the order of the list: a path meant to win only for
some calls is listed first with that condition (`only`), e.g. UNAS's fused CPU kernel for
padded calls before SDPA.

CPU paths compute in float32 (float64 stays) with autocast off; CUDA paths take bf16 / fp16 /
fp32 as they come (the autocast dtype under autocast) and normalize in float32 inside. Outputs
come back in the caller's dtype (or the autocast dtype). Which path serves what: the table in
docs/attention.md (`python -m attnlab.docs` writes it from `route`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from attnlab.attention import notices
from attnlab.attention.kernels import flex, fused
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
    def masks(self) -> tuple[Tensor | None, Tensor | None]:
        return self.key_padding_mask, self.query_padding_mask

    @property
    def padded(self) -> bool:
        return self.key_padding_mask is not None or self.query_padding_mask is not None


@dataclass(frozen=True)
class FastPath:
    """A kernel of a scheme: the calls it serves (`supports`, `serves`) and how it runs (`run`)."""

    name: str
    supports: Callable[..., bool]  # (normalizer, device, dtype, dropout_p, causal) -> bool
    run: Callable[..., Tensor]  # (normalizer, call in the working dtype) -> out
    serves: Callable[..., bool] | None = None  # (normalizer, call) -> bool; None: every call
    # it takes a value of another width than the query's (the C++ CPU kernels, entmax's strips);
    # False: a kernel of one head size (flash, Triton, Flex): a caller with a wider value (diff's
    # half-width maps) splits the value into pieces of the query's width, one call each
    any_value_width: bool = False

    def accepts(self, normalizer, call: AttentionCall) -> bool:
        device = device_type(call.q)
        dtype = working_dtype(call.q, device)
        return (self.supports(normalizer, device, dtype, call.dropout_p, call.causal)
                and (self.serves is None or self.serves(normalizer, call)))

    def __call__(self, normalizer, call: AttentionCall) -> Tensor:
        """Run on `call` cast to the working dtype (autocast off); out in the caller's dtype."""
        device = device_type(call.q)
        dtype = working_dtype(call.q, device)
        notices.fp32_without_tf32(self.name, device, dtype)
        with torch.autocast(device_type=call.q.device.type, enabled=False):
            cast = replace(call, q=call.q.to(dtype), k=call.k.to(dtype), v=call.v.to(dtype))
            out = self.run(normalizer, cast)
        return out.to(output_dtype(call.v))

    def when(self, condition: Callable[[Any], bool]) -> FastPath:
        """This path, for the normalizers that satisfy `condition` (e.g. Sinkhorn with n_iter=1)."""
        return replace(self, supports=partial(_supports_when, condition, self.supports))

    def only(self, condition: Callable[[Any, AttentionCall], bool]) -> FastPath:
        """This path, for the calls that also satisfy `condition(normalizer, call)`."""
        return replace(self, serves=partial(_serves_only, condition, self.serves))


# The paths are built at import; what they call later is module-level (partials, no closures),
# so that mutation testing (make mutate) can switch it per test
def _supports_when(condition, supports, normalizer, *args) -> bool:
    return condition(normalizer) and supports(normalizer, *args)


def _serves_only(condition, serves, normalizer, call: AttentionCall) -> bool:
    return condition(normalizer, call) and (serves is None or serves(normalizer, call))


def choose(paths: Sequence[FastPath], normalizer, call: AttentionCall) -> FastPath | None:
    """The first of `paths` that accepts `call` (None: the scheme's reference runs)."""
    for path in paths:
        if path.accepts(normalizer, call):
            return path
    return None


# ----------------------------------------------------------------------------- shared conditions
# what the paths of several schemes ask of a call, by kernel (no scheme, no option)
def is_padded(normalizer, call: AttentionCall) -> bool:
    return call.padded


def compiled_cpu(normalizer, device, dtype, dropout_p, causal) -> bool:
    """The compiled C++ CPU library (kernels/fused.py: its row-wise kernel takes padding, causal
    masks and dropout below 1)."""
    return device == "cpu" and dtype in CPU_DTYPES and dropout_p < 1.0 and fused.load()


def flex_cuda(normalizer, device, dtype, dropout_p, causal) -> bool:
    """FlexAttention on CUDA, without dropout (no score_mod can drop normalized weights)."""
    return device == "cuda" and dtype in CUDA_DTYPES and dropout_p == 0.0 and flex.available("cuda")


def flex_serves(normalizer, call: AttentionCall) -> bool:
    """FlexAttention's kernels take the call's head sizes (else said once, and the next path or
    the reference serves it)."""
    reason = flex.declines(call.q.shape[-1], call.v.shape[-1])
    if reason is not None:
        flex.log_decline_once(reason)
    return reason is None
