"""Softmax with a sink: w_ij = exp(s_ij) / (exp(b_h) + sum_k exp(s_k)), the k over the row's valid
keys, one sink logit b_h per head.

The sink is a key that every query sees, with logit b_h and no value: rows sum to
1 - exp(b_h) / (exp(b_h) + sum_k exp(s_k)) < 1, so a head can attend to "nothing". It is the
attention of gpt-oss (openai/gpt-oss `torch/model.py` `sdpa`: a per-head sink logit concatenated
to the logits, softmax, the sink's column dropped; transformers' `models/gpt_oss` `sinks` /
`s_aux`), x-transformers' `head_learned_sink` (sinks starting at 0, as `sink_init` does here);
with b = 0 fixed it is softmax_1, "attention is off by one" (E. Miller 2023; x-transformers'
`add_zero_kv` with a zero value).

learned=True: b_h trainable, starting at sink_init (the functional form without b uses
sink_init); learned=False: b fixed at sink_init (0: softmax_1). Computed in log space (the
row's maximum taken over its logits and b together), so that no logit overflows; a row without
any valid key is all 0 (its whole mass goes to the sink).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.attention.kernels import flex_rowwise, rowwise
from attnlab.attention.paths import AttentionCall, FastPath, compiled_cpu, flex_cuda, flex_serves
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class SinkOptions:
    learned: bool = True  # b_h trainable per head; False: b fixed at sink_init (0: softmax_1)
    sink_init: float = 0.0  # initial (or fixed) sink logit
    param_lr: float | None = None  # learning rate of the sink logits (None: the optimizer's)

    def __post_init__(self) -> None:
        if not abs(self.sink_init) < float("inf"):
            raise ConfigError(f"model.sink_init={self.sink_init} must be a finite logit, "
                              f"e.g. model.sink_init=0.0")


def sink_log_weights(logits: Tensor, b: Tensor) -> Tensor:
    """log w_ij = s_ij - log(exp(b) + sum_k exp(s_ik)): -inf where s is; finite where any b is.

    Computed as (s - m) - log(sum exp(s - m) + exp(b - m)) with m = max(row max, b) detached: the
    sum holds a term equal to 1, so its log is finite and >= 0, and large logits keep their
    precision (as reference.safe_log_normalize)."""
    m = torch.maximum(logits.detach().amax(-1, keepdim=True), b.detach())
    shifted = logits - m
    total = torch.exp(shifted).sum(-1, keepdim=True) + torch.exp(b - m)
    return shifted - torch.log(total)


# its kernels: the fused row-wise C++ kernel on the CPU (padding, causal, dropout; exact gradients
# of q, k, v and b), FlexAttention on CUDA (no dropout)
def _run_cpu(normalizer, call: AttentionCall) -> Tensor:
    return rowwise.sink_attend(call.q, call.k, call.v, call.inputs["b"], *call.masks,
                               causal=call.causal, dropout_p=call.dropout_p)


def _run_flex(normalizer, call: AttentionCall) -> Tensor:
    return flex_rowwise.sink_attend_flex(call.q, call.k, call.v, call.inputs["b"], *call.masks,
                                         call.causal, call.mask_cache)


PATHS = (FastPath("fused_cpu", compiled_cpu, _run_cpu, any_value_width=True),
         FastPath("flex", flex_cuda, _run_flex, flex_serves))


@register
class Sink(Normalizer):
    name = "sink"
    rows_sum_to_one = False
    Options = SinkOptions
    input_names = ("b",)
    fast_paths = PATHS

    def __init__(self, options: SinkOptions | None = None, num_heads: int | None = None) -> None:
        super().__init__(options, num_heads)
        if self.options.learned and num_heads is not None:  # a module's scheme owns its b
            self.per_head("sink", self.options.sink_init, input="b", report="b")

    def default_inputs(self) -> dict[str, float]:
        return {"b": self.options.sink_init}

    def weights(self, logits: Tensor, b: Tensor) -> Tensor:
        return sink_log_weights(logits, b.to(logits.dtype)).exp()
