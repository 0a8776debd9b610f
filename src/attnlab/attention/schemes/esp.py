"""ESPFormer (Shahbazi et al., ICML 2025, "ESPFormer: Doubly-Stochastic Attention with Expected
Sliced Transport Plans"; code: github.com/dariansal/ESPFormer, `attentions/esp.py`).

The weights are a mixture of sliced transport plans between the queries and the keys: for each
slice (by default the d coordinate axes of the head, as in the authors' code: L = d, fixed, not
learned), queries and keys projected on it are soft-sorted and matched rank to rank, and the
plans are mixed by softmax(-tau <C, G_l>), C the Euclidean cost between q and k (math and
notation: `attnlab.attention.kernels.esp`). No Sinkhorn iteration; O(L S_q S_k) memory and
O(L S^3) time per head (the plans are products of S x S soft permutations).

Unlike the other normalizers ESP is not a function of the logits q.k: it overrides `reference`
and `attention_weights` to compute from q and k, and `weights(logits)` (what a logit transform's
cascade stack would call) refuses.

Differences from the authors' `Esp` (default `hard=True`; `hard=false` is their forward):
- `hard=True` (their `SoftSort_p2(hard=True)`, not their default): the plans' values are the
  sort permutations, so A is exactly doubly stochastic; their default soft plans are only
  roughly so (rows and columns off by 0.1 to 0.4 at d = 16..64, S = 16..128). The hard
  permutation is the sort's order (their `topk` of the soft rows picks one element twice on ties).
- padding: a padded query or key has no rank and takes no mass (rows and columns 0); theirs
  fills padded values with 1e18 (one mask for queries and keys) and gives the padded block mass.
- S_q != S_k, or different numbers of valid queries and keys (n_q, n_k): the ranks are matched
  by quantile overlap (their code needs S_q = S_k); valid rows sum to 1, valid columns to n_q/n_k.
- optional `slices`: that many fixed random unit directions instead of the d axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from attnlab.attention.kernels import esp as sliced
from attnlab.attention.paths import CPU_DTYPES, CUDA_DTYPES, AttentionCall, FastPath
from attnlab.attention.schemes.normalizer import Normalizer, apply_weights
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class ESPOptions:
    tau: float = 10.0  # inverse temperature of the mixture softmax(-tau <C, G_l>) (authors: 10)
    softsort_tau: float = 1e-3  # temperature of the soft sort (authors' SoftSort_p2 tau)
    hard: bool = True  # straight-through sort permutations: exactly doubly stochastic
    slices: int | None = None  # None: the d coordinate axes (authors'); L: L random directions
    seed: int = 0  # of the random directions (slices: L)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tau) and self.tau >= 0):
            raise ConfigError(f"model.tau={self.tau} must be a finite number >= 0 for esp (the "
                              f"mixture's inverse temperature; 0 = the mean of the plans), e.g. "
                              f"model.tau=10")
        if not (math.isfinite(self.softsort_tau) and self.softsort_tau > 0):
            raise ConfigError(f"model.softsort_tau={self.softsort_tau} must be a finite number > 0 "
                              f"for esp (the soft sort's temperature), e.g. model.softsort_tau=0.001")
        if not isinstance(self.hard, bool):
            raise ConfigError(f"model.hard={self.hard!r} must be true or false for esp, e.g. "
                              f"model.hard=true")
        if self.slices is not None and (isinstance(self.slices, bool) or not isinstance(self.slices, int)
                                        or self.slices < 1):
            raise ConfigError(f"model.slices={self.slices!r} must be null (the head's d axes) or "
                              f"an integer >= 1 for esp, e.g. model.slices=null")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"model.seed={self.seed!r} must be an integer >= 0 for esp, e.g. "
                              f"model.seed=0")


# ESPFormer by blocks of slices (kernels/esp.py): never all L plans at once; CPU and CUDA,
# dropout as the reference's (apply_weights); causal never reaches it (ESP normalizes over queries)
def _esp_chunked_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    fits = dtype in CPU_DTYPES if device == "cpu" else device == "cuda" and dtype in CUDA_DTYPES
    return fits and not causal


def _run_esp_chunked(normalizer, call: AttentionCall) -> Tensor | None:
    w = sliced.esp_weights_chunked(call.q, call.k, call.key_padding_mask, call.query_padding_mask,
                            normalizer.options)
    return apply_weights(w, call.v, call.dropout_p)


ESP_CHUNKED = FastPath("chunked", _esp_chunked_supports, _run_esp_chunked)
ESP_PATHS: tuple[FastPath, ...] = (ESP_CHUNKED,)


@register
class ESP(Normalizer):
    name = "esp"
    over_queries = True
    Options = ESPOptions
    fast_paths = ESP_PATHS

    def weights(self, logits: Tensor, **inputs: Tensor) -> Tensor:
        raise ConfigError("scheme='esp' computes its weights from q and k (sliced transport "
                          "plans), not from logits: it cannot follow a logit transform (coda, "
                          "realformer); use model=esp alone")

    def reference(self, call: AttentionCall) -> Tensor:
        w = sliced.esp_weights(call.q, call.k, call.key_padding_mask, call.query_padding_mask, self.options)
        return apply_weights(w, call.v, call.dropout_p)

    def attention_weights(self, q, k, key_padding_mask=None, query_padding_mask=None,
                          causal=False, **inputs) -> Tensor:
        self.call(q, k, None, key_padding_mask, query_padding_mask, causal, 0.0, **inputs)
        return sliced.esp_weights(q, k, key_padding_mask, query_padding_mask, self.options)
