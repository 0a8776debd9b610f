"""Self-attentive sentence classifiers (Lin et al. 2017): encoder, attention hops, MLP.

    encoder=lstm          embedding -> BiLSTM (u per direction) -> H (n x 2u)         (Lin et al.)
    encoder=transformer   embedding + positions -> Transformer encoder layers -> H (n x d_model),
                          the scheme of `model=` in every layer too (a cascade stack: run_stack)
    encoder=pretrained    the packaged 6-layer BERT, the scheme of `model=` in every layer
                          (attnlab.hf; tasks/classify/pretrained.py) -> H (n x 384)
    then                  M = HopAttention(H) (r x 2u), flattened -> Dropout, Linear, act,
                          Dropout, Linear -> class logits

Sentence pairs (SNLI) are encoded separately by the same encoder and hops, and combined hop by
hop as in Lin et al.'s Sec. 4.3 (and the published SVGD code's GatedEncoder3D):
F_i = (M_h,i W_fh,i) * (M_p,i W_fp,i) with one (2u x 2u) matrix per hop and side.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.attention import AttentionSpec, TransformerEncoderLayer, run_stack
from attnlab.errors import ConfigError
from tasks.classify.hops import HopAttention
from tasks.classify.pretrained import PretrainedEncoder

ENCODERS = ("lstm", "transformer", "pretrained")
ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


class Encoded(NamedTuple):
    logits: Tensor  # (B, C)
    hop_weights: list[Tensor]  # A (B, H, r, n) per sentence, differentiable; [] unless asked for


class BiLSTMEncoder(nn.Module):
    def __init__(self, vocab_size: int, pad_id: int, embed_dim: int, hidden_dim: int, layers: int,
                 dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(embed_dim, hidden_dim, num_layers=layers, bidirectional=True, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.output_dim = 2 * hidden_dim

    def forward(self, ids: Tensor, padding_mask: Tensor, lengths: Tensor) -> Tensor:
        x = self.dropout(self.embedding(ids))
        # packed: the backward direction starts at each sentence's last token, not at padding
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return out


class TransformerSentenceEncoder(nn.Module):
    def __init__(self, vocab_size: int, pad_id: int, d_model: int, nhead: int, num_layers: int,
                 dim_feedforward: int, dropout: float, max_length: int, spec: AttentionSpec) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.positions = nn.Embedding(max_length, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, spec=spec, layer_norm_eps=1e-5,
                                    layer_index=i)
            for i in range(num_layers))
        self.output_dim = d_model

    def forward(self, ids: Tensor, padding_mask: Tensor, lengths: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.dropout(self.norm(self.embedding(ids) + self.positions(positions)))
        return run_stack(self.layers, x, padding_mask)


class GatedPairCombination(nn.Module):
    """Lin et al.'s SNLI combination: per hop i, (M_h,i W_fh,i) * (M_p,i W_fp,i)."""

    def __init__(self, hops: int, dim: int) -> None:
        super().__init__()
        self.w_premise = nn.Parameter(torch.empty(hops, dim, dim))
        self.w_hypothesis = nn.Parameter(torch.empty(hops, dim, dim))
        for w in (self.w_premise, self.w_hypothesis):
            nn.init.xavier_uniform_(w, gain=2 ** 0.5)

    def forward(self, premise: Tensor, hypothesis: Tensor) -> Tensor:
        return (torch.einsum("brd,rde->bre", premise, self.w_premise)
                * torch.einsum("brd,rde->bre", hypothesis, self.w_hypothesis))


class SelfAttentiveClassifier(nn.Module):
    """`attention`: the `model=` config (the hops' scheme, and the Transformer layers'); the sizes
    only the data know (vocab_size, num_classes, pad_id, pair, max_length) from the datamodule."""

    # the defaults are conf/task/classify.yaml's (tests/tasks/test_config_homes.py); Lin et al.'s
    # sizes are experiment=classify_lin2017
    def __init__(self, attention: AttentionSpec | dict | str, vocab_size: int, num_classes: int, pad_id: int = 0,
                 pair: bool = False, max_length: int = 128, encoder: str = "lstm", embed_dim: int = 64,
                 hidden_dim: int = 64, lstm_layers: int = 1, d_model: int = 128, nhead: int = 4,
                 num_layers: int = 2, dim_feedforward: int = 256, hops: int = 8, attention_unit: int = 64,
                 hop_heads: int = 1, fc_dim: int = 256, activation: str = "relu", dropout: float = 0.3,
                 pretrained_layers: int | None = None) -> None:
        super().__init__()
        spec = AttentionSpec.from_config(attention)
        if encoder not in ENCODERS:
            raise ConfigError(f"task.encoder={encoder!r}; use one of {', '.join(ENCODERS)}")
        if activation not in ACTIVATIONS:
            raise ConfigError(f"task.module.net.activation={activation!r}; use one of {', '.join(ACTIVATIONS)}")
        if encoder == "lstm":
            self.encoder = BiLSTMEncoder(vocab_size, pad_id, embed_dim, hidden_dim, lstm_layers, dropout)
        elif encoder == "pretrained":
            self.encoder = PretrainedEncoder(spec, vocab_size, pretrained_layers)
        else:
            self.encoder = TransformerSentenceEncoder(vocab_size, pad_id, d_model, nhead, num_layers,
                                                      dim_feedforward, dropout, max_length, spec)
        width = self.encoder.output_dim
        self.hops = HopAttention(width, hops, attention_unit, spec, heads=hop_heads)
        self.combine = GatedPairCombination(hops, width) if pair else None
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(hops * width, fc_dim), ACTIVATIONS[activation](),
            nn.Dropout(dropout), nn.Linear(fc_dim, num_classes))

    def embed(self, ids: Tensor, padding_mask: Tensor, lengths: Tensor, need_weights: bool = False
              ) -> tuple[Tensor, Tensor | None]:
        """M (B, r, width) of one sentence, and A (B, H, r, n) if asked for."""
        states = self.encoder(ids, padding_mask, lengths)
        weights = self.hops.hop_weights(states, padding_mask) if need_weights else None
        return self.hops(states, padding_mask), weights

    def forward(self, batch: dict[str, Tensor], need_weights: bool = False) -> Encoded:
        m, a = self.embed(batch["input_ids"], batch["padding_mask"], batch["lengths"], need_weights)
        weights = [a] if need_weights else []
        if self.combine is not None:
            m_b, a_b = self.embed(batch["input_ids_b"], batch["padding_mask_b"], batch["lengths_b"], need_weights)
            m = self.combine(m, m_b)
            weights += [a_b] if need_weights else []
        return Encoded(self.classifier(m.flatten(1)), weights)
