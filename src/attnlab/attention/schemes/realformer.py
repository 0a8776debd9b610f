"""RealFormer (He et al. 2020), CODA's deterministic ablation: residual attention logits,
`z^l = C^l + z^{l-1}` within a stack, no parameters. The weights come from the spec's
normalization (unas by default).

Since every C^m = q^m k^m^T / sqrt(D) is a product, z^l = sum_m q^m k^m^T / sqrt(D) is one
product of the layers' queries and keys concatenated along the feature axis:
[q^1 .. q^l] [k^1 .. k^l]^T / sqrt(D). A stack run whole (`run_stack`, `step_stack`) therefore
hands on `StackedScores` (those concatenations, O(S l D) memory) instead of the (S, S) logits,
and each layer attends through the normalizer's own fast paths (flash / row-wise kernels, O(S)
memory) on the concatenation, its queries scaled by sqrt(l) so that the kernel's 1/sqrt(l D)
is the layers' 1/sqrt(D). The cost: layer l computes l q.k products where the materialized
cascade computes one and adds (S, S) maps. The maps are materialized only when a recorder asks
for them (`DeferredWeights`). Logits handed in as a tensor (a caller's own `prev_logits`) take
the materialized cascade of `LogitTransform`, unchanged.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from attnlab.attention.schemes.base import Attended, DeferredWeights, Heads
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.attention.schemes.transform import LogitTransform
from attnlab.errors import ConfigError


class StackedScores(NamedTuple):
    """RealFormer's logits after l layers, unmaterialized: z = q k^T / sqrt(width)."""

    q: Tensor  # (B, H, S_q, l * width): the layers' queries, concatenated
    k: Tensor  # (B, H, S_k, l * width): their keys
    width: int  # one layer's q.k features (D; ALiBi's widen it: attnlab.attention.positions)

    def scaled_q(self) -> Tensor:
        """q times sqrt(l): a kernel's 1/sqrt(l width) then scales each product by 1/sqrt(width)."""
        layers = self.q.shape[-1] // self.width
        return self.q if layers == 1 else self.q * math.sqrt(layers)


@register
class RealFormer(LogitTransform):
    name = "realformer"
    row_wise = True  # z_ij = C_ij + z_prev_ij

    def forward(self, scores: Tensor, previous: Tensor | None) -> Tensor:
        return scores if previous is None else scores + previous

    def route(self, normalizer: Normalizer, heads: Heads) -> str:
        """The normalizer's path for the stacked queries and keys; "materialized" when the
        previous logits come in as a tensor."""
        if heads.prev_logits is not None and not isinstance(heads.prev_logits, StackedScores):
            return "materialized"
        stacked = self._stacked(heads)
        return normalizer.route(normalizer.call(stacked.scaled_q(), stacked.k, heads.v, heads.key_padding_mask,
                                                heads.query_padding_mask, heads.causal, heads.dropout_p,
                                                heads.mask_cache))

    def attend_heads(self, normalizer: Normalizer, heads: Heads) -> Attended:
        if heads.prev_logits is not None and not isinstance(heads.prev_logits, StackedScores):
            return super().attend_heads(normalizer, heads)  # materialized logits in: the cascade
        self.check_causal(heads.causal)
        stacked = self._stacked(heads)
        scaled, k = stacked.scaled_q(), stacked.k
        out = normalizer.attend(scaled, k, heads.v, heads.key_padding_mask, heads.query_padding_mask,
                                heads.causal, heads.dropout_p, heads.mask_cache)

        def weights() -> Tensor:  # a recorder's maps: the same logits, materialized
            return normalizer.attention_weights(scaled, k, heads.key_padding_mask,
                                                heads.query_padding_mask, heads.causal)

        return DeferredWeights(out, weights, stacked)

    def _stacked(self, heads: Heads) -> StackedScores:
        """This layer's queries and keys after the previous layers' (checked to fit)."""
        previous = heads.prev_logits
        self._check_previous(previous)
        q, k = heads.q, heads.k
        if previous is not None:
            if (previous.width != q.shape[-1] or previous.q.shape[:-1] != q.shape[:-1]
                    or previous.k.shape[:-1] != k.shape[:-1]):
                raise ConfigError(
                    f"{self.name}: the previous layer of this stack attended with queries "
                    f"{tuple(previous.q.shape[:-1])} and keys {tuple(previous.k.shape[:-1])} of "
                    f"{previous.width} features, this layer with {tuple(q.shape[:-1])}, "
                    f"{tuple(k.shape[:-1])} of {q.shape[-1]}; the layers of a stack must attend over "
                    f"the same queries and keys with the same heads")
            q, k = torch.cat([previous.q, q], dim=-1), torch.cat([previous.k, k], dim=-1)
        return StackedScores(q, k, heads.q.shape[-1])
