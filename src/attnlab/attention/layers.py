"""Transformer encoder / decoder layers built on `MultiHeadAttention`.

With norm_first=False the encoder layer is structurally a HF BERT layer (attention -> dropout ->
add -> LayerNorm -> Linear -> GELU (exact erf) -> Linear -> dropout -> add -> LayerNorm), with
submodules named so that BERT weights map by name:
  attention.self.{query,key,value}  -> self_attn.{q_proj,k_proj,v_proj}
  attention.output.dense / LayerNorm -> self_attn.out_proj / norm1
  intermediate.dense, output.dense / LayerNorm -> linear1, linear2 / norm2

Cascade schemes (CODA, RealFormer) pass logits from layer to layer of a stack, explicitly: build
layer i of a stack with `layer_index=i` and run the stack with `attnlab.attention.run_stack`
(or call `layer(x, ..., prev_logits=p, return_logits=True)` yourself: it returns the new x and
the logits, a dict keyed by attention attribute, to hand to the next layer). `run_stack` also
hands every layer of one forward the same `mask_cache` (kernels/flex.py: `MaskCache`), so that
the FlexAttention paths build their block masks once per forward, not once per layer.

Each layer also has its one-step form, `step(x, cache, index, ...)`: the newest position only,
with the keys/values of the earlier ones in a cache (attnlab.attention.kv_cache), for incremental
decoding; `forward` and `step` share the layer's body (`_blocks`) and differ only in how the
attention gets its keys and values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import Tensor, nn

from attnlab.attention.kernels.flex import MaskCache
from attnlab.attention.kv_cache import DecoderCache, KVCache, cacheable
from attnlab.attention.mha import MultiHeadAttention
from attnlab.attention.schemes import TRANSFORMS
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError

_ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),  # exact erf form, as BERT
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
}

Logits = dict[str, Tensor] | None  # cascade logits per attention attribute (None: nothing cascades)
Attend = Callable[[Tensor], tuple[Tensor, Tensor | None]]  # an attention on its input: (out, logits)


class StackCarry(NamedTuple):
    """What flows through an `nn.Sequential` of encoder layers: `Sequential(*layers)(StackCarry(x,
    mask))` returns a StackCarry whose `x` is the output (cascade logits travel inside)."""

    x: Tensor
    key_padding_mask: Tensor | None = None
    logits: Logits = None


def make_activation(name: str) -> nn.Module:
    if name not in _ACTIVATIONS:
        raise ConfigError(f"unknown activation {name!r}; choose one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


def _check_steppable(layer: nn.Module, carries_logits: bool) -> None:
    if not cacheable([layer], cascades=carries_logits):
        row_wise = ", ".join(name for name, cls in TRANSFORMS.items() if cls.row_wise)
        raise ValueError(
            f"incremental decoding needs attention without a cascade, or a row-wise cascade "
            f"({row_wise}) stepped with return_logits=True and each layer's logits handed to the "
            f"next as prev_logits (attnlab.attention.step_stack does it); other transforms decode "
            f"by re-running the prefix (PrefixCache)"
        )


def _pick(prev_logits: Logits, name: str) -> Tensor | None:
    return None if prev_logits is None else prev_logits.get(name)


def _passed(**logits: Tensor | None) -> Logits:
    kept = {name: z for name, z in logits.items() if z is not None}
    return kept or None


class TransformerEncoderLayer(nn.Module):
    """Self-attention + feed-forward; `spec` chooses the attention scheme of this layer.

    `causal=True` makes the self-attention causal (a decoder-only stack, e.g. a language model):
    the layer is then built as a decoder (query-normalized schemes are refused). `positions`
    (none | rope | alibi) acts inside its self-attention (`MultiHeadAttention`); `forward`'s
    `start` is the position of x's first row (0 for a full pass; `step` takes the cache's).
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        spec: AttentionSpec | dict | str = "unas",
        activation: str = "gelu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-12,
        attn_dropout: float | None = None,
        causal: bool = False,
        layer_index: int = 0,
        positions: str = "none",
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.causal = causal
        self.self_attn = MultiHeadAttention(
            d_model, nhead, spec=spec, dropout=dropout if attn_dropout is None else attn_dropout,
            is_decoder=causal, layer_index=layer_index, positions=positions,
        )
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = make_activation(activation)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.activation(self.linear1(x))))

    def _blocks(self, x: Tensor, self_attention: Attend) -> tuple[Tensor, Logits]:
        """The layer around its self-attention (`forward` and `step` differ only there)."""
        if self.norm_first:
            out, z = self_attention(self.norm1(x))
            x = x + self.dropout1(out)
            x = x + self._ff(self.norm2(x))
        else:
            out, z = self_attention(x)
            x = self.norm1(x + self.dropout1(out))
            x = self.norm2(x + self._ff(x))
        return x, _passed(self_attn=z)

    def forward(self, x: Tensor | StackCarry, key_padding_mask: Tensor | None = None,
                prev_logits: Logits = None, return_logits: bool = False,
                query_padding_mask: Tensor | None = None, mask_cache: MaskCache | None = None,
                start: int = 0):
        """`key_padding_mask` (B, S), True = padding: no query reads it, and it asks nothing
        (it stays out of DNAS column sums). `query_padding_mask` (B, S), given, replaces the
        second half: True = a position that asks nothing (its attention output is 0), False = a
        query, even where no key may read it. The probes use the pair for positions that are
        only read (`key_only`) or only ask (`query_only`): cross-attention inside one sequence."""
        if isinstance(x, StackCarry):  # inside nn.Sequential
            out, logits = self(x.x, x.key_padding_mask, x.logits, return_logits=True)
            return StackCarry(out, x.key_padding_mask, logits)
        queries = key_padding_mask if query_padding_mask is None else query_padding_mask
        x, logits = self._blocks(x, lambda h: self.self_attn(
            h, key_padding_mask=key_padding_mask, query_padding_mask=queries,
            causal=self.causal, prev_logits=_pick(prev_logits, "self_attn"), return_logits=True,
            mask_cache=mask_cache, start=start))
        return (x, logits) if return_logits else x

    def step(self, x: Tensor, cache: KVCache, index: int, prev_logits: Logits = None,
             return_logits: bool = False, mask_cache: MaskCache | None = None):
        """A causal layer (a decoder-only stack) on the newest position only, x (B, 1, D) ->
        (B, 1, D), with layer `index`'s keys/values in `cache`; with return_logits, also its row
        of logits for the next layer (as `forward`). Eval mode; equals forward's last position."""
        if not self.causal:
            raise ValueError("incremental decoding needs causal self-attention: build the layer "
                             "with causal=True")
        _check_steppable(self, return_logits)
        x, logits = self._blocks(x, lambda h: self.self_attn.step(
            h, cache.self_attention(index), _pick(prev_logits, "self_attn"), mask_cache))
        return (x, logits) if return_logits else x


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to `memory`, feed-forward. Both attentions are
    built with is_decoder=True, so a query-normalized `spec` (dnas/hnas/sinkhorn) is refused.
    Self- and cross-attention form separate cascade stacks. `positions` (none | rope | alibi)
    acts inside the self-attention only (the source's positions are the encoder's)."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        spec: AttentionSpec | dict | str = "unas",
        activation: str = "gelu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-12,
        attn_dropout: float | None = None,
        layer_index: int = 0,
        positions: str = "none",
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        p_attn = dropout if attn_dropout is None else attn_dropout
        self.self_attn = MultiHeadAttention(d_model, nhead, spec=spec, dropout=p_attn, is_decoder=True,
                                            layer_index=layer_index, positions=positions)
        self.cross_attn = MultiHeadAttention(d_model, nhead, spec=spec, dropout=p_attn, is_decoder=True,
                                             layer_index=layer_index)
        self.cross_attn.role = "cross"
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = make_activation(activation)
        self.linear2 = nn.Linear(dim_feedforward, d_model)

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.activation(self.linear1(x))))

    def _blocks(self, x: Tensor, self_attention: Attend, cross_attention: Attend
                ) -> tuple[Tensor, Logits]:
        """The layer around its two attentions (`forward` and `step` differ only there)."""
        if self.norm_first:
            out, z_self = self_attention(self.norm1(x))
            x = x + self.dropout1(out)
            out, z_cross = cross_attention(self.norm2(x))
            x = x + self.dropout2(out)
            x = x + self._ff(self.norm3(x))
        else:
            out, z_self = self_attention(x)
            x = self.norm1(x + self.dropout1(out))
            out, z_cross = cross_attention(x)
            x = self.norm2(x + self.dropout2(out))
            x = self.norm3(x + self._ff(x))
        return x, _passed(self_attn=z_self, cross_attn=z_cross)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        prev_logits: Logits = None,
        return_logits: bool = False,
        mask_cache: MaskCache | None = None,
        start: int = 0,
    ):
        x, logits = self._blocks(
            x,
            lambda h: self.self_attn(h, key_padding_mask=tgt_key_padding_mask,
                                     query_padding_mask=tgt_key_padding_mask, causal=True,
                                     prev_logits=_pick(prev_logits, "self_attn"), return_logits=True,
                                     mask_cache=mask_cache, start=start),
            lambda h: self.cross_attn(h, memory, key_padding_mask=memory_key_padding_mask,
                                      query_padding_mask=tgt_key_padding_mask,
                                      prev_logits=_pick(prev_logits, "cross_attn"), return_logits=True,
                                      mask_cache=mask_cache),
        )
        return (x, logits) if return_logits else x

    def step(self, x: Tensor, cache: DecoderCache, index: int, prev_logits: Logits = None,
             return_logits: bool = False, mask_cache: MaskCache | None = None):
        """This layer on the newest position only, x (B, 1, D) -> (B, 1, D), with layer `index`'s
        self-attention keys/values and source keys/values in `cache` (`DecoderCache.start`); with
        return_logits, also its rows of logits for the next layer (as `forward`). Eval mode;
        equals forward's last position."""
        _check_steppable(self, return_logits)
        memory_keys, memory_values = cache.cross_attention(index)
        x, logits = self._blocks(
            x,
            lambda h: self.self_attn.step(h, cache.self_attention(index), _pick(prev_logits, "self_attn"),
                                          mask_cache),
            lambda h: self.cross_attn.attend_to(h, memory_keys, memory_values,
                                                key_padding_mask=cache.memory_padding_mask,
                                                prev_logits=_pick(prev_logits, "cross_attn"),
                                                mask_cache=mask_cache),
        )
        return (x, logits) if return_logits else x
