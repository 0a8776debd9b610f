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
the logits, a dict keyed by attention attribute, to hand to the next layer).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from attnlab.attention.mha import MultiHeadAttention
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError

_ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),  # exact erf form, as BERT
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
}

Logits = dict[str, Tensor] | None  # cascade logits per attention attribute (None: nothing cascades)


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


def _pick(prev_logits: Logits, name: str) -> Tensor | None:
    return None if prev_logits is None else prev_logits.get(name)


def _passed(**logits: Tensor | None) -> Logits:
    kept = {name: z for name, z in logits.items() if z is not None}
    return kept or None


class TransformerEncoderLayer(nn.Module):
    """Self-attention + feed-forward; `spec` chooses the attention scheme of this layer.

    `causal=True` makes the self-attention causal (a decoder-only stack, e.g. a language model):
    the layer is then built as a decoder (query-normalized schemes are refused).
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
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.causal = causal
        self.self_attn = MultiHeadAttention(
            d_model, nhead, spec=spec, dropout=dropout if attn_dropout is None else attn_dropout,
            is_decoder=causal, layer_index=layer_index,
        )
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = make_activation(activation)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)

    def _sa(self, x: Tensor, key_padding_mask: Tensor | None, prev: Tensor | None):
        # Padded positions are padded queries too: they must stay out of DNAS column sums.
        out, logits = self.self_attn(x, key_padding_mask=key_padding_mask,
                                     query_padding_mask=key_padding_mask, causal=self.causal,
                                     prev_logits=prev, return_logits=True)
        return self.dropout1(out), logits

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.activation(self.linear1(x))))

    def forward(self, x: Tensor | StackCarry, key_padding_mask: Tensor | None = None,
                prev_logits: Logits = None, return_logits: bool = False):
        if isinstance(x, StackCarry):  # inside nn.Sequential
            out, logits = self(x.x, x.key_padding_mask, x.logits, return_logits=True)
            return StackCarry(out, x.key_padding_mask, logits)
        prev = _pick(prev_logits, "self_attn")
        if self.norm_first:
            attn, z = self._sa(self.norm1(x), key_padding_mask, prev)
            x = x + attn
            x = x + self._ff(self.norm2(x))
        else:
            attn, z = self._sa(x, key_padding_mask, prev)
            x = self.norm1(x + attn)
            x = self.norm2(x + self._ff(x))
        return (x, _passed(self_attn=z)) if return_logits else x


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to `memory`, feed-forward. Both attentions are
    built with is_decoder=True, so a query-normalized `spec` (dnas/hnas/sinkhorn) is refused.
    Self- and cross-attention form separate cascade stacks."""

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
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        p_attn = dropout if attn_dropout is None else attn_dropout
        self.self_attn = MultiHeadAttention(d_model, nhead, spec=spec, dropout=p_attn, is_decoder=True,
                                            layer_index=layer_index)
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

    def _sa(self, x: Tensor, tgt_key_padding_mask: Tensor | None, prev: Tensor | None):
        out, logits = self.self_attn(x, key_padding_mask=tgt_key_padding_mask,
                                     query_padding_mask=tgt_key_padding_mask, causal=True,
                                     prev_logits=prev, return_logits=True)
        return self.dropout1(out), logits

    def _ca(self, x, memory, tgt_key_padding_mask, memory_key_padding_mask, prev: Tensor | None):
        out, logits = self.cross_attn(x, memory, key_padding_mask=memory_key_padding_mask,
                                      query_padding_mask=tgt_key_padding_mask, prev_logits=prev,
                                      return_logits=True)
        return self.dropout2(out), logits

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.activation(self.linear1(x))))

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        prev_logits: Logits = None,
        return_logits: bool = False,
    ):
        prev_self, prev_cross = _pick(prev_logits, "self_attn"), _pick(prev_logits, "cross_attn")
        if self.norm_first:
            attn, z_self = self._sa(self.norm1(x), tgt_key_padding_mask, prev_self)
            x = x + attn
            attn, z_cross = self._ca(self.norm2(x), memory, tgt_key_padding_mask,
                                     memory_key_padding_mask, prev_cross)
            x = x + attn
            x = x + self._ff(self.norm3(x))
        else:
            attn, z_self = self._sa(x, tgt_key_padding_mask, prev_self)
            x = self.norm1(x + attn)
            attn, z_cross = self._ca(x, memory, tgt_key_padding_mask, memory_key_padding_mask, prev_cross)
            x = self.norm2(x + attn)
            x = self.norm3(x + self._ff(x))
        return (x, _passed(self_attn=z_self, cross_attn=z_cross)) if return_logits else x
