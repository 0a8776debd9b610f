"""Token embeddings tied to the output layer: a plain one, and the adaptive input / adaptive
softmax pair of Baevski & Auli (2019) and Grave et al. (2017) as fairseq's
`transformer_lm_wiki103` ties them (`--tie-adaptive-weights --tie-adaptive-proj`).

Both have the same interface, so the model does not care which it has:

    x = emb(ids)                   # (..., d) input embeddings
    logits = emb.logits(hidden)    # (..., V) scores whose softmax is the model's distribution
    nll = emb.nll(hidden, targets) # (...,) -log p(target), computed without (..., V) when it can

Adaptive: the vocabulary, ranked by decreasing training frequency (`token_order`: ids by
rank; the word-level vocabularies of `tasks.lm.corpus` are nearly in that order already, the
WordPiece ids of the Debian default are not), is cut into bands at `cutoffs` (Wikitext-103:
20000, 60000 of 267,735 words; the Debian default: 2000, 8000 of 30,522 word pieces, where the
first band covers 87% of the training tokens and the first two 98%). Band b embeds its words in
d / factor**b dimensions and projects them to d. The output
reuses those weights: a head scores the first band's words plus one cluster per other band;
a word of band b >= 1 gets log p(cluster b) + log softmax within band b, whose scores are
hidden -> (band b's projection, transposed) -> dropout -> (band b's embeddings). A training
step pays for a band's softmax only on the targets in that band, so Wikitext-103's 267k-word
output costs about as much as a 20k one, and the model has ~250M parameters instead of ~520M.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError


class TiedEmbedding(nn.Embedding):
    """One matrix for the input embeddings and the output layer (no output bias, as fairseq's
    `--share-decoder-input-output-embed`)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int | None = None) -> None:
        super().__init__(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.weight, std=d_model**-0.5)
        if pad_id is not None:
            with torch.no_grad():
                self.weight[pad_id].zero_()

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.weight)

    def nll(self, hidden: Tensor, targets: Tensor) -> Tensor:
        logits = self.logits(hidden).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               reduction="none").view(targets.shape)


class AdaptiveEmbedding(nn.Module):
    """Adaptive input and adaptive softmax sharing their weights (see the module docstring)."""

    def __init__(self, vocab_size: int, d_model: int, cutoffs: Sequence[int], factor: float = 4.0,
                 dropout: float = 0.0, pad_id: int | None = None,
                 token_order: Sequence[int] | None = None) -> None:
        super().__init__()
        edges = [0, *(int(c) for c in cutoffs), int(vocab_size)]
        if len(edges) < 3 or any(a >= b for a, b in itertools.pairwise(edges)):
            raise ConfigError(
                f"task.module.adaptive_cutoffs={list(cutoffs)} must be increasing and below the "
                f"vocabulary size {vocab_size} (e.g. [20000, 60000] for Wikitext-103); null turns "
                f"adaptive input/softmax off"
            )
        self.edges = edges
        self.d_model = d_model
        # rank[id]: the position of token id in token_order (a buffer: checkpoints keep it)
        rank = torch.arange(vocab_size)
        if token_order is not None:
            order = torch.as_tensor(list(token_order), dtype=torch.long)
            if sorted(order.tolist()) != list(range(vocab_size)):
                raise ConfigError(f"token_order must be a permutation of the {vocab_size} token ids")
            rank[order] = torch.arange(vocab_size)
        self.register_buffer("rank", rank)
        dims = [max(1, int(d_model // factor**b)) for b in range(len(edges) - 1)]
        self.embeddings = nn.ModuleList(nn.Embedding(hi - lo, dim) for lo, hi, dim in zip(edges, edges[1:], dims))
        self.projections = nn.ModuleList(nn.Linear(dim, d_model, bias=False) for dim in dims)
        self.cluster = nn.Linear(d_model, len(dims) - 1, bias=False)  # log p(band b >= 1)
        self.dropout = nn.Dropout(dropout)
        for emb, dim in zip(self.embeddings, dims):
            nn.init.normal_(emb.weight, std=dim**-0.5)
        for proj in self.projections:
            nn.init.xavier_uniform_(proj.weight)
        if pad_id is not None:
            band = sum(int(self.rank[pad_id]) >= e for e in edges[1:-1])
            with torch.no_grad():
                self.embeddings[band].weight[int(self.rank[pad_id]) - edges[band]].zero_()

    def forward(self, ids: Tensor) -> Tensor:
        ids = self.rank[ids]
        out = self.projections[0].weight.new_zeros(*ids.shape, self.d_model)
        for (lo, hi), emb, proj in zip(itertools.pairwise(self.edges), self.embeddings, self.projections):
            inside = (ids >= lo) & (ids < hi)
            if torch.compiler.is_compiling():
                # every token through every band, kept where it belongs: no data-dependent
                # shapes or branches, which would break torch.compile's graph (compile=true)
                band = proj(emb((ids - lo).clamp(0, hi - lo - 1))).to(out.dtype)
                out = torch.where(inside[..., None], band, out)
            elif inside.any():
                out[inside] = proj(emb(ids[inside] - lo)).to(out.dtype)
        return out

    def _head(self, hidden: Tensor) -> Tensor:
        """log p over [words of band 0, band 1, band 2, ...] (..., cutoff_0 + bands - 1)."""
        scores = torch.cat([F.linear(hidden, self.embeddings[0].weight), self.cluster(hidden)], dim=-1)
        return torch.log_softmax(scores.float(), dim=-1)

    def _band(self, hidden: Tensor, b: int) -> Tensor:
        """log softmax within band b >= 1 (..., band size)."""
        h = self.dropout(F.linear(hidden, self.projections[b].weight.t()))
        return torch.log_softmax(F.linear(h, self.embeddings[b].weight).float(), dim=-1)

    def logits(self, hidden: Tensor) -> Tensor:
        """Full log-probabilities (..., V) in token-id order (their softmax is the distribution)."""
        head = self._head(hidden)
        first = self.edges[1]
        parts = [head[..., :first]]
        for b in range(1, len(self.embeddings)):
            parts.append(head[..., first + b - 1, None] + self._band(hidden, b))
        return torch.cat(parts, dim=-1).index_select(-1, self.rank)  # by rank -> by id

    def nll(self, hidden: Tensor, targets: Tensor) -> Tensor:
        hidden, flat = hidden.reshape(-1, hidden.shape[-1]), self.rank[targets.reshape(-1)]
        head = self._head(hidden)
        first = self.edges[1]
        # band 0: the head's own entry; band b: its cluster's entry, plus the within-band term
        out = -head.gather(1, flat.clamp(max=first - 1)[:, None]).squeeze(1)
        for b, (lo, hi) in enumerate(itertools.pairwise(self.edges[1:]), start=1):
            rows = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            if rows.numel():
                within = self._band(hidden[rows], b).gather(1, (flat[rows] - lo)[:, None]).squeeze(1)
                out[rows] = -(head[rows, first + b - 1] + within)
        return out.view(targets.shape)


def sinusoidal_positions(n: int, d_model: int) -> Tensor:
    """(n, d) sin/cos position encodings (Vaswani et al. 2017): sin on the first half of the
    features, cos on the second, as fairseq's SinusoidalPositionalEmbedding."""
    half = d_model // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(n, dtype=torch.float32)[:, None] * freq[None]
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(table, (0, d_model - 2 * half))
