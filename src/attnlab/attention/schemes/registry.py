"""The registry: scheme name -> class, for normalizers and logit transforms alike (the tables
themselves, `names` and `fitting` live in the leaf tables.py).

`@register` on a subclass of `Normalizer` or `LogitTransform` makes it a `model=` choice (with a
`conf/model/<name>.yaml`) and a `scheme=` of `attend`. Names are unique across both kinds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from torch import Tensor, nn

from attnlab.attention.schemes.base import SchemeModule, option_names
from attnlab.attention.schemes.head_scheme import HeadScheme
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.tables import (  # noqa: F401 - names and fitting: re-exported
    HEAD_SCHEMES,
    NORMALIZERS,
    TRANSFORMS,
    fitting,
    names,
)
from attnlab.attention.schemes.transform import LogitTransform
from attnlab.errors import ConfigError

T = TypeVar("T", bound=type)


def register(cls: T) -> T:
    """Class decorator: register a scheme under `cls.name` (re-registering a name replaces it)."""
    name = getattr(cls, "name", "")
    if not name or name != name.lower() or not name.replace("_", "").isalnum():
        raise ValueError(f"{cls.__name__}.name must be a lower-case identifier, got {name!r}")
    tables = {Normalizer: NORMALIZERS, LogitTransform: TRANSFORMS, HeadScheme: HEAD_SCHEMES}
    kind = next((k for k in tables if issubclass(cls, k)), None)
    if kind is None:
        raise TypeError(f"{cls.__name__} is neither a Normalizer, a LogitTransform nor a HeadScheme")
    table = tables[kind]
    for other in tables.values():
        if other is not table and name in other:
            raise ValueError(f"scheme name {name!r} is taken by {other[name].__name__}")
    table[name] = cls
    return cls


def unregister(name: str) -> None:
    NORMALIZERS.pop(name, None)
    TRANSFORMS.pop(name, None)
    HEAD_SCHEMES.pop(name, None)


def normalizer_class(name: str) -> type[Normalizer]:
    name = str(name).lower()
    if name in HEAD_SCHEMES:
        raise ConfigError(f"scheme {name!r} computes the heads' outputs itself; it runs inside "
                          f"MultiHeadAttention (spec={name!r}) with a normalization, not as one")
    if name in TRANSFORMS:
        raise ConfigError(
            f"scheme {name!r} transforms logits across the layers of a stack; it runs inside "
            f"MultiHeadAttention (spec={name!r}) with a normalization, not as a normalization itself"
        )
    try:
        return NORMALIZERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown attention scheme {name!r}; the registered normalizations are "
            f"{', '.join(sorted(NORMALIZERS))} (e.g. model=hnas)"
        ) from None


def query_normalized() -> tuple[str, ...]:
    """Names of the normalizers that normalize over queries (refused in decoders)."""
    return tuple(n for n, cls in sorted(NORMALIZERS.items()) if cls.over_queries)


def known_keys() -> set[str]:
    """Every option and input name of every registered scheme."""
    keys: set[str] = set()
    for cls in (*NORMALIZERS.values(), *TRANSFORMS.values(), *HEAD_SCHEMES.values()):
        keys |= set(option_names(cls.Options))
        keys |= set(getattr(cls, "input_names", ()))
    return keys


# the attributes through which wrappers (FSDP units, activation checkpointing) hold a module
WRAPPERS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def module_name(name: str) -> str:
    """A submodule's name as the unwrapped model has it (`net.layers.0.self_attn` under FSDP
    too), so that what a run reports is keyed alike on every strategy."""
    for wrapper in WRAPPERS:
        name = name.replace(wrapper, "")
    return name


def named_scheme_modules(model: nn.Module) -> Iterator[tuple[str, SchemeModule]]:
    """(name, module) of every scheme module inside `model`: normalizers, transforms, head
    schemes and output gates."""
    for name, module in model.named_modules():
        if isinstance(module, SchemeModule):
            yield module_name(name), module


def scheme_parameters(model: nn.Module, kind: type | None = Normalizer) -> list[tuple[str, nn.Parameter]]:
    """Every parameter inside the scheme modules of type `kind` (Normalizer: HNAS's u logits;
    LogitTransform: CODA's head MLPs too; None: every scheme module, output gates included), with
    their full names, found by type rather than by name (weight loaders: what BERT lacks). The
    optimizer's rule reads each module's own `scheme_parameters()` instead."""
    out = []
    for prefix, module in named_scheme_modules(model):
        if kind is None or isinstance(module, kind):
            out += [(f"{prefix}.{n}" if prefix else n, p) for n, p in module.named_parameters()]
    return out


def scheme_values(model: nn.Module) -> dict[str, dict[str, Tensor]]:
    """What the scheme modules inside `model` report (`SchemeModule.reported`):
    {"<scheme>_<name>": {attention module name: values per head (H,)}}, e.g.
    {"hnas_u": {"encoder.layers.0.self_attn": tensor([0.5, ...])}}, layers in model order; every
    kind alike: normalizers (`hnas_u`), transforms, head schemes (`diff_lambda`) and output gates
    (`gate_mean`, `gate_closed`). The one place that gathers them (run summary, metrics.json's
    `scheme_params`, the SchemeParameters callback and its plots)."""
    out: dict[str, dict[str, Tensor]] = {}
    for name, module in named_scheme_modules(model):
        for key, values in module.reported().items():
            out.setdefault(f"{module.name}_{key}", {})[name.rpartition(".")[0]] = values
    return out


def reported_label(key: str) -> str:
    """How a plot labels the reported quantity `<scheme>_<name>`: what its scheme says it is
    (`reported_labels`), else "<scheme> <name>" (the output gate's: "gate mean"). A scheme's name
    may hold "_" itself (`talking_heads_self_weight`): the longest registered name before one."""
    owners = {n: cls for t in (NORMALIZERS, TRANSFORMS, HEAD_SCHEMES) for n, cls in t.items()}
    # the names the key starts with are prefixes of one another: the greatest is the longest
    scheme = max((n for n in owners if key.startswith(f"{n}_")), default=key.partition("_")[0])
    name = key[len(scheme) + 1:]
    return getattr(owners.get(scheme), "reported_labels", {}).get(name, f"{scheme} {name}")

