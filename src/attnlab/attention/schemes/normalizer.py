"""`Normalizer`: how one attention module turns logits into weights (UNAS, DNAS, HNAS, ...).

A normalizer is a `SchemeModule` (base.py: `name`, `Options`, its own parameters, `reported()`)
that also owns, in one class:
- `over_queries`: whether it normalizes over queries (this alone drives the decoder guard);
  `causal_only`: whether it is defined only for causal attention (stick-breaking);
  `rows_sum_to_one`: whether every valid row of its weights sums to 1 (False for sigmoid, the
  sink, softpick and stick-breaking: the analyses then treat rows as sub-stochastic);
- `input_names`: the tensors its computation takes besides q, k, v (HNAS: `u`), filled from its
  own parameters (`state_inputs()`, declared with `own(..., input=...)`) or, in the functional
  form without a module, from `default_inputs()` (a sink's fixed b) or the caller;
- `weights(logits, **inputs)`: the materialized reference, ground truth for tests and analyses;
- `fast_paths`: its kernels (`attnlab.attention.paths.FastPath`), best first, declared in its own
  file; the first that accepts a call runs (`route(call)` names it), else the reference. A
  subclass that redefines `weights` without listing its own fast paths gets none, so no scheme
  can run another scheme's kernel.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from attnlab.attention import notices, paths
from attnlab.attention.kernels import dropout
from attnlab.attention.paths import AttentionCall, FastPath
from attnlab.attention.reference import compute_dtype, masked_logits, output_dtype
from attnlab.attention.schemes.base import Attended, Heads, SchemeModule
from attnlab.attention.schemes.tables import fitting
from attnlab.errors import ConfigError


class Normalizer(SchemeModule):
    """How one attention module turns logits into weights. Subclass, set the class attributes,
    define `weights`, and decorate with `attnlab.attention.schemes.register`."""

    over_queries: ClassVar[bool] = False
    causal_only: ClassVar[bool] = False
    rows_sum_to_one: ClassVar[bool] = True
    # names of the tensors the computation needs besides q, k, v (HNAS: "u")
    input_names: ClassVar[tuple[str, ...]] = ()
    fast_paths: ClassVar[tuple[FastPath, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # New weights without new fast paths: the inherited kernels would compute the parent's
        # scheme, not this one. Such a subclass runs on its reference until it lists its own.
        if "weights" in cls.__dict__ and "fast_paths" not in cls.__dict__:
            cls.fast_paths = ()
        wrong = [p for p in cls.fast_paths if not isinstance(p, FastPath)]
        if wrong:
            raise TypeError(f"{cls.__name__}.fast_paths must list FastPath objects (name, supports, "
                            f"run, and serves for the calls it takes), got {wrong[0]!r}: see "
                            f"attnlab.attention.paths")

    # -- to define in a subclass
    def weights(self, logits: Tensor, **inputs: Tensor) -> Tensor:
        """(B, H, S_q, S_k) weights from float32 logits that are -inf where a (query, key) pair
        is masked: 0 there, a row without any valid key all 0, valid rows summing to 1 (at most
        1 where `rows_sum_to_one` is False). Never NaN."""
        raise NotImplementedError

    def default_inputs(self) -> dict[str, float]:
        """Inputs that have a fixed value when no parameter of a module gives them (a sink's b
        without `learned`, or in the functional form: `sink_init`)."""
        return {}

    # -- the computation
    def call(self, q, k, v, key_padding_mask=None, query_padding_mask=None, causal=False,
             dropout_p=0.0, mask_cache=None, **inputs) -> AttentionCall:
        """Validated inputs (one clear error per kind of bad input), the module's state filled in
        (constants in the working dtype); `mask_cache`: the block masks of a stack's forward
        (run_stack), for the FlexAttention paths."""
        inputs = {**self.default_inputs(), **self.state_inputs(), **inputs}
        check_inputs(q, k, v, key_padding_mask, query_padding_mask)
        missing = [n for n in self.input_names if inputs.get(n) is None]
        if missing:
            raise ConfigError(f"scheme={self.name!r} needs {', '.join(missing)} (broadcastable to "
                              f"(B, H, 1, 1), e.g. {missing[0]}=0.5)")
        if causal and self.over_queries:
            raise ConfigError(causal_error(self.name))
        if self.causal_only and not causal:
            raise ConfigError(causal_only_error(self.name))
        inputs = {n: _as_tensor(t, q) for n, t in inputs.items() if n in self.input_names}
        return AttentionCall(q, k, v, key_padding_mask, query_padding_mask, bool(causal),
                             float(dropout_p), inputs, mask_cache)

    def choose(self, call: AttentionCall) -> FastPath | None:
        """The fast path that runs `call` (None: the reference)."""
        return paths.choose(self.fast_paths, self, call)

    def route(self, call: AttentionCall) -> str:
        """The name of the kernel that runs `call`: its fast path's, else "reference"."""
        path = self.choose(call)
        return "reference" if path is None else path.name

    def attend(self, q, k, v, key_padding_mask=None, query_padding_mask=None, causal=False,
               dropout_p=0.0, mask_cache=None, **inputs) -> Tensor:
        """Output (B, H, S_q, d_v): the first fast path that accepts the call, else the reference."""
        call = self.call(q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p,
                         mask_cache, **inputs)
        path = self.choose(call)
        if path is not None:
            return path(self, call)
        if call.dropout_p:  # dropout alone may have kept every fast path from it
            device = paths.device_type(call.q)
            notices.dropout_keeps_fast_paths_off(self, device, paths.working_dtype(call.q, device),
                                                 call.dropout_p, call.causal)
        return self.reference(call)

    forward = attend

    def attend_heads(self, heads: Heads) -> Attended:
        """`attend` as one step of MultiHeadAttention (its weights are not materialized)."""
        if heads.prev_logits is not None:
            raise ConfigError(f"attention scheme {self.name!r} does not cascade, but it was given "
                              f"the logits of a previous layer")
        return Attended(self.attend(heads.q, heads.k, heads.v, heads.key_padding_mask,
                                    heads.query_padding_mask, heads.causal, heads.dropout_p,
                                    heads.mask_cache))

    def candidates(self, device: str, dtype: torch.dtype, dropout_p: float = 0.0,
                   causal: bool = False) -> list[str]:
        """Names of the fast paths that serve such calls (some only for some masks or shapes:
        `route` says which runs), in order, then "reference". A path listed twice (first for some
        calls only, e.g. UNAS's fused kernel for padded ones) is named at its last place."""
        names = [p.name for p in self.fast_paths if p.supports(self, device, dtype, dropout_p, causal)]
        return [*reversed(dict.fromkeys(reversed(names))), "reference"]

    def reference(self, call: AttentionCall) -> Tensor:
        """The exact materialized computation: weights(masked logits) @ v (O(S^2) memory)."""
        logits = masked_logits(call.q, call.k, call.key_padding_mask, call.query_padding_mask,
                               call.causal)
        return self.attend_logits(logits, call)[1]

    def attend_logits(self, logits: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor]:
        """(weights, output) from logits that are -inf where masked: the materialized tail that
        the reference, a logit transform's cascade and the head schemes share."""
        weights = self.weights(logits, **call.inputs)
        return weights, apply_weights(weights, call.v, call.dropout_p)

    def attention_weights(self, q, k, key_padding_mask=None, query_padding_mask=None,
                          causal=False, **inputs) -> Tensor:
        """Materialized weights (B, H, S_q, S_k), float32 (float64 stays), for analyses and tests."""
        call = self.call(q, k, None, key_padding_mask, query_padding_mask, causal, 0.0, **inputs)
        logits = masked_logits(q, k, key_padding_mask, query_padding_mask, causal)
        return self.weights(logits, **call.inputs)


def apply_weights(weights: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """Dropout on the weights (training), then weights @ v in the weights' precision; output in
    v's dtype (or the autocast dtype), as a fused kernel would give it. The dropout mask is the
    kernels' counter-based one (kernels/dropout.py): the same torch seed drops the same weights
    on every path."""
    if dropout_p > 0.0:
        keep = dropout.keep_mask(dropout.draw_seed(), tuple(weights.shape), dropout_p, weights.device)
        # p = 1 drops every weight, as torch's dropout does (not 0 * inf = NaN); the fast paths
        # decline p = 1, so this is where it runs
        weights = weights * keep * (1.0 / (1.0 - dropout_p) if dropout_p < 1.0 else 0.0)
    with torch.autocast(device_type=v.device.type, enabled=False):
        out = torch.matmul(weights, v.to(weights.dtype))
    return out.to(output_dtype(v))


def _as_tensor(value: Any, like: Tensor) -> Tensor:
    """A tensor input as given (integers: in the working dtype); a number in the working dtype
    (float32, float64 for float64 q), so that a constant is never rounded to float32 first."""
    if isinstance(value, Tensor):
        return value if value.is_floating_point() else value.to(compute_dtype(like))
    return torch.tensor(value, dtype=compute_dtype(like), device=like.device)


def causal_error(name: str) -> str:
    return (
        f"causal attention with scheme={name!r} is not allowed: {name} normalizes every key "
        f"column over all queries, so each position's weights depend on future positions (it "
        f"leaks the future and breaks step-by-step decoding). Use a scheme that normalizes over "
        f"keys where attention is causal: {', '.join(f'model={n}' for n in fitting(causal=True))}."
    )


def causal_only_error(name: str,
                      why: str = "each query breaks its stick over the keys before it") -> str:
    return (
        f"scheme={name!r} is defined for causal attention only ({why}); this attention is not "
        f"causal. Use {name} in a causal language model (task=lm), or here one of "
        f"{', '.join(f'model={n}' for n in fitting(causal=False))}."
    )


def _check_mask(mask: Tensor | None, name: str, batch: int, length: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ConfigError(f"{name} must be a bool tensor (True = padding), got {got}; "
                          f"pass e.g. `token_ids == pad_id`")
    if tuple(mask.shape) != (batch, length):
        raise ConfigError(f"{name} has shape {tuple(mask.shape)} but the attention inputs need "
                          f"(B, S) = {(batch, length)} (True = padding)")


def check_inputs(q, k, v, key_padding_mask, query_padding_mask) -> None:
    """Shapes of q, k, v (v may be None) and of the masks."""
    tensors = {"q": q, "k": k} if v is None else {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if t.dim() != 4:
            raise ConfigError(f"{name} must be 4-D (B, H, S, d), got shape {tuple(t.shape)}; "
                              f"split heads before calling attend")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ConfigError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share B, H and head size d")
    if v is not None and (v.shape[:2] != k.shape[:2] or v.shape[-2] != k.shape[-2]):
        raise ConfigError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} in B, H and S_k")
    _check_mask(key_padding_mask, "key_padding_mask", q.shape[0], k.shape[-2])
    _check_mask(query_padding_mask, "query_padding_mask", q.shape[0], q.shape[-2])
