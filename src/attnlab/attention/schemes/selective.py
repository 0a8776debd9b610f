"""Selective attention (Leviathan, Kalman & Matias, ICLR 2025, "Selective Attention Improves
Transformer", arXiv 2410.02703, section 3), as a logit transform: a token can mask what the tokens
after it see.

One head (head 0 in the paper) selects: its logits through a ReLU, with the BOS key (key 0) and
each query's own key exempt, say how much query k wants key j gone. The selections accumulate
over the earlier queries,

    S_kj = relu(C^0_kj)  for 0 < j < k, else 0        F_ij = sum_{k < i} S_kj

and every head's logits become `C^h_ij - F_ij` before the spec's normalization (unas by default,
the paper's softmax). No parameters. Masked (query, key) pairs arrive with score 0 and select
nothing; padded keys and queries thus neither mask nor get masked.

Causal attention only (`causal_only`): F_ij sums the selections of the queries before i, which
is "the past" only when attention is causal; elsewhere it is refused in one line. Row i depends
on every earlier row of the selecting head, so the transform is not `row_wise`: incremental
decoding re-runs the prefix (`PrefixCache`), exact by construction. It needs the full square of
logits (as many queries as keys, the first query at position 0): a single decoding step over
cached keys lacks the earlier rows, and is refused rather than computed wrong.

Differences from lucidrains/x-transformers (`selective_attn` in x_transformers/attend.py): the
same computation where queries and keys are the same positions; where it is given fewer queries
than keys (a cache or memory) it exempts the keys before the first query and the first query's
key instead of BOS, which this module refuses instead (see above). The selecting head is an
option (`selecting_head`, default 0) and the BOS exemption can be turned off (`exempt_bos`, the
x-transformers `no_mask_sos`). The paper's context pruning (dropping masked keys from the cache
at inference) is not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention.kernels.selective_blocks import selective_attention
from attnlab.attention.reference import compute_dtype, output_dtype
from attnlab.attention.schemes.base import Attended, DeferredWeights, Heads
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.attention.schemes.transform import LogitTransform
from attnlab.attention.schemes.unas import UNAS
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class SelectiveOptions:
    selecting_head: int = 0  # the head whose logits select (the paper: head 0)
    exempt_bos: bool = True  # key 0 (BOS) is never masked (the paper; x-transformers' no_mask_sos)

    def __post_init__(self) -> None:
        if self.selecting_head < 0:
            raise ConfigError(f"model.selecting_head={self.selecting_head} must be an integer >= 0")


@register
class Selective(LogitTransform):
    name = "selective"
    Options = SelectiveOptions
    causal_only = True
    causal_only_why = "a token masks keys from the queries after it, summed over earlier queries"
    # F_ij sums rows k < i of the selecting head: not row-wise, decoding re-runs the prefix
    row_wise = False

    @property
    def passes_logits(self) -> bool:
        """Selective attention works within one layer: nothing goes on to the next."""
        return False

    def _check_shape(self, heads: int, s_q: int, s_k: int) -> None:
        head = self.options.selecting_head
        if head >= heads:
            raise ConfigError(f"model.selecting_head={head} must be < the number of heads ({heads})")
        if s_q != s_k:
            raise ConfigError(
                f"selective attention needs every query from position 0 ({s_q} queries over {s_k} "
                f"keys given): decode it by re-running the prefix, without a key/value cache")

    def route(self, normalizer: Normalizer, heads: Heads) -> str:
        """"blocks" where the block kernel computes this step, else "materialized"."""
        blocks = (type(normalizer) is UNAS and heads.causal and not heads.dropout_p
                  and heads.prev_logits is None and heads.q.shape[-2] == heads.k.shape[-2])
        return "blocks" if blocks else "materialized"

    def attend_heads(self, normalizer: Normalizer, heads: Heads) -> Attended:
        """By query blocks where `route` says so (the weights deferred to a recorder), else the
        materialized cascade step."""
        if self.route(normalizer, heads) != "blocks":
            return super().attend_heads(normalizer, heads)
        # the checks of the materialized step: inputs, masks, the selecting head
        normalizer.call(heads.q, heads.k, heads.v, heads.key_padding_mask,
                        heads.query_padding_mask, heads.causal)
        self._check_shape(heads.q.shape[1], heads.q.shape[-2], heads.k.shape[-2])
        dtype = compute_dtype(heads.q)  # float32 (float64 stays), autocast off, as every path
        with torch.autocast(device_type=heads.q.device.type, enabled=False):
            out = selective_attention(heads.q.to(dtype), heads.k.to(dtype), heads.v.to(dtype),
                                      heads.key_padding_mask, heads.query_padding_mask,
                                      self.options.selecting_head, self.options.exempt_bos)
        out = out.to(output_dtype(heads.v))
        return DeferredWeights(out, lambda: super(Selective, self).attend_heads(normalizer, heads).weights)

    def forward(self, scores: Tensor, previous: Tensor | None) -> Tensor:
        heads, s_q, s_k = scores.shape[1:]
        self._check_shape(heads, s_q, s_k)
        head = self.options.selecting_head
        selection = torch.relu(scores[:, head])  # (B, S, S): 0 where masked
        exempt = torch.eye(s_q, dtype=torch.bool, device=scores.device)  # a query keeps itself
        if self.options.exempt_bos:
            exempt[:, 0] = True
        selection = selection.masked_fill(exempt, 0.0)
        # F_i = sum_{k < i} S_k: shift the rows down by one (row 0 gets none), then a running sum
        accumulated = F.pad(selection[:, :-1], (0, 0, 1, 0)).cumsum(dim=-2)
        return scores - accumulated[:, None]
