"""Stick-breaking attention (Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention: An
Efficient Implementation and In-depth Study"; code: github.com/shawntan/stickbreaking-attention).

Query i breaks a stick of length 1 over the keys before it, nearest first: key j takes the share
sigmoid(z_ij) of what the keys between them (j < k < i) left over,

    A_ij = sigmoid(z_ij) * prod_{j<k<i} (1 - sigmoid(z_ik)),   j < i,

computed in log space, log A_ij = logsigmoid(z_ij) + sum_{j<k<i} logsigmoid(-z_ik), the sum a
reversed cumulative sum along keys. z = q.k / sqrt(d), no bias, as in the authors' `sb_ref.py`.

As in the authors' code (`attend_current=False`, their default) the query's own position is not a
key: row 0 has no key and is all 0. `attend_current=True` lets key j = i take its share first
(their option of that name). The remainder 1 - sum_j A_ij stays unassigned: rows sum to at most 1
(`rows_sum_to_one = False`). The authors' reference returns it (`rem`) and their tests add
rem * v_i to the output; attnlab does not.

Defined for causal attention only (`causal_only`): refused elsewhere. A padded key is absent: it
takes no share and consumes none of the stick (its logsigmoid(-z) term is 0). Materialized
reference here (the math is `kernels/stickbreaking.stickbreaking_weights`, which `attention_weights`
and the analyses use). Path "blocked" (kernels/stickbreaking.py) never holds S x S: on the CPU a
C++ kernel in the fused library, flash style (the stick carried from the diagonal leftwards, the
scores recomputed in the backward; at S = 4096 about SDPA's time and memory), elsewhere blocks of
queries under checkpointing.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnlab.attention.kernels import stickbreaking as blocked
from attnlab.attention.paths import CPU_DTYPES, CUDA_DTYPES, AttentionCall, FastPath
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class StickBreakingOptions:
    # True: the query's own position is a key, breaking the stick first (the authors' option)
    attend_current: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.attend_current, bool):
            raise ConfigError(f"model.attend_current={self.attend_current!r} must be true or false "
                              f"for stickbreaking (true: the query's own position is a key), e.g. "
                              f"model.attend_current=false")


# its kernel (kernels/stickbreaking.py), no S x S memory: the fused C++ kernel on the CPU (query
# blocks where it did not build), query blocks on CUDA; causal only, no dropout; a call of one
# block runs on the reference, as lean
def _blocked_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    fits = dtype in CPU_DTYPES if device == "cpu" else device == "cuda" and dtype in CUDA_DTYPES
    return fits and causal and dropout_p == 0.0


def _more_than_one_block(normalizer, call: AttentionCall) -> bool:
    return call.q.shape[-2] * call.k.shape[-2] > blocked.MIN_PAIRS


def _run_blocked(normalizer, call: AttentionCall) -> Tensor:
    return blocked.stickbreaking_attend(call.q, call.k, call.v, *call.masks,
                                        attend_current=normalizer.options.attend_current)


PATHS = (FastPath("blocked", _blocked_supports, _run_blocked, _more_than_one_block,
                  any_value_width=True),)


@register
class StickBreaking(Normalizer):
    name = "stickbreaking"
    causal_only = True
    rows_sum_to_one = False
    Options = StickBreakingOptions
    fast_paths = PATHS

    def weights(self, logits: Tensor) -> Tensor:
        return blocked.stickbreaking_weights(logits, self.options.attend_current)
