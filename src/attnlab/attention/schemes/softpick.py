"""Softpick: the rectified softmax (Zuhri et al. 2025, "Softpick: No Attention Sink, No Massive
Activations with Rectified Softmax"; code: github.com/zaydzuhri/softpick-attention).

    w_ij = relu(exp(s_ij) - 1) / (sum_k |exp(s_ik) - 1| + eps)

over the valid keys k of row i. A key whose logit is <= 0 gets exactly 0, and a row need not sum
to 1 (it sums to < 1 whenever some valid logit is < 0; a row whose valid logits are all <= 0 is
all 0): no key has to soak up attention, so there is no attention sink. Normalizes over keys, so
it runs everywhere, decoders included.

Computed as the authors' `softpick` (naive_softpick_attn.py) does, shifted by the row max m so
that exp never overflows:

    relu(exp(s - m) - exp(-m)) / (sum_k |exp(s_k - m) - exp(-m)| + eps)

with their eps (1e-8), added to the *shifted* denominator. One difference: the shift is
c = max(m, 0) instead of m. For a row with m >= 0 (every row with a nonzero weight) that is their
computation, values and gradients alike. For a row with m < 0 every weight is 0 either way, but
their exp(-m) overflows once m < -88 (float32), and 0 * inf gives NaN gradients; with c = 0 it
cannot. Padded keys never enter the denominator; a row without a valid key is all 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.attention.kernels import rowwise
from attnlab.attention.paths import AttentionCall, FastPath, compiled_cpu
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class SoftpickOptions:
    eps: float = 1e-8  # added to the (shifted) denominator, as in the authors' code

    def __post_init__(self) -> None:
        if not (math.isfinite(self.eps) and self.eps > 0.0):
            raise ConfigError(f"model.eps={self.eps:g} must be a finite number > 0 for softpick (it "
                              f"keeps a row whose valid logits are all 0 from dividing 0 by 0); "
                              f"use e.g. model.eps=1e-8")


def softpick_weights(logits: Tensor, eps: float) -> Tensor:
    """Softpick over the last dim of logits that are -inf where masked (see the module doc)."""
    valid = torch.isfinite(logits)
    m = logits.amax(dim=-1, keepdim=True)  # not detached: as the authors' torch.max
    c = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).clamp(min=0.0)
    shifted = torch.exp(logits - c) - torch.exp(-c)  # exp(s) - 1, scaled by exp(-c); masked: -exp(-c)
    numerator = torch.where(valid, torch.relu(shifted), torch.zeros_like(shifted))
    denominator = torch.where(valid, shifted.abs(), torch.zeros_like(shifted)).sum(-1, keepdim=True)
    return numerator / (denominator + eps)


# its kernel: the fused row-wise C++ kernel on the CPU (padding, causal, dropout); elsewhere the
# reference
def _run_cpu(normalizer, call: AttentionCall) -> Tensor:
    return rowwise.softpick_attend(call.q, call.k, call.v, normalizer.options.eps, *call.masks,
                                   causal=call.causal, dropout_p=call.dropout_p)


PATHS = (FastPath("fused_cpu", compiled_cpu, _run_cpu, any_value_width=True),)


@register
class Softpick(Normalizer):
    name = "softpick"
    rows_sum_to_one = False
    Options = SoftpickOptions
    fast_paths = PATHS

    def weights(self, logits: Tensor) -> Tensor:
        return softpick_weights(logits, self.options.eps)
