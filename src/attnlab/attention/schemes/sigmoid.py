"""Sigmoid attention: w_ij = sigmoid(s_ij + b), each weight on its own, rows not normalized
(Ramapuram et al., ICLR 2025, "Theory, analysis, and best practices for sigmoid self-attention";
code: apple/ml-sigmoid-attention).

The bias b keeps a row's total weight O(1) where a plain sigmoid would give ~n/2:
- "log_n" (default, the paper's b = -log n): n is the number of valid keys of the row, counted
  here per row from the masked logits (so a causal row i has n = i + 1 visible keys and a padded
  sequence its own length). The authors' code instead adds one scalar b = -log(training length)
  to every row (e.g. -7.62 = -log 2048 in their configs), causal rows included;
- "learned": one trainable b per head, starting at -log(bias_init_n) (the log_n bias of a row of
  bias_init_n keys); the functional form without b uses that starting value;
- "zero": b = 0.

Normalizes nothing, so it is row-wise (valid in decoders and causal attention). Masked keys
get exactly 0 and a row without any valid key is all 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.attention.kernels import flex_rowwise, rowwise
from attnlab.attention.paths import AttentionCall, FastPath, compiled_cpu, flex_cuda, flex_serves
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError

BIASES = ("log_n", "learned", "zero")


@dataclass(frozen=True)
class SigmoidOptions:
    bias: str = "log_n"  # log_n: b = -log(valid keys of the row); learned: b per head; zero
    bias_init_n: int = 64  # learned: b starts at -log(bias_init_n)
    param_lr: float | None = None  # learning rate of the learned b (None: the optimizer's)

    def __post_init__(self) -> None:
        if self.bias not in BIASES:
            raise ConfigError(f"model.bias={self.bias!r} is not a sigmoid bias; use one of "
                              f"{', '.join(BIASES)}, e.g. model.bias=log_n")
        if self.bias_init_n < 1:
            raise ConfigError(f"model.bias_init_n={self.bias_init_n} must be >= 1 (the learned b "
                              f"starts at -log(bias_init_n)), e.g. model.bias_init_n=64")


# its kernels: the fused row-wise C++ kernel on the CPU (padding, causal, dropout; exact gradients
# of q, k, v and b), FlexAttention on CUDA (no dropout)
def _run_cpu(normalizer, call: AttentionCall) -> Tensor:
    return rowwise.sigmoid_attend(call.q, call.k, call.v, normalizer.options.bias,
                                  call.inputs.get("b"), *call.masks, causal=call.causal,
                                  dropout_p=call.dropout_p)


def _run_flex(normalizer, call: AttentionCall) -> Tensor:
    return flex_rowwise.sigmoid_attend_flex(call.q, call.k, call.v, normalizer.options.bias,
                                            call.inputs.get("b"), *call.masks, call.causal,
                                            call.mask_cache)


PATHS = (FastPath("fused_cpu", compiled_cpu, _run_cpu, any_value_width=True),
         FastPath("flex", flex_cuda, _run_flex, flex_serves))


@register
class Sigmoid(Normalizer):
    name = "sigmoid"
    rows_sum_to_one = False
    Options = SigmoidOptions
    input_names = ("b",)  # with bias=learned only (see __init__)
    fast_paths = PATHS

    def __init__(self, options: SigmoidOptions | None = None, num_heads: int | None = None) -> None:
        super().__init__(options, num_heads)
        self.learned = self.options.bias == "learned"
        if not self.learned:  # b is not an input: log_n and zero fix it
            self.input_names = ()
        elif num_heads is not None:  # a module's scheme owns its b; the functional form may be given b
            self.per_head("bias", self.initial_bias, input="b", report="b")

    @property
    def initial_bias(self) -> float:
        return -math.log(self.options.bias_init_n)

    def default_inputs(self) -> dict[str, float]:
        return {"b": self.initial_bias} if self.learned else {}

    def weights(self, logits: Tensor, b: Tensor | None = None) -> Tensor:
        valid = torch.isfinite(logits)
        scores = torch.where(valid, logits, torch.zeros_like(logits))  # no -inf in any gradient
        if self.options.bias == "log_n":
            n = valid.sum(-1, keepdim=True).clamp(min=1).to(logits.dtype)
            scores = scores - torch.log(n)
        elif self.options.bias == "learned":
            scores = scores + b.to(logits.dtype)
        return torch.where(valid, torch.sigmoid(scores), torch.zeros_like(scores))
