"""Entmax attention: sparse alternatives to the softmax over keys (Peters et al. 2019; alpha=2 is
sparsemax, Martins & Astudillo 2016), from the `entmax` package. Normalizes over keys, so it is
valid everywhere, decoders included.

The reference (`weights`, for the analyses and tests) materializes S_q x S_k through the `entmax`
package. Its fast path "blocked" (`kernels/entmax_blocks.py`, after AdaSplash, arXiv 2502.12082)
computes the same weights by strips of query rows, each row's threshold by safeguarded Newton
steps, without the S x S map (causal: no key block above the diagonal), on the CPU, with padding,
causal masks and dropout below 1."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.attention.kernels import entmax_blocks
from attnlab.attention.paths import CPU_DTYPES, AttentionCall, FastPath
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class EntmaxOptions:
    alpha: float = 1.5  # 1.5: entmax-1.5; 2: sparsemax; other values > 1 by bisection

    def __post_init__(self) -> None:
        if not self.alpha > 1.0:
            raise ConfigError(f"model.alpha={self.alpha:g} must be > 1 for entmax "
                              f"(1.5: entmax-1.5, 2: sparsemax; alpha -> 1 is the softmax, model=unas)")


# its kernel: by strips of query rows (kernels/entmax_blocks.py), CPU float32 / float64; dropout
# below 1 (p = 1 drops everything: the reference's zeros)
def _blocked_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return device == "cpu" and dtype in CPU_DTYPES and dropout_p < 1.0


def _run_blocked(normalizer, call: AttentionCall) -> Tensor:
    return entmax_blocks.entmax_attend(call.q, call.k, call.v, normalizer.options.alpha, *call.masks,
                                       causal=call.causal, dropout_p=call.dropout_p)


PATHS = (FastPath("blocked", _blocked_supports, _run_blocked, any_value_width=True),)


@register
class Entmax(Normalizer):
    name = "entmax"
    Options = EntmaxOptions
    fast_paths = PATHS

    def weights(self, logits: Tensor) -> Tensor:
        import entmax  # the field's implementation (exact sort-based forms for 1.5 and 2)

        valid = torch.isfinite(logits)
        # entmax has no -inf convention: masked scores sit far below every valid one, so their
        # threshold-clipped weight is exactly 0; rows without any valid key are zeroed below.
        low = logits.masked_fill(~valid, float("inf")).amin(-1, keepdim=True)
        low = torch.where(torch.isfinite(low), low, torch.zeros_like(low))
        filled = torch.where(valid, logits, low - 1e4)
        alpha = self.options.alpha
        if alpha == 1.5:
            weights = entmax.entmax15(filled, dim=-1)
        elif alpha == 2.0:
            weights = entmax.sparsemax(filled, dim=-1)
        else:
            weights = entmax.entmax_bisect(filled, alpha=alpha, dim=-1)
        return weights * valid
