"""Transformer encoder / decoder layers built on `MultiHeadAttention`.

With norm_first=False the encoder layer is structurally a HF BERT layer (attention -> dropout ->
add -> LayerNorm -> Linear -> GELU (exact erf) -> Linear -> dropout -> add -> LayerNorm), with
submodules named so that BERT weights map by name:
  attention.self.{query,key,value}  -> self_attn.{q_proj,k_proj,v_proj}
  attention.output.dense / LayerNorm -> self_attn.out_proj / norm1
  intermediate.dense, output.dense / LayerNorm -> linear1, linear2 / norm2
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.attention.mha import MultiHeadAttention
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError

_ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),  # exact erf form, as BERT
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
}


def make_activation(name: str) -> nn.Module:
    if name not in _ACTIVATIONS:
        raise ConfigError(f"unknown activation {name!r}; choose one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


class TransformerEncoderLayer(nn.Module):
    """Self-attention + feed-forward; `spec` chooses the attention scheme of this layer."""

    # consecutive layers in one nn.ModuleList form a cascade stack per attribute (cascade.py)
    CASCADE_ATTRIBUTES = ("self_attn",)

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
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            d_model, nhead, spec=spec, dropout=dropout if attn_dropout is None else attn_dropout
        )
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = make_activation(activation)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)

    def _sa(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        # Padded positions are padded queries too: they must stay out of DNAS column sums.
        out = self.self_attn(x, key_padding_mask=key_padding_mask, query_padding_mask=key_padding_mask)
        return self.dropout1(out)

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.activation(self.linear1(x))))

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        if self.norm_first:
            x = x + self._sa(self.norm1(x), key_padding_mask)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, key_padding_mask))
        return self.norm2(x + self._ff(x))


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to `memory`, feed-forward. Both attentions are
    built with is_decoder=True, so a query-normalized `spec` (dnas/hnas/sinkhorn) is refused."""

    CASCADE_ATTRIBUTES = ("self_attn", "cross_attn")

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
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        p_attn = dropout if attn_dropout is None else attn_dropout
        self.self_attn = MultiHeadAttention(d_model, nhead, spec=spec, dropout=p_attn, is_decoder=True)
        self.cross_attn = MultiHeadAttention(d_model, nhead, spec=spec, dropout=p_attn, is_decoder=True)
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

    def _sa(self, x: Tensor, tgt_key_padding_mask: Tensor | None) -> Tensor:
        out = self.self_attn(
            x,
            key_padding_mask=tgt_key_padding_mask,
            query_padding_mask=tgt_key_padding_mask,
            causal=True,
        )
        return self.dropout1(out)

    def _ca(self, x, memory, tgt_key_padding_mask, memory_key_padding_mask) -> Tensor:
        out = self.cross_attn(
            x,
            memory,
            key_padding_mask=memory_key_padding_mask,
            query_padding_mask=tgt_key_padding_mask,
        )
        return self.dropout2(out)

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.activation(self.linear1(x))))

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        if self.norm_first:
            x = x + self._sa(self.norm1(x), tgt_key_padding_mask)
            x = x + self._ca(self.norm2(x), memory, tgt_key_padding_mask, memory_key_padding_mask)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, tgt_key_padding_mask))
        x = self.norm2(x + self._ca(x, memory, tgt_key_padding_mask, memory_key_padding_mask))
        return self.norm3(x + self._ff(x))
