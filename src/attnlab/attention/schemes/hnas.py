"""HNAS: hybrid of DNAS and UNAS with a trainable mix u in [0, 1] (seed paper, Eq. 12).

pi = u * pi_dnas + (1 - u) * pi_unas, one u per head (or per layer), trained through its logit
`hybrid_logit`. Linear in the weights, so the fused paths compute u * out_dnas + (1 - u) * out_unas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from attnlab.attention.reference import safe_log_normalize, sinkhorn_log_weights
from attnlab.attention.schemes.dnas import QUERY_NORMALIZED_PATHS
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError

# u is kept away from exactly 0 or 1 so that its logit (the trained parameter) stays finite.
U_CLAMP = 1e-4


@dataclass(frozen=True)
class HybridOptions:
    hybrid_init: float = 0.5  # initial u, the weight of DNAS
    hybrid_per: str = "head"  # one u per head, or one per layer
    param_lr: float | None = None  # learning rate of the u logits (None: the optimizer's)

    def __post_init__(self) -> None:
        if not 0.0 <= self.hybrid_init <= 1.0:
            raise ConfigError(
                f"model.hybrid_init={self.hybrid_init:g} is outside [0, 1]; u is the weight of DNAS "
                f"in HNAS, e.g. model.hybrid_init=0.5"
            )
        if self.hybrid_per not in ("head", "layer"):
            raise ConfigError(
                f"model.hybrid_per={self.hybrid_per!r}; use 'head' (one u per head) or 'layer'"
            )


@register
class HNAS(Normalizer):
    name = "hnas"
    over_queries = True
    Options = HybridOptions
    input_names = ("u",)
    reported_labels: ClassVar[dict[str, str]] = {"u": "u (weight of DNAS)"}
    fast_paths = QUERY_NORMALIZED_PATHS

    def __init__(self, options: HybridOptions | None = None, num_heads: int | None = None) -> None:
        super().__init__(options, num_heads)
        if num_heads is not None:  # a module's scheme owns its u; the functional form is given u
            u0 = min(max(self.options.hybrid_init, U_CLAMP), 1 - U_CLAMP)
            self.per_head("hybrid_logit", math.log(u0 / (1 - u0)), per=self.options.hybrid_per,
                          input="u", report="u", value=torch.sigmoid)

    @property
    def u(self) -> Tensor:
        """u per head, detached, shape (H,)."""
        return self.reported()["u"]

    def weights(self, logits: Tensor, u: Tensor) -> Tensor:
        u = u.to(logits.dtype)
        dnas = sinkhorn_log_weights(logits, 1).exp()
        unas = safe_log_normalize(logits, dim=-1).exp()
        return u * dnas + (1 - u) * unas
