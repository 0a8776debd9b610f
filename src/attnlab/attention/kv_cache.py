"""Caches for incremental decoding: one new position per step, for encoder-decoders and
decoder-only stacks alike.

Re-running a decoder on the whole prefix at every step costs O(T^2) token passes and, in an
encoder-decoder, recomputes the cross-attention keys/values of the whole source at every step
and every layer. The caches keep, per layer,

- the keys/values of the previous positions for the causal self-attention (`KVCache`, one
  `KeyValues` per layer);
- in an encoder-decoder, the source's cross-attention keys/values, projected once (`DecoderCache`),

so a step costs one position per layer. The steps themselves belong to the layers
(`TransformerEncoderLayer.step` for a causal layer, `TransformerDecoderLayer.step`, run over a
stack by `attnlab.attention.step_stack`): the same weights and order of operations as their
forward, in eval mode, with each attention's own scheme. Beam search reorders a cache with
`select`.

A stack whose attention passes logits between layers needs the previous layer's logits. A
transform that declares itself `row_wise` (CODA, RealFormer: each (query, key) pair on its own)
makes the newest query's row of logits depend only on the same row of the layer before: a step
carries that row from layer to layer and stays exact. `cacheable(layers, cascades=True)` says
whether a stack can be stepped so; any other transform gets a `PrefixCache` instead, which keeps
the prefix and re-runs the full stack at every step (same interface, exact by construction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.attention.mha import MultiHeadAttention


def cacheable(layers: Sequence[nn.Module], cascades: bool = False) -> bool:
    """True when every attention of the layers can run one new position at a time on cached
    keys/values: no logit transform or (cascades=True, for callers that carry the rows of logits
    with `return_logits` / `prev_logits`) a row-wise one."""
    return all(m.can_step(carry_logits=cascades) for layer in layers for m in layer.modules()
               if isinstance(m, MultiHeadAttention))


class KeyValues:
    """One attention's keys and values (B, H, t, d) of the positions decoded so far, the keys
    as the attention uses them (rotated by RoPE, or with ALiBi's features: d is then larger);
    `length` is also the next position, which `MultiHeadAttention.step` gives its new key.

    They live in a buffer that doubles when full, so a step writes its new position instead of
    copying the whole past (torch.cat); `keys` / `values` are views of the filled part."""

    def __init__(self) -> None:
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self.length = 0

    @property
    def keys(self) -> Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions' keys and values (B, H, n, d); returns all of them so far."""
        end = self.length + keys.shape[2]
        if self._keys is None or end > self._keys.shape[2]:
            capacity = max(end, 2 * self.length, 8)
            self._keys = self._grown(self._keys, keys, capacity)
            self._values = self._grown(self._values, values, capacity)
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end
        return self.keys, self.values

    def _grown(self, buffer: Tensor | None, new: Tensor, capacity: int) -> Tensor:
        grown = new.new_empty(*new.shape[:2], capacity, new.shape[3])
        if buffer is not None:
            grown[:, :, : self.length] = buffer[:, :, : self.length]
        return grown

    def select(self, rows: Tensor) -> None:
        """Keep rows `rows` of the batch, in that order."""
        if self._keys is not None:
            self._keys = self._keys.index_select(0, rows)
            self._values = self._values.index_select(0, rows)


@dataclass
class KVCache:
    """The self-attention keys/values of a stack, one `KeyValues` per layer (by its index)."""

    layers: list[KeyValues] = field(default_factory=list)

    def self_attention(self, index: int) -> KeyValues:
        """Layer `index`'s keys/values (empty on the first step)."""
        while len(self.layers) <= index:
            self.layers.append(KeyValues())
        return self.layers[index]

    @property
    def length(self) -> int:
        """Positions decoded so far (the next one's position)."""
        return self.layers[0].length if self.layers else 0

    @property
    def self_keys(self) -> list[Tensor]:
        """Each layer's cached keys (B, H, t, d)."""
        return [kv.keys for kv in self.layers]

    def select(self, rows: Tensor, same_sources: bool = False) -> None:
        """Keep rows `rows` (in that order), e.g. the parents of the surviving beam hypotheses."""
        for kv in self.layers:
            kv.select(rows)


@dataclass
class DecoderCache(KVCache):
    """`KVCache` plus the source's cross-attention keys/values of an encoder-decoder."""

    memory_keys: list[Tensor] = field(default_factory=list)  # per layer (B, H, S_src, d)
    memory_values: list[Tensor] = field(default_factory=list)
    memory_padding_mask: Tensor | None = None  # (B, S_src), True = padding

    @classmethod
    def start(cls, layers: Sequence[nn.Module], memory: Tensor,
              memory_padding_mask: Tensor | None = None) -> DecoderCache:
        """An empty cache for decoder layers (with `cross_attn`) on the encoder states `memory`
        (B, S_src, D): each layer's cross-attention keys/values are projected here, once."""
        pairs = [layer.cross_attn.keys_values(memory) for layer in layers]
        return cls(memory_keys=[k for k, _ in pairs], memory_values=[v for _, v in pairs],
                   memory_padding_mask=memory_padding_mask)

    def cross_attention(self, index: int) -> tuple[Tensor, Tensor]:
        return self.memory_keys[index], self.memory_values[index]

    def select(self, rows: Tensor, same_sources: bool = False) -> None:
        """same_sources=True promises that every row keeps the source it had (beam search only
        reorders hypotheses within an example), so the source's keys/values are not copied."""
        super().select(rows)
        if same_sources:
            return
        self.memory_keys = [t.index_select(0, rows) for t in self.memory_keys]
        self.memory_values = [t.index_select(0, rows) for t in self.memory_values]
        if self.memory_padding_mask is not None:
            self.memory_padding_mask = self.memory_padding_mask.index_select(0, rows)


@dataclass
class PrefixCache:
    """The fallback "cache" of a stack that cannot be stepped: the source's states (if any) and
    the prefix fed so far, which the model re-runs in full at every step."""

    memory: Tensor | None = None  # (B, S_src, D); None in a decoder-only model
    memory_padding_mask: Tensor | None = None
    prefix: Tensor | None = None  # (B, t) token ids

    @property
    def length(self) -> int:
        return 0 if self.prefix is None else self.prefix.shape[1]

    def select(self, rows: Tensor, same_sources: bool = False) -> None:
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, rows)
        if not same_sources and self.memory is not None:
            self.memory = self.memory.index_select(0, rows)
            if self.memory_padding_mask is not None:
                self.memory_padding_mask = self.memory_padding_mask.index_select(0, rows)

    def append(self, token_ids: Tensor) -> Tensor:
        """The prefix with `token_ids` (B,) appended."""
        column = token_ids[:, None]
        self.prefix = column if self.prefix is None else torch.cat([self.prefix, column], dim=1)
        return self.prefix
