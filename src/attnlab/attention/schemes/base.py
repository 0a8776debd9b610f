"""What every kind of scheme shares (`SchemeModule`), and the one rule for a scheme's own
parameters.

A scheme is one of four kinds, each a `SchemeModule`: a `Normalizer` (how logits become weights:
normalizer.py), a `LogitTransform` (how a layer's logits are built from the previous layer's:
transform.py), a `HeadScheme` (computes its heads' outputs itself: head_scheme.py) or the
`OutputGate` (`model.gate`: attention/gate.py). Each has `name`, `Options` (a frozen dataclass of
its options, the keys of `conf/model/<name>.yaml`, validated by `build_options`), `param_lr` and
`reported()`.

**Its own parameters, one rule for every kind.** The parameters a scheme module holds directly
(`scheme_parameters()`) are the scheme's own: they train at the scheme's `param_lr`
(`model.param_lr`; None: the optimizer's rate) and are never weight-decayed
(`attnlab.task_module.parameter_groups`). Parameters inside its submodules (CODA's head MLP,
diff v2's projections, the gate's linear map) are ordinary model weights (decayed iff >= 2-D).
Declare one with `self.own(...)`, or `self.per_head(...)` for one value per head (or per layer),
to say what it feeds and how it is read:
- `input="u"`: the computation gets it as the input `u` (`state_inputs()`: a per-head vector as
  (1, H, 1, 1), broadcast over (B, H, S_q, S_k));
- `report="u"`: `reported()` gives it per head under that key, gathered by `scheme_values` into the
  run summary, metrics.json's `scheme_params`, the loggers and the plots;
- `value=torch.sigmoid`: what the computation and the report use instead of the raw parameter
  (HNAS trains the logit of u); `shown=torch.diagonal`: how a parameter that is not one value per
  head is read per head for the report (a talking-heads matrix: its diagonal).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

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
    # every scheme with parameters has `param_lr` (SchemeModule.param_lr): checked here, once
    rate = typed.get("param_lr")
    if rate is not None and not rate > 0:
        raise ConfigError(f"model.param_lr={rate:g} must be > 0 (or null: the optimizer's), "
                          f"e.g. model.param_lr=0.05")
    return options_cls(**typed)


# ----------------------------------------------------------------------------- own parameters
@dataclass(frozen=True)
class Owned:
    """How a scheme's own parameter is used (SchemeModule.own)."""

    input: str | None = None  # the computation input it feeds (state_inputs), e.g. "u"
    report: str | None = None  # the key reported() gives it under, e.g. "u"
    value: Callable[[Tensor], Tensor] | None = None  # parameter -> what is used (None: itself)
    shown: Callable[[Tensor], Tensor] | None = None  # value -> one per head (None: itself)


class SchemeModule(nn.Module):
    """What every kind of scheme is (see the module doc): name, options, its own parameters."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    # how a plot labels what `reported()` gives, e.g. {"u": "u (weight of DNAS)"}; else its name
    reported_labels: ClassVar[dict[str, str]] = {}

    def __init__(self, options: Any = None, num_heads: int | None = None) -> None:
        super().__init__()
        self.options = self.Options() if options is None else options
        self.num_heads = num_heads
        self._owned: dict[str, Owned] = {}

    def extra_repr(self) -> str:
        return f"{self.name}, {self.options}"

    @property
    def param_lr(self) -> float | None:
        """The learning rate of this scheme's own parameters (its option `param_lr`; None: the
        optimizer's). They train without weight decay."""
        return getattr(self.options, "param_lr", None)

    # -- declaring its own parameters
    def own(self, name: str, initial: Tensor, *, input: str | None = None, report: str | None = None,
            value: Callable[[Tensor], Tensor] | None = None,
            shown: Callable[[Tensor], Tensor] | None = None) -> nn.Parameter:
        """Register `initial` as this scheme's own parameter `name` (its state-dict key) and say
        what it feeds (`input`) and how it is reported (`report`, `value`, `shown`)."""
        parameter, how = nn.Parameter(initial), Owned(input, report, value, shown)
        if report is not None:  # a report that is not one value per head fails here, not at the end
            self._per_head(name, parameter, how)
        self.register_parameter(name, parameter)
        self._owned[name] = how
        return parameter

    def per_head(self, name: str, initial: float, *, per: str = "head", **how: Any) -> nn.Parameter:
        """`own` a vector of `initial`: one value per head (H,), or per layer (1,) with per="layer"."""
        if self.num_heads is None:
            raise ValueError(f"{type(self).__name__}.per_head needs num_heads (a module's scheme)")
        rows = self.num_heads if per == "head" else 1
        return self.own(name, torch.full((rows,), float(initial)), **how)

    def owned_value(self, name: str) -> Tensor:
        """Own parameter `name` as the computation uses it (its `value`, else itself)."""
        how, parameter = self._owned[name], getattr(self, name)
        return parameter if how.value is None else how.value(parameter)

    def _per_head(self, name: str, parameter: Tensor, how: Owned) -> Tensor:
        """What `reported()` gives of an own parameter: float32 (H,), detached."""
        values = parameter.detach() if how.value is None else how.value(parameter.detach())
        values = values if how.shown is None else how.shown(values)
        heads = self.num_heads or values.numel()
        if values.dim() != 1 or values.numel() not in (1, heads):
            raise ValueError(
                f"{type(self).__name__}: own parameter {name!r} is reported as shape "
                f"{tuple(values.shape)}, not one value per head ({heads}) or per layer (1); pass "
                f"shown= to read it per head")
        return values.float().expand(heads).clone()

    # -- what the rest of the library reads
    def scheme_parameters(self) -> list[nn.Parameter]:
        """This scheme's own parameters: the ones it holds directly (not its submodules')."""
        return list(self.parameters(recurse=False))

    def state_inputs(self) -> dict[str, Tensor]:
        """The own parameters declared with `input`, as the computation takes them."""
        inputs = {}
        for name, how in self._owned.items():
            if how.input is not None:
                value = self.owned_value(name)
                inputs[how.input] = value.view(1, -1, 1, 1) if value.dim() == 1 else value
        return inputs

    def reported(self) -> dict[str, Tensor]:
        """This scheme's own parameters as a researcher reads them, one value per head, detached,
        float32, shape (H,): HNAS {"u": ...}, a learned sink {"b": ...}; {} when it has none.
        Gathered per layer by `scheme_values`."""
        return {how.report: self._per_head(name, getattr(self, name), how)
                for name, how in self._owned.items() if how.report is not None}


# ----------------------------------------------------------------------------- one attention step
@dataclass(frozen=True)
class Heads:
    """One attention module's projected, split heads and how they attend: what the `attend_heads`
    step of every kind takes (MultiHeadAttention.attend_heads builds it)."""

    q: Tensor  # (B, H, S_q, d)
    k: Tensor  # (B, H, S_k, d)
    v: Tensor  # (B, H, S_k, d_v)
    key_padding_mask: Tensor | None = None  # bool (B, S_k), True = padding
    query_padding_mask: Tensor | None = None  # bool (B, S_q)
    causal: bool = False
    dropout_p: float = 0.0  # attention dropout (0 in eval)
    prev_logits: Tensor | None = None  # the previous layer's, in a cascade stack
    query: Tensor | None = None  # the query input (B, S_q, E), for head schemes that project it
    mask_cache: Any = None  # the FlexAttention block masks of a stack's forward (run_stack)


@dataclass(frozen=True)
class Attended:
    """What an `attend_heads` step gives back."""

    out: Tensor  # (B, H, S_q, d_v)
    weights: Tensor | None = None  # the effective weights where they were materialized anyway
    logits: Tensor | None = None  # passed on to the next layer of a cascade stack (or None)


class DeferredWeights(Attended):
    """An `Attended` whose effective weights are materialized only when read (a recorder reads
    them: MultiHeadAttention._record), never in training. The block paths of selective and
    differential attention return it, so that recording still gets their own weights."""

    def __init__(self, out: Tensor, materialize, logits: Tensor | None = None) -> None:
        object.__setattr__(self, "out", out)
        object.__setattr__(self, "logits", logits)
        object.__setattr__(self, "_materialize", materialize)

    @property
    def weights(self) -> Tensor:  # type: ignore[override]
        return self._materialize()
