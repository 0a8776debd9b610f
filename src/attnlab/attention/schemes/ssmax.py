"""SSMax, Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399): w_ij = softmax_j(c_h * log(n_i) * s_ij)
over the row's valid keys, i.e. n^(c s_ij) / sum_k n^(c s_ik), one scale c_h per head.

n_i is the number of valid keys of row i, counted per row from the masked logits (a causal row
i has n = i + 1, a padded sequence its own length). The log n factor sharpens the softmax as the
row grows, so that its largest weight does not fade with the context length. A row of one
valid key has log n = 0: that key gets weight 1, as any softmax of one element; a row without
any valid key is all 0. (Not exp(s_ij - c log n) / sum_k exp(s_ik - c log n): that shift cancels,
it is the plain softmax.)

learned=True: c_h trainable, starting at scale_init (the functional form without c uses
scale_init); learned=False: c fixed at scale_init. The paper learns one scale per head and layer;
it has no official code that we could find, and its training init is not stated where we looked:
scale_init=0.43 is the value of its Fig. 1 (at that scale SSMax equals the softmax at n = e^(1/0.43)
~ 10 keys and is sharper past it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor

from attnlab.attention.kernels import flex_rowwise, rowwise
from attnlab.attention.paths import AttentionCall, FastPath, flex_cuda, flex_serves, is_padded
from attnlab.attention.reference import safe_log_normalize
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.attention.schemes.unas import FUSED_CPU, ROWWISE_CPU, SDPA
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class SSMaxOptions:
    learned: bool = True  # c_h trainable per head; False: c fixed at scale_init
    scale_init: float = 0.43  # initial (or fixed) c
    param_lr: float | None = None  # learning rate of the scales c (None: the optimizer's)

    def __post_init__(self) -> None:
        if not abs(self.scale_init) < float("inf"):
            raise ConfigError(f"model.scale_init={self.scale_init} must be finite (the scale c of "
                              f"s * c * log n), e.g. model.scale_init=0.43")


# its kernels. On the CPU, UNAS's (schemes/unas.py) on q_i scaled by c_h log(n_i) (exact;
# autograd gives dq and dc), in UNAS's order: the fused kernel with padding (not causal), ATen's
# flash kernel through SDPA (causal too; no dropout; one head size), the fused kernel with dropout
# or another value width (not causal), the row-wise kernel's softmax (causal, another value width).
# On CUDA, FlexAttention (no dropout).
def _on_cpu(normalizer, device, dtype, dropout_p, causal) -> bool:
    return device == "cpu"


def _scaled(call: AttentionCall) -> AttentionCall:
    q = rowwise.ssmax_query(call.q, call.inputs["c"], call.key_padding_mask, call.causal,
                            call.k.shape[-2])
    return replace(call, q=q)


def _run_scaled(path: FastPath, normalizer, call: AttentionCall) -> Tensor:
    return path.run(normalizer, _scaled(call))


def _serves_scaled(path: FastPath, normalizer, call: AttentionCall) -> bool:
    with torch.no_grad():  # what the path asks of the queries it will be given (their scores)
        return path.serves(normalizer, _scaled(call))


def scaled(path: FastPath) -> FastPath:
    """UNAS's `path` on scaled queries, on the CPU: "scaled_<its name>"."""
    serves = None if path.serves is None else partial(_serves_scaled, path)
    return FastPath(f"scaled_{path.name}", partial(_both, _on_cpu, path.supports),
                    partial(_run_scaled, path), serves, path.any_value_width)


def _both(first, second, *args) -> bool:
    return first(*args) and second(*args)


def _run_flex(normalizer, call: AttentionCall) -> Tensor:
    return flex_rowwise.ssmax_attend_flex(call.q, call.k, call.v, call.inputs["c"], *call.masks,
                                          call.causal, call.mask_cache)


PATHS = (scaled(FUSED_CPU).only(is_padded), scaled(SDPA), scaled(FUSED_CPU), scaled(ROWWISE_CPU),
         FastPath("flex", flex_cuda, _run_flex, flex_serves))


@register
class SSMax(Normalizer):
    name = "ssmax"
    Options = SSMaxOptions
    input_names = ("c",)
    fast_paths = PATHS

    def __init__(self, options: SSMaxOptions | None = None, num_heads: int | None = None) -> None:
        super().__init__(options, num_heads)
        if self.options.learned and num_heads is not None:  # a module's scheme owns its c
            self.per_head("scale", self.options.scale_init, input="c", report="c")

    def default_inputs(self) -> dict[str, float]:
        return {"c": self.options.scale_init}

    def weights(self, logits: Tensor, c: Tensor) -> Tensor:
        valid = torch.isfinite(logits)
        log_n = torch.log(valid.sum(-1, keepdim=True).clamp(min=1).to(logits.dtype))
        scores = torch.where(valid, logits, torch.zeros_like(logits))  # -inf * 0 would be NaN
        scaled = torch.where(valid, scores * (c.to(logits.dtype) * log_n),
                             torch.full_like(logits, float("-inf")))
        return safe_log_normalize(scaled, dim=-1).exp()
