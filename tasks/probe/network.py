"""`ProbeEncoder`: a small bidirectional Transformer encoder, the `model=` scheme in every layer.

Token probes embed ids (token 0 = padding) plus positions (`positions`: learned, a table of the
training length that cannot extrapolate; sinusoidal, computed for any length; none: order only
from the token shift below, which is what lets a probe trained short be tested long), then (`token_shift`) mix each
token with its two neighbours by a width-3 convolution, as Zoology's and H3's short convolutions
do: a value is bound to the key or marker just before it before any attention, so what attention
must learn is the retrieval the probes are about, and recall is learned in a few hundred steps
(without it, 1,280 steps of a 2-layer model stayed at chance on CPU: attention had to learn the
previous-token binding first). The cluster probe's float points go through a linear map, with no
positions or shift (a set: the order of the points carries nothing) and a learned CLS vector in
front, so that every probe reads a sequence-level answer at position 0. Then `num_layers` pre-LN `TransformerEncoderLayer`s run with `run_stack` (CODA and
RealFormer cascade their logits from layer to layer), a final LayerNorm and a linear head:
logits at every position (B, L, num_classes).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.attention import AttentionSpec, TransformerEncoderLayer, run_stack
from attnlab.errors import ConfigError

POSITIONS = ("learned", "sinusoidal", "none")


def sinusoidal(length: int, d_model: int) -> Tensor:
    """(length, d_model) the Transformer's fixed positions: sin at even features, cos at odd,
    wavelengths 2 pi * 10000^(2i / d_model) (Vaswani et al. 2017), for any length."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: d_model // 2])
    return table


class ProbeEncoder(nn.Module):
    """`vocab_size` > 0: token ids in; 0: float points of `input_dim` features (clusters)."""

    def __init__(
        self,
        num_classes: int,
        seq_len: int,
        vocab_size: int = 0,
        input_dim: int = 0,
        *,
        # the run's scheme and the probe's sizes (conf/task/probe.yaml: `probe.net`): no defaults
        attention: AttentionSpec | dict | str,
        d_model: int,
        nhead: int,
        num_layers: int,
        dim_feedforward: int,
        positions: str,
        dropout: float = 0.0,
        token_shift: bool = True,
    ) -> None:
        super().__init__()
        if positions not in POSITIONS:
            raise ConfigError(f"task.module.net.positions={positions!r} is not a probe network's "
                              f"positions; use one of {', '.join(POSITIONS)}")
        self.positions = positions
        if (vocab_size > 0) == (input_dim > 0):
            raise ConfigError(f"a probe network takes tokens (vocab_size={vocab_size}) or points "
                              f"(input_dim={input_dim}), exactly one; the probe's data gives it")
        spec = AttentionSpec.from_config(attention)
        self.points = vocab_size == 0
        if self.points:
            self.embed = nn.Linear(input_dim, d_model)
            self.cls = nn.Parameter(torch.randn(d_model) * d_model**-0.5)
            self.position = None
        else:
            self.embed = nn.Embedding(vocab_size, d_model, padding_idx=0)
            self.position = (nn.Parameter(torch.randn(seq_len, d_model) * d_model**-0.5)
                             if positions == "learned" else None)
        # each token's neighbours mixed in before attention (a width-3 convolution)
        self.shift = nn.Conv1d(d_model, d_model, 3, padding=1) if token_shift and not self.points else None
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, spec=spec,
                                    norm_first=True, layer_norm_eps=1e-5, layer_index=i)
            for i in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, inputs: Tensor, padding_mask: Tensor, key_only: Tensor | None = None,
                query_only: Tensor | None = None) -> Tensor:
        """inputs (B, L) ids or (B, L, d) points; padding_mask (B, L) True = padding;
        `key_only` / `query_only` (B, L) True where a position is only read / only asks (a
        probe's cross-attention inside the sequence: tasks/probe/data.py, roles).
        Returns logits (B, L', num_classes); L' = L + 1 for points (the CLS in front)."""
        if self.points:
            x = self.embed(inputs)
            x = torch.cat([self.cls.expand(x.shape[0], 1, -1), x], dim=1)
            padding_mask = torch.cat([padding_mask.new_zeros(x.shape[0], 1), padding_mask], dim=1)
        else:
            x = self.embed(inputs)
            if self.positions == "learned":
                x = x + self.position[: inputs.shape[1]]
            elif self.positions == "sinusoidal":
                x = x + sinusoidal(inputs.shape[1], x.shape[-1]).to(x)
            if self.shift is not None:
                x = x.masked_fill(padding_mask[..., None], 0.0)
                x = x + self._token_shift(x)
        if key_only is None and query_only is None:
            # unmasked: the fused kernels; compiled, always masked (no data-dependent branch)
            unpadded = not torch.compiler.is_compiling() and not bool(padding_mask.any())
            mask = None if unpadded else padding_mask
            return self.head(self.norm(run_stack(self.layers, x, mask)))
        keys = padding_mask if query_only is None else padding_mask | query_only
        queries = padding_mask if key_only is None else padding_mask | key_only
        return self.head(self.norm(run_stack(self.layers, x, keys, query_padding_mask=queries)))

    def check_length(self, length: int, asked_by: str) -> None:
        """A one-line ConfigError when this network cannot take sequences of `length` tokens
        (`asked_by` names the option that asks): a learned table ends at the training length."""
        if self.position is not None and length > self.position.shape[0]:
            raise ConfigError(
                f"{asked_by} asks for {length} positions but task.module.net.positions=learned has "
                f"a table of {self.position.shape[0]} and learned positions do not extrapolate; "
                f"use task.module.net.positions=none|sinusoidal, or test lengths <= "
                f"{self.position.shape[0]}")

    def _token_shift(self, x: Tensor) -> Tensor:
        """`self.shift` (a width-3 Conv1d, padding 1) on x (B, L, d). Compiled, the same sum as a
        linear map of each token's window of three: inductor's convolution backward fixes its
        strides to ints, which turned L into a constant of the training graph (every new length
        compiled it again, torch 2.13); eager, the convolution (the same weights either way)."""
        if not torch.compiler.is_compiling():
            return self.shift(x.transpose(1, 2)).transpose(1, 2)
        padded = nn.functional.pad(x, (0, 0, 1, 1))  # (B, L + 2, d): the conv's zero padding
        windows = padded.unfold(1, 3, 1)  # (B, L, d, 3): [x[t-1], x[t], x[t+1]] per channel
        return nn.functional.linear(windows.flatten(2), self.shift.weight.flatten(1), self.shift.bias)
