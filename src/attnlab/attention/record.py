"""`AttentionRecord`: what one forward of one attention module gives an open `record_attention`
(attention/recording.py). Its own module because both sides use it: the modules build records,
the recorders hand them out."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from attnlab.attention.statistics import column_sums, valid_rows


@dataclass
class AttentionRecord:
    weights: Tensor  # (B, H, S_q, S_k) float32, detached
    key_padding_mask: Tensor | None  # (B, S_k) True = padding
    query_padding_mask: Tensor | None  # (B, S_q)
    head_outputs: Tensor  # (B, H, S_q, d_v) float32, before the output projection
    causal: bool = False  # query i attended to keys up to i only (the sink rate's denominators)
    max_logit: Tensor | None = None  # (H,) the largest q.k / sqrt(d) over valid pairs, per head

    @cached_property
    def column_sums(self) -> Tensor:
        """(B, H, S_k): total weight each key receives from the valid queries."""
        return column_sums(self.weights, self.query_padding_mask)

    @cached_property
    def rows(self) -> Tensor:
        """(B, S_q) bool: the valid query rows, from the masks (statistics.valid_rows)."""
        return valid_rows(self.weights, self.key_padding_mask, self.query_padding_mask)
