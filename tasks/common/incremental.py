"""Incremental decoding: one new token per step with cached keys/values, for encoder-decoders
and decoder-only stacks alike.

Re-running a decoder on the whole prefix at every step costs O(T^2) token passes and, in an
encoder-decoder, recomputes the cross-attention keys/values of the whole source at every step
and every layer. The caches keep, per layer,

- the keys/values of the previous positions for the causal self-attention (`KVCache`);
- in an encoder-decoder, the source's cross-attention keys/values, projected once (`DecoderCache`),

so a step costs one token per layer. A step uses the submodules of the library's layers
(`TransformerDecoderLayer`: `decoder_layer_step`; a causal `TransformerEncoderLayer`:
`causal_layer_step`) with the same weights and order of operations, in eval mode (dropout off),
and each attention's own scheme (`MultiHeadAttention.attend_heads`: any scheme that normalizes
over keys). The tests check that it equals the full teacher-forced pass at every position. Beam
search reorders a cache with `select`.

A stack whose attention passes logits between layers (CODA, RealFormer) needs the previous
layer's logits. Both transforms act on each (query, key) pair on its own (RealFormer adds, CODA's
MLP mixes the heads of one pair; its noise is off in eval), so the newest query's row of logits
depends only on the same row of the layer before: a step carries that row from layer to layer
(`prev_logits` / `return_logits`, as the layers' own API) and stays exact, at the cost of one
position per step. `cacheable(layers, cascades=True)` says whether a stack can be run so; a
caller that does not carry the rows asks `cacheable(layers)`, which is False for any transform,
and keeps a `PrefixCache` instead, which stores the prefix and re-runs the full stack at every
step (same interface, exact by construction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.attention import MultiHeadAttention, TransformerDecoderLayer, TransformerEncoderLayer

# Logit transforms whose logits of a (query, key) pair depend only on that pair's scores and
# previous logits (across heads): a step can carry the newest query's row of logits.
ROW_WISE_TRANSFORMS = ("coda", "realformer")

Logits = dict[str, Tensor] | None  # a step's logits per attention attribute, as the layers pass them


def cacheable(layers: Sequence[nn.Module], cascades: bool = False) -> bool:
    """True when every attention of the layers can run one new position at a time on cached
    keys/values: no logit transform, or (cascades=True, for callers that carry the logits rows
    with `return_logits` / `prev_logits`) a row-wise one (CODA, RealFormer)."""
    allowed = ROW_WISE_TRANSFORMS if cascades else ()
    return all(m.transform is None or m.transform.name in allowed for layer in layers
               for m in layer.modules() if isinstance(m, MultiHeadAttention))


def _passed(**logits: Tensor | None) -> Logits:
    kept = {name: z for name, z in logits.items() if z is not None}
    return kept or None


def _pick(prev_logits: Logits, name: str) -> Tensor | None:
    return None if prev_logits is None else prev_logits.get(name)


def _check_steppable(layer: nn.Module, return_logits: bool, what: str) -> None:
    if not cacheable([layer], cascades=return_logits):
        raise ValueError(
            f"incremental decoding needs {what} without a cascade, or a row-wise cascade "
            f"({', '.join(ROW_WISE_TRANSFORMS)}) stepped with return_logits=True, each layer's "
            f"logits handed to the next as prev_logits"
        )


def _heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, S, E) -> (B, H, S, E / H)."""
    b, s, e = x.shape
    return x.view(b, s, num_heads, e // num_heads).transpose(1, 2)


def _merge(x: Tensor) -> Tensor:
    """(B, H, S, d) -> (B, S, H * d)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


@dataclass
class KVCache:
    """Self-attention keys/values of the positions decoded so far, per layer."""

    self_keys: list[Tensor] = field(default_factory=list)  # per layer (B, H, t, d)
    self_values: list[Tensor] = field(default_factory=list)
    length: int = 0  # positions already decoded

    def select(self, rows: Tensor, same_sources: bool = False) -> None:
        """Keep rows `rows` (in that order), e.g. the parents of the surviving beam hypotheses."""
        self.self_keys = [t.index_select(0, rows) for t in self.self_keys]
        self.self_values = [t.index_select(0, rows) for t in self.self_values]


@dataclass
class DecoderCache(KVCache):
    """`KVCache` plus the source's cross-attention keys/values of an encoder-decoder."""

    memory_keys: list[Tensor] = field(default_factory=list)  # per layer (B, H, S_src, d)
    memory_values: list[Tensor] = field(default_factory=list)
    memory_padding_mask: Tensor | None = None  # (B, S_src), True = padding

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


def start_cache(
    layers: Sequence[TransformerDecoderLayer], memory: Tensor, memory_padding_mask: Tensor | None
) -> DecoderCache:
    keys, values = [], []
    for layer in layers:
        attn = layer.cross_attn
        keys.append(_heads(attn.k_proj(memory), attn.num_heads))
        values.append(_heads(attn.v_proj(memory), attn.num_heads))
    return DecoderCache(memory_keys=keys, memory_values=values, memory_padding_mask=memory_padding_mask)


def cached_self_attention(attn: MultiHeadAttention, x: Tensor, cache: KVCache, index: int,
                          prev_logits: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Causal self-attention of the newest position (B, 1, E) over every cached one; returns its
    output and, in a cascade, its row of logits (B, H, 1, t) for the next layer."""
    q = _heads(attn.q_proj(x), attn.num_heads)
    k = _heads(attn.k_proj(x), attn.num_heads)
    v = _heads(attn.v_proj(x), attn.num_heads)
    if index < len(cache.self_keys):
        k = torch.cat([cache.self_keys[index], k], dim=2)
        v = torch.cat([cache.self_values[index], v], dim=2)
        cache.self_keys[index], cache.self_values[index] = k, v
    else:
        cache.self_keys.append(k)
        cache.self_values.append(v)
    # The newest position may see every cached one: causality holds without a mask.
    out, logits = attn.attend_heads(q, k, v, prev_logits=prev_logits)
    return attn.out_proj(_merge(out)), logits


def _cross_attention(layer: TransformerDecoderLayer, x: Tensor, cache: DecoderCache, index: int,
                     prev_logits: Tensor | None) -> tuple[Tensor, Tensor | None]:
    attn = layer.cross_attn
    q = _heads(attn.q_proj(x), attn.num_heads)
    out, logits = attn.attend_heads(q, cache.memory_keys[index], cache.memory_values[index],
                                    key_padding_mask=cache.memory_padding_mask, prev_logits=prev_logits)
    return attn.out_proj(_merge(out)), logits


def _feed_forward(layer: nn.Module, x: Tensor) -> Tensor:
    return layer.linear2(layer.activation(layer.linear1(x)))  # decoding runs in eval: no dropout


def decoder_layer_step(layer: TransformerDecoderLayer, x: Tensor, cache: DecoderCache, index: int,
                       prev_logits: Logits = None, return_logits: bool = False):
    """One encoder-decoder layer on the newest position only: x (B, 1, D) -> (B, 1, D); with
    return_logits, also its attentions' rows of logits for the next layer (as the layer's forward)."""
    _check_steppable(layer, return_logits, "decoder attention")
    prev_self, prev_cross = _pick(prev_logits, "self_attn"), _pick(prev_logits, "cross_attn")
    if layer.norm_first:
        out, z_self = cached_self_attention(layer.self_attn, layer.norm1(x), cache, index, prev_self)
        x = x + out
        out, z_cross = _cross_attention(layer, layer.norm2(x), cache, index, prev_cross)
        x = x + out
        x = x + _feed_forward(layer, layer.norm3(x))
    else:
        out, z_self = cached_self_attention(layer.self_attn, x, cache, index, prev_self)
        x = layer.norm1(x + out)
        out, z_cross = _cross_attention(layer, x, cache, index, prev_cross)
        x = layer.norm2(x + out)
        x = layer.norm3(x + _feed_forward(layer, x))
    return (x, _passed(self_attn=z_self, cross_attn=z_cross)) if return_logits else x


def causal_layer_step(layer: TransformerEncoderLayer, x: Tensor, cache: KVCache, index: int,
                      prev_logits: Logits = None, return_logits: bool = False):
    """One layer of a decoder-only stack (TransformerEncoderLayer(causal=True)) on the newest
    position only: x (B, 1, D) -> (B, 1, D); with return_logits, also its row of logits."""
    if not layer.causal:
        raise ValueError("incremental decoding needs causal self-attention (a causal layer)")
    _check_steppable(layer, return_logits, "causal self-attention")
    if layer.norm_first:
        out, z = cached_self_attention(layer.self_attn, layer.norm1(x), cache, index,
                                       _pick(prev_logits, "self_attn"))
        x = x + out
        x = x + _feed_forward(layer, layer.norm2(x))
    else:
        out, z = cached_self_attention(layer.self_attn, x, cache, index, _pick(prev_logits, "self_attn"))
        x = layer.norm1(x + out)
        x = layer.norm2(x + _feed_forward(layer, x))
    return (x, _passed(self_attn=z)) if return_logits else x


@dataclass
class PrefixCache:
    """The fallback "cache": the source's states (if any) and the prefix fed so far."""

    memory: Tensor | None = None  # (B, S_src, D); None in a decoder-only model
    memory_padding_mask: Tensor | None = None
    prefix: Tensor | None = None  # (B, t) token ids
    length: int = 0

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
