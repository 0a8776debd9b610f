"""What every attention scheme is: a `Normalizer` (how logits become weights) or a
`LogitTransform` (how a layer's logits are built from the previous layer's: CODA, RealFormer).

A normalizer owns, in one class:
- `name` (the `model=` handle) and `Options`, a frozen dataclass of its options (the keys of
  `conf/model/<name>.yaml`), validated where the config is built;
- `over_queries`: whether it normalizes over queries (this alone drives the decoder guard);
  `causal_only`: whether it is defined only for causal attention (stick-breaking);
  `rows_sum_to_one`: whether every valid row of its weights sums to 1 (False for sigmoid, the
  sink, softpick and stick-breaking: the analyses then treat rows as sub-stochastic);
- its trainable parameters, if any (HNAS's `u`, a sink's `b`), as ordinary parameters of the
  module, handed to the computation by `state_inputs()`; optimizers and weight loaders find them
  by type (`scheme_parameters`), never by name. Their learning rate is the scheme's option
  `param_lr` (None: the optimizer's), and `reported()` says what the run summary, metrics.json,
  the loggers and the plots show of them, per head ({"u": (H,)});
- `weights(logits, **inputs)`: the materialized reference, ground truth for tests and analyses;
- `fast_paths`: callables `path(normalizer, call) -> Tensor | None` (attnlab.attention.paths), tried
  in order; each returns None for inputs it does not serve (device, dtype, dropout, causal, kernel
  unavailable), and then the reference runs. A subclass that redefines `weights` without listing its own fast paths gets
  none, so no scheme can fall through to another scheme's kernel.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention import notices, paths
from attnlab.attention.kernels import dropout
from attnlab.attention.paths import AttentionCall, PathFunction
from attnlab.attention.reference import compute_dtype, masked_logits, output_dtype
from attnlab.attention.schemes.tables import fitting
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class NoOptions:
    """A scheme without options."""


# ----------------------------------------------------------------------------- options
def option_names(options_cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(options_cls))


def _coerce(scheme: str, key: str, value: Any, kind: Any, default: Any = None) -> Any:
    """Value of option `key` as its annotated type; ConfigError naming the key (and, as an
    example, its default) otherwise."""
    kinds = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    if value is None and type(None) in kinds:
        return None
    for t in kinds:
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is str and isinstance(value, str):
            return value
    names = " or ".join("null" if t is type(None) else t.__name__ for t in kinds)
    example = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
    raise ConfigError(f"model.{key}={value!r}: {scheme}'s option {key} must be {names}, e.g. "
                      f"model.{key}={example}")


def build_options(scheme: str, options_cls: type, values: Mapping[str, Any]) -> Any:
    """`options_cls(**values)` with types checked; unknown keys are reported with the known ones."""
    known = option_names(options_cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        listed = ", ".join(known) if known else "none"
        raise ConfigError(
            f"model={scheme} has no option {', '.join(unknown)}; its options are {listed} "
            f"(see conf/model/{scheme}.yaml)"
        )
    hints = typing.get_type_hints(options_cls)
    defaults = {f.name: f.default for f in dataclasses.fields(options_cls)}
    typed = {k: _coerce(scheme, k, v, hints[k], defaults[k]) for k, v in values.items()}
    # every scheme with parameters has `param_lr` (Normalizer.param_lr): checked here, once
    rate = typed.get("param_lr")
    if rate is not None and not rate > 0:
        raise ConfigError(f"model.param_lr={rate:g} must be > 0 (or null: the optimizer's), "
                          f"e.g. model.param_lr=0.05")
    return options_cls(**typed)


# ----------------------------------------------------------------------------- normalizers
class Normalizer(nn.Module):
    """How one attention module turns logits into weights. Subclass, set the class attributes,
    define `weights`, and decorate with `attnlab.attention.schemes.register`."""

    name: ClassVar[str] = ""
    over_queries: ClassVar[bool] = False
    causal_only: ClassVar[bool] = False
    rows_sum_to_one: ClassVar[bool] = True
    # how a plot labels what `reported()` gives, e.g. {"u": "u (weight of DNAS)"}; else its name
    reported_labels: ClassVar[dict[str, str]] = {}
    Options: ClassVar[type] = NoOptions
    # names of the tensors the computation needs besides q, k, v (HNAS: "u")
    input_names: ClassVar[tuple[str, ...]] = ()
    fast_paths: ClassVar[tuple[PathFunction, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # New weights without new fast paths: the inherited kernels would compute the parent's
        # scheme, not this one. Such a subclass runs on its reference until it lists its own.
        if "weights" in cls.__dict__ and "fast_paths" not in cls.__dict__:
            cls.fast_paths = ()

    def __init__(self, options: Any = None, num_heads: int | None = None) -> None:
        super().__init__()
        self.options = self.Options() if options is None else options
        self.num_heads = num_heads

    def extra_repr(self) -> str:
        return f"{self.name}, {self.options}"

    # -- to define in a subclass
    def weights(self, logits: Tensor, **inputs: Tensor) -> Tensor:
        """(B, H, S_q, S_k) weights from float32 logits that are -inf where a (query, key) pair
        is masked: 0 there, a row without any valid key all 0, valid rows summing to 1 (at most
        1 where `rows_sum_to_one` is False). Never NaN."""
        raise NotImplementedError

    def state_inputs(self) -> dict[str, Tensor]:
        """This module's trainable state as inputs of the computation (HNAS: {"u": ...})."""
        return {}

    def reported(self) -> dict[str, Tensor]:
        """This module's own parameters as a researcher reads them, one value per head, detached,
        float32, shape (H,): HNAS {"u": ...}, a learned sink {"b": ...}; {} when it has none.
        Gathered per layer by `scheme_values` for the run summary, metrics.json
        (`scheme_params`), the loggers and the plots."""
        return {}

    @property
    def param_lr(self) -> float | None:
        """The learning rate of this scheme's own parameters (its option `param_lr`; None: the
        optimizer's). They train without weight decay (`attnlab.task_module.parameter_groups`)."""
        return getattr(self.options, "param_lr", None)

    # -- the computation
    def call(self, q, k, v, key_padding_mask=None, query_padding_mask=None, causal=False,
             dropout_p=0.0, mask_cache=None, **inputs) -> AttentionCall:
        """Validated inputs (one clear error per kind of bad input), the module's state filled in;
        `mask_cache`: the block masks of a stack's forward (run_stack), for the FlexAttention paths."""
        inputs = {**self.state_inputs(), **inputs}
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

    def attend(self, q, k, v, key_padding_mask=None, query_padding_mask=None, causal=False,
               dropout_p=0.0, mask_cache=None, **inputs) -> Tensor:
        """Output (B, H, S_q, d_v): the first fast path that serves the inputs, else the reference."""
        call = self.call(q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p,
                         mask_cache, **inputs)
        for path in self.fast_paths:
            out = path(self, call)
            if out is not None:
                return out
        if call.dropout_p:  # dropout alone may have kept every fast path from it
            device = paths.device_type(call.q)
            notices.dropout_keeps_fast_paths_off(self, device, paths.working_dtype(call.q, device),
                                                 call.dropout_p, call.causal)
        return self.reference(call)

    forward = attend

    def route(self, device: str, dtype: torch.dtype, dropout_p: float = 0.0, causal: bool = False) -> list[str]:
        """Names of the fast paths that would serve such a call, best first, then "reference"."""
        names = [getattr(p, "name", getattr(p, "__name__", "?")) for p in self.fast_paths
                 if not hasattr(p, "supports") or p.supports(self, device, dtype, dropout_p, causal)]
        return [*names, "reference"]

    def reference(self, call: AttentionCall) -> Tensor:
        """The exact materialized computation: weights(masked logits) @ v (O(S^2) memory)."""
        logits = masked_logits(call.q, call.k, call.key_padding_mask, call.query_padding_mask,
                               call.causal)
        return apply_weights(self.weights(logits, **call.inputs), call.v, call.dropout_p)

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


def _as_tensor(value, like: Tensor) -> Tensor:
    t = torch.as_tensor(value, device=like.device)
    return t if t.is_floating_point() else t.to(compute_dtype(like))


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


# ----------------------------------------------------------------------------- logit transforms
class LogitTransform(nn.Module):
    """How a layer's logits are built from its scores and the previous layer's logits (a cascade
    stack: CODA, RealFormer). The weights then come from the spec's normalizer.

    `receives_logits` is fixed when the module is built: False for the first layer of a stack
    (it has no previous layer), True for the others, which must be given the previous logits.

    `row_wise` declares that the logits of a (query, key) pair depend only on that pair's scores
    and previous logits (across heads, in eval mode): then incremental decoding can cache keys
    and values and carry the newest query's row of logits from layer to layer
    (attnlab.attention.kv_cache). The default, False, is the safe answer: such a stack decodes by
    re-running the prefix at every step, which is exact for any transform.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    row_wise: ClassVar[bool] = False
    # defined for causal attention only (selective attention); refused elsewhere, in one line
    causal_only: ClassVar[bool] = False
    causal_only_why: ClassVar[str] = ""

    def __init__(self, options: Any = None, num_heads: int = 1, receives_logits: bool = False) -> None:
        super().__init__()
        self.options = self.Options() if options is None else options
        self.num_heads = num_heads
        self.receives_logits = bool(receives_logits) and self.passes_logits

    def extra_repr(self) -> str:
        return f"{self.name}, receives_logits={self.receives_logits}, {self.options}"

    @property
    def passes_logits(self) -> bool:
        """Whether the logits go on to the next layer of the stack."""
        return True

    def check_causal(self, causal: bool) -> None:
        """Refuse attention that is not causal when this transform is `causal_only`."""
        if self.causal_only and not causal:
            raise ConfigError(causal_only_error(self.name, self.causal_only_why or "see its docs"))

    def forward(self, scores: Tensor, previous: Tensor | None) -> Tensor:
        """Logits z (B, H, S_q, S_k) from this layer's scaled scores (finite, 0 where masked) and
        the previous layer's z (0 where masked; None in the first layer)."""
        raise NotImplementedError


# ----------------------------------------------------------------------------- head schemes
class HeadScheme(nn.Module):
    """A scheme that computes its heads' outputs itself from the projected heads, with the spec's
    normalizer for the weights it combines (differential attention: two maps per head, their
    difference, a norm on the output). `MultiHeadAttention` hands it its heads in `attend_heads`
    (and the query input, for schemes that project it: `needs_query`); it returns the output
    (B, H, S_q, d_v) and the effective weights (B, H, S_q, S_k) that the analyses record.

    Like a normalizer it has `name`, `Options`, `reported()` (per head, gathered by
    `scheme_values`) and `param_lr`; `scheme_parameters()` are those of its parameters that train
    at `param_lr` without weight decay (default: all of them); the others train as the model's.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    reported_labels: ClassVar[dict[str, str]] = {}
    needs_query: ClassVar[bool] = False  # the query input (B, S_q, E) must be given

    def __init__(self, options: Any = None, num_heads: int = 1, head_dim: int = 1,
                 value_dim: int | None = None, embed_dim: int | None = None,
                 layer_index: int = 0) -> None:
        super().__init__()
        self.options = self.Options() if options is None else options
        self.num_heads = int(num_heads)
        self.head_dim = int(head_dim)
        self.value_dim = int(head_dim if value_dim is None else value_dim)
        self.embed_dim = int(num_heads * head_dim if embed_dim is None else embed_dim)
        self.layer_index = int(layer_index)

    def extra_repr(self) -> str:
        return f"{self.name}, layer_index={self.layer_index}, {self.options}"

    def reported(self) -> dict[str, Tensor]:
        return {}

    @property
    def param_lr(self) -> float | None:
        return getattr(self.options, "param_lr", None)

    def scheme_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())

    def forward(self, normalizer: Normalizer, q: Tensor, k: Tensor, v: Tensor,
                key_padding_mask: Tensor | None = None, query_padding_mask: Tensor | None = None,
                causal: bool = False, dropout_p: float = 0.0, query: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError
