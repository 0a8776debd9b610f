"""`HeadScheme`: a scheme that computes its heads' outputs itself from the projected heads, with
the spec's normalizer for the weights it combines (differential attention: two maps per head,
their difference, a norm on the output).

A head scheme is a `SchemeModule` (base.py: its own parameters train at `param_lr` without decay;
those of its submodules, e.g. diff v2's projections, as the model's). It defines
`forward(normalizer, q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p, query)
-> (out (B, H, S_q, d_v), weights (B, H, S_q, S_k))`, the weights being the effective ones the
analyses record; `needs_query` says it reads `query`, the attention's query input (B, S_q, E).
A projection of its own follows the module's `bias`, as the module's own projections do.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from attnlab.attention.schemes.base import Attended, Heads, SchemeModule
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.errors import ConfigError


class HeadScheme(SchemeModule):
    needs_query: ClassVar[bool] = False  # the query input (B, S_q, E) must be given

    def __init__(self, options: Any = None, num_heads: int = 1, head_dim: int = 1,
                 value_dim: int | None = None, embed_dim: int | None = None,
                 layer_index: int = 0, bias: bool = True) -> None:
        super().__init__(options, int(num_heads))
        self.projection_bias = bool(bias)  # whether projections of its own have one (the module's)
        self.head_dim = int(head_dim)
        self.value_dim = int(head_dim if value_dim is None else value_dim)
        self.embed_dim = int(num_heads * head_dim if embed_dim is None else embed_dim)
        self.layer_index = int(layer_index)

    def extra_repr(self) -> str:
        return f"{self.name}, layer_index={self.layer_index}, {self.options}"

    def forward(self, normalizer: Normalizer, q: Tensor, k: Tensor, v: Tensor,
                key_padding_mask: Tensor | None = None, query_padding_mask: Tensor | None = None,
                causal: bool = False, dropout_p: float = 0.0, query: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def attend_heads(self, normalizer: Normalizer, heads: Heads) -> Attended:
        """This scheme as one step of MultiHeadAttention (it never cascades)."""
        if heads.prev_logits is not None:
            raise ConfigError(f"attention scheme {self.name!r} does not cascade, but it was given "
                              f"the logits of a previous layer")
        out, weights = self(normalizer, heads.q, heads.k, heads.v, heads.key_padding_mask,
                            heads.query_padding_mask, heads.causal, heads.dropout_p, heads.query)
        return Attended(out, weights)
