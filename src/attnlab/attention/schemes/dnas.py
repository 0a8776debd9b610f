"""DNAS: doubly-normalized attention, over queries then over keys (seed paper, Eq. 5).

pi_ij = softmax_j(s_ij - c_j) with c_j = logsumexp over valid queries i of s_ij: a per-key bias,
so the fused paths never materialize S_q x S_k. Every valid key receives total weight >= 1/S
(the lemma); normalizing over queries makes it unfit for decoders.
"""

from torch import Tensor

from attnlab.attention import paths
from attnlab.attention.reference import sinkhorn_log_weights
from attnlab.attention.schemes.base import Normalizer
from attnlab.attention.schemes.registry import register


@register
class DNAS(Normalizer):
    name = "dnas"
    over_queries = True
    fast_paths = paths.QUERY_NORMALIZED_PATHS

    def weights(self, logits: Tensor) -> Tensor:
        return sinkhorn_log_weights(logits, 1).exp()
