"""DNAS: doubly-normalized attention, over queries then over keys (seed paper, Eq. 5).

pi_ij = softmax_j(s_ij - c_j) with c_j = logsumexp over valid queries i of s_ij: a per-key bias,
so the fused paths never materialize S_q x S_k. Every valid key receives total weight >= 1/S
(the lemma); normalizing over queries makes it unfit for decoders.

Its kernels (`QUERY_NORMALIZED_PATHS`, shared with HNAS, which passes `u`, and Sinkhorn with one
round), best first:
- `fused_cpu`: the fused C++ CPU kernel (padding, dropout);
- `flex` where the measured table prefers FlexAttention for the shape (`cuda_table`), then
  `triton` (CUDA, dropout; head dims up to 256), then `flex` for what Triton does not serve (no
  dropout);
- `composed`: from ATen's CPU flash kernel, where no C++ compiler built the fused one, unless
  the scores may overflow it.
"""

from torch import Tensor

from attnlab.attention.cuda_table import length_bucket, measured_head_dims, preferred_cuda_path
from attnlab.attention.kernels import (
    composed,
    flex,
    fused,
    sdpa,
    triton_ops,
    triton_query_normalized,
)
from attnlab.attention.paths import CPU_DTYPES, CUDA_DTYPES, AttentionCall, FastPath, flex_serves
from attnlab.attention.reference import sinkhorn_log_weights
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.attention.schemes.unas import fused_cpu_supports


def _u(call: AttentionCall) -> Tensor | None:
    u = call.inputs.get("u")
    return None if u is None else u.to(call.q.dtype)


def _run_fused(normalizer, call: AttentionCall) -> Tensor:
    return fused.query_normalized_attend(call.q, call.k, call.v, _u(call), *call.masks,
                                         dropout_p=call.dropout_p)


def _triton_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return (device == "cuda" and dtype in CUDA_DTYPES and not causal and dropout_p < 1.0
            and triton_query_normalized.available("cuda"))


def _triton_serves(normalizer, call: AttentionCall) -> bool:
    """The Triton kernels take the call's shapes (head dims, rows): else said once."""
    reason = triton_query_normalized.declines(call.q, call.k, call.v)
    if reason is not None:
        triton_query_normalized.log_decline(reason)
    return reason is None


def _run_triton(normalizer, call: AttentionCall) -> Tensor:
    return triton_ops.query_normalized_attend_triton(
        call.q, call.k, call.v, call.inputs.get("u"), *call.masks, dropout_p=call.dropout_p)


def _flex_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    # no dropout: FlexAttention cannot drop normalized weights (kernels/flex.py)
    return (device == "cuda" and dtype in CUDA_DTYPES and not causal and dropout_p == 0.0
            and flex.available("cuda"))


def _run_flex(normalizer, call: AttentionCall) -> Tensor:
    n_iter = getattr(normalizer.options, "n_iter", 1)  # Sinkhorn's rounds; DNAS / HNAS: 1
    cache = call.mask_cache  # None outside run_stack: the kernel builds the masks of this call
    masks = None if cache is None else cache.get(call.q.shape[0], call.q.shape[-2], call.k.shape[-2],
                                                 call.q.device, *call.masks)
    return flex.query_normalized_attend_flex(call.q, call.k, call.v, call.inputs.get("u"),
                                             *call.masks, n_iter=n_iter, masks=masks)


def flex_preferred(normalizer, call: AttentionCall) -> bool:
    """The measured table prefers FlexAttention to Triton for this shape."""
    # Plain Python values from the shapes, also where torch.compile made them symbolic (dynamic
    # lengths): the bucket of the longer side, and the head dim if the table names it (else the
    # default serves). Comparisons only, which guard ranges (a new bucket compiles once more)
    # and break no graph, where reading a symbolic size as an int would.
    bucket = max(length_bucket(call.q.shape[-2]), length_bucket(call.k.shape[-2]))
    head_dim = next((d for d in measured_head_dims() if call.q.shape[-1] == d), 0)
    return preferred_cuda_path(bucket, head_dim, call.q.dtype) == "flex"


def _composed_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return device == "cpu" and dtype in CPU_DTYPES and dropout_p == 0.0 and not causal


def _fits_flash(normalizer, call: AttentionCall) -> bool:
    return not sdpa.scores_may_overflow(call.q, call.k)  # it runs on ATen's CPU flash kernel


def _run_composed(normalizer, call: AttentionCall) -> Tensor:
    u = _u(call)
    if u is None:
        return composed.dnas_flash(call.q, call.k, call.v, *call.masks)
    return composed.hnas_flash(call.q, call.k, call.v, u, *call.masks)


FUSED_CPU = FastPath("fused_cpu", fused_cpu_supports, _run_fused)
TRITON = FastPath("triton", _triton_supports, _run_triton, _triton_serves)
FLEX = FastPath("flex", _flex_supports, _run_flex, flex_serves)
COMPOSED = FastPath("composed", _composed_supports, _run_composed, _fits_flash)
QUERY_NORMALIZED_PATHS: tuple[FastPath, ...] = (FUSED_CPU, FLEX.only(flex_preferred), TRITON, FLEX,
                                                COMPOSED)


@register
class DNAS(Normalizer):
    name = "dnas"
    over_queries = True
    fast_paths = QUERY_NORMALIZED_PATHS

    def weights(self, logits: Tensor) -> Tensor:
        return sinkhorn_log_weights(logits, 1).exp()
