"""Lin et al. (2017)'s attention hops as a `MultiHeadAttention`: r learned queries over the tokens.

Lin et al.'s self-attentive sentence embedding pools the encoder states H (n x 2u) with

    A = softmax(W_s2 tanh(W_s1 H^T))      (r x n; W_s1: d_a x 2u, W_s2: r x d_a)
    M = A H                               (r x 2u: one row per hop)

`HopAttention` computes exactly this through the scheme registry: the r rows of W_s2 are r
learned queries (`hop_queries`), the keys are tanh(W_s1 h_j) (W_s1 is the module's `k_proj`,
without bias, as Lin's), the values the states h_j themselves (no value or output projection),
and the query scale sqrt(d) that every scheme divides by is multiplied into the queries, so the
logits are Lin's W_s2 tanh(W_s1 H^T) (up to float rounding) and `model=unas` is Lin's model. The weights
then come from the scheme of `model=`, with the hops as the queries and the tokens as the keys:

- unas: softmax over the tokens of each hop (Lin et al.);
- dnas: first normalized over the hops (each token's weights over the r hops sum to 1), then over
  the tokens: the hops compete for the tokens, so no token is explained away by all hops
  (sum_i A_ij >= 1/n, the lemma); hnas mixes the two with a trainable u;
- any other registered normalizer or logit transform likewise (a cascade scheme such as CODA sees
  a stack of depth 1: its noise only).

No dropout on the keys' input (Lin et al.'s code drops H out before W_s1, the published SVGD code
does not): `hop_weights` recomputes A from the same logits as `forward` for Lin's penalty.

One attention head by default (Lin's): the r hops are the queries of that head, so records
(`record_attention`) hold A as weights (B, 1, r, n) and M as head outputs (B, 1, r, 2u), and the
explained-away analysis sums each token's weight over the hops. `heads > 1` splits W_s1's rows,
the hop queries and the states into that many heads (each hop then has `heads` distributions).

The hops are the particles of the training rules (An et al. 2020 treat each hop as one head):
`particles()` declares the hop queries (the rows of W_s2, as the published code's SVGD does), so
`RepulsiveAttention` moves those rows as SVGD/SPOS particles and MA+R (`DisagreementRegularizer`)
compares the module's outputs, the rows of M, instead of heads.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.attention import AttentionSpec, MultiHeadAttention
from attnlab.errors import ConfigError


class HopAttention(MultiHeadAttention):
    def __init__(self, input_dim: int, hops: int, attention_unit: int, spec: AttentionSpec | dict | str = "unas",
                 heads: int = 1) -> None:
        if hops < 1 or attention_unit < 1:
            raise ConfigError(f"task.module.hops={hops} and attention_unit={attention_unit} must be >= 1")
        if attention_unit % heads or input_dim % heads:
            raise ConfigError(f"task.module.hop_heads={heads} must divide attention_unit={attention_unit} "
                              f"and the encoder's output size {input_dim}")
        super().__init__(attention_unit, heads, spec=spec, kdim=input_dim, vdim=input_dim, bias=False,
                         project_values=False)
        self.q_proj = None  # the queries are parameters themselves: Lin's W_s2
        self.hops = int(hops)
        self.hop_queries = nn.Parameter(torch.empty(self.hops, attention_unit))
        # Lin et al.'s code (and the published SVGD code) initialize W_s2 uniformly in +-0.1
        nn.init.uniform_(self.hop_queries, -0.1, 0.1)

    def particles(self) -> list[Tensor]:
        """The training rules' particles: one row per hop (see callbacks/repulsive.py)."""
        return [self.hop_queries]

    def projections(self, states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, r, d), k (B, H, n, d), v (B, H, n, 2u/H) in Lin's form (scores = W_s2 tanh(W_s1 H^T))."""
        batch = states.shape[0]
        # the schemes divide q.k by sqrt(d): multiplied in here, so the logits are exactly Lin's
        queries = (self.hop_queries * math.sqrt(self.head_dim)).expand(batch, -1, -1)
        q = self._split(queries.to(states.dtype))
        k = self._split(torch.tanh(self.k_proj(states)))
        return q, k, self._split(states)

    def forward(self, states: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """M (B, r, input_dim): the hops' weighted sums of the states (B, n, input_dim)."""
        q, k, v = self.projections(states)
        out, _ = self.attend_heads(q, k, v, key_padding_mask=key_padding_mask)
        if self.gate is not None:  # model.gate: from the hop queries, the hops' query input
            out = self.gate(self.hop_queries.expand(states.shape[0], -1, -1).to(out.dtype), out)
        return out.transpose(1, 2).reshape(states.shape[0], self.hops, -1)

    def hop_weights(self, states: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """A (B, H, r, n), materialized and differentiable (for Lin's penalty): the normalizer's
        weights of the same logits as `forward` (a cascade scheme's noise is not in them)."""
        q, k, _ = self.projections(states)
        return self.normalizer.attention_weights(q, k, key_padding_mask)


def lin_penalty(weights: Tensor) -> Tensor:
    """Lin et al.'s P = ||A A^T - I||_F^2 per example and head, averaged; weights (B, H, r, n)."""
    a = weights.float()
    gram = a @ a.transpose(-1, -2)
    eye = torch.eye(a.shape[-2], device=a.device, dtype=a.dtype)
    return (gram - eye).pow(2).sum((-1, -2)).mean()
