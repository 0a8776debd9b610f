"""`LogitTransform`: how a layer's logits are built from its scores and the previous layer's
logits (a cascade stack: CODA, RealFormer; selective attention within one layer). The weights
then come from the spec's normalizer, on its materialized reference.

A transform is a `SchemeModule` (base.py). It defines `forward(scores, previous) -> logits`; its
`attend_heads` step owns the cascade around it: masks, the checks that a stack passes the
previous layer's logits, the normalizer's weights (`Normalizer.attend_logits`) and the logits it
hands on.

`receives_logits` is fixed when the module is built: False for the first layer of a stack (it
has no previous layer), True for the others, which must be given the previous logits.

`row_wise` declares that the logits of a (query, key) pair depend only on that pair's scores
and previous logits (across heads, in eval mode): then incremental decoding can cache keys and
values and carry the newest query's row of logits from layer to layer
(attnlab.attention.kv_cache). The default, False, is the safe answer: such a stack decodes by
re-running the prefix at every step, which is exact for any transform.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from attnlab.attention.reference import masked_logits, valid_mask
from attnlab.attention.schemes.base import Attended, Heads, SchemeModule
from attnlab.attention.schemes.normalizer import Normalizer, causal_only_error
from attnlab.errors import ConfigError


class LogitTransform(SchemeModule):
    row_wise: ClassVar[bool] = False
    # defined for causal attention only (selective attention); refused elsewhere, in one line
    causal_only: ClassVar[bool] = False
    causal_only_why: ClassVar[str] = ""

    def __init__(self, options: Any = None, num_heads: int = 1, receives_logits: bool = False) -> None:
        super().__init__(options, num_heads)
        self.receives_logits = bool(receives_logits) and self.passes_logits

    def extra_repr(self) -> str:
        return f"{self.name}, receives_logits={self.receives_logits}, {self.options}"

    @property
    def passes_logits(self) -> bool:
        """Whether the logits go on to the next layer of the stack."""
        return True

    def check_causal(self, causal: bool) -> None:
        """Refuse attention that is not causal when this transform is `causal_only`."""
        if self.causal_only and not causal:
            raise ConfigError(causal_only_error(self.name, self.causal_only_why or "see its docs"))

    def forward(self, scores: Tensor, previous: Tensor | None) -> Tensor:
        """Logits z (B, H, S_q, S_k) from this layer's scaled scores (finite, 0 where masked) and
        the previous layer's z (0 where masked; None in the first layer)."""
        raise NotImplementedError

    def attend_heads(self, normalizer: Normalizer, heads: Heads) -> Attended:
        """The cascade step, materialized: this layer's logits (float32 inside), the normalizer's
        weights and output, and the logits handed on (None unless `passes_logits`)."""
        call = normalizer.call(heads.q, heads.k, heads.v, heads.key_padding_mask,
                               heads.query_padding_mask, heads.causal, heads.dropout_p)
        self.check_causal(heads.causal)  # a causal-only transform (selective) outside causal attention
        previous = heads.prev_logits
        self._check_previous(previous)
        q, k = heads.q, heads.k
        valid = valid_mask(q.shape[0], q.shape[-2], k.shape[-2], q.device, heads.key_padding_mask,
                           heads.query_padding_mask, heads.causal)
        scores = masked_logits(q, k)  # float32 (float64 stays), unmasked
        if previous is not None and previous.shape != scores.shape:
            raise ConfigError(
                f"{self.name}: the previous layer of this stack produced logits of shape "
                f"{tuple(previous.shape)} but this layer's are {tuple(scores.shape)}; the layers "
                f"of a stack must attend over the same queries and keys with the same heads")
        if valid is not None:
            scores = scores.masked_fill(~valid, 0.0)
            previous = None if previous is None else previous.masked_fill(~valid, 0.0)
        with torch.autocast(device_type=q.device.type, enabled=False):
            z = self(scores, previous)
            if valid is not None:
                z = z.masked_fill(~valid, 0.0)  # finite everywhere; masked pairs never get weight
            logits = z if valid is None else z.masked_fill(~valid, float("-inf"))
            weights, out = normalizer.attend_logits(logits, call)
        return Attended(out, weights, z if self.passes_logits else None)

    def _check_previous(self, previous: Tensor | None) -> None:
        if self.receives_logits and previous is None:
            raise ConfigError(
                f"{self.name}: this attention is a later layer of a cascade stack (built with "
                f"layer_index > 0) and needs the logits of the layer before it. Run the layers "
                f"with attnlab.attention.run_stack(layers, x, ...) (or pass prev_logits=...)")
        if previous is not None and not self.receives_logits:
            raise ConfigError(
                f"{self.name}: this attention was built as the first layer of its stack "
                f"(layer_index=0) but was given a previous layer's logits; build layer i of a "
                f"stack with layer_index=i")
