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

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.attention import paths
from attnlab.attention.reference import safe_log_normalize
from attnlab.attention.schemes.base import Normalizer
from attnlab.attention.schemes.registry import register
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


@register
class SSMax(Normalizer):
    name = "ssmax"
    Options = SSMaxOptions
    input_names = ("c",)
    fast_paths = paths.SSMAX_PATHS

    def __init__(self, options: SSMaxOptions | None = None, num_heads: int | None = None) -> None:
        super().__init__(options, num_heads)
        if self.options.learned and num_heads is not None:  # a module's scheme owns its c
            self.scale = nn.Parameter(torch.full((num_heads,), self.options.scale_init))

    def state_inputs(self) -> dict[str, Tensor]:
        if hasattr(self, "scale"):
            return {"c": self.scale.view(1, -1, 1, 1)}
        return {"c": torch.tensor(self.options.scale_init)}

    def reported(self) -> dict[str, Tensor]:
        return {"c": self.scale.detach().float().clone()} if hasattr(self, "scale") else {}

    def weights(self, logits: Tensor, c: Tensor) -> Tensor:
        valid = torch.isfinite(logits)
        log_n = torch.log(valid.sum(-1, keepdim=True).clamp(min=1).to(logits.dtype))
        scores = torch.where(valid, logits, torch.zeros_like(logits))  # -inf * 0 would be NaN
        scaled = torch.where(valid, scores * (c.to(logits.dtype) * log_n),
                             torch.full_like(logits, float("-inf")))
        return safe_log_normalize(scaled, dim=-1).exp()
