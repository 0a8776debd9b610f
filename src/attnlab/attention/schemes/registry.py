"""The registry: scheme name -> class, for normalizers and logit transforms alike.

`@register` on a subclass of `Normalizer` or `LogitTransform` makes it a `model=` choice (with a
`conf/model/<name>.yaml`) and a `scheme=` of `attend`. Names are unique across both kinds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from torch import nn

from attnlab.attention.schemes.base import LogitTransform, Normalizer, option_names
from attnlab.errors import ConfigError

NORMALIZERS: dict[str, type[Normalizer]] = {}
TRANSFORMS: dict[str, type[LogitTransform]] = {}

T = TypeVar("T", bound=type)


def register(cls: T) -> T:
    """Class decorator: register a scheme under `cls.name` (re-registering a name replaces it)."""
    name = getattr(cls, "name", "")
    if not name or name != name.lower() or not name.replace("_", "").isalnum():
        raise ValueError(f"{cls.__name__}.name must be a lower-case identifier, got {name!r}")
    if issubclass(cls, Normalizer):
        table, other = NORMALIZERS, TRANSFORMS
    elif issubclass(cls, LogitTransform):
        table, other = TRANSFORMS, NORMALIZERS
    else:
        raise TypeError(f"{cls.__name__} is neither a Normalizer nor a LogitTransform")
    if name in other:
        raise ValueError(f"scheme name {name!r} is taken by {other[name].__name__}")
    table[name] = cls
    return cls


def unregister(name: str) -> None:
    NORMALIZERS.pop(name, None)
    TRANSFORMS.pop(name, None)


def names() -> list[str]:
    return sorted(NORMALIZERS) + sorted(TRANSFORMS)


def normalizer_class(name: str) -> type[Normalizer]:
    name = str(name).lower()
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
    for cls in (*NORMALIZERS.values(), *TRANSFORMS.values()):
        keys |= set(option_names(cls.Options))
        keys |= set(getattr(cls, "input_names", ()))
    return keys


def named_scheme_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) of every normalizer and transform inside `model`."""
    for name, module in model.named_modules():
        if isinstance(module, (Normalizer, LogitTransform)):
            yield name, module


def scheme_parameters(model: nn.Module, kind: type = Normalizer) -> list[tuple[str, nn.Parameter]]:
    """Parameters owned by schemes of type `kind` (Normalizer: HNAS's u logits; LogitTransform:
    CODA's head MLPs), with their full names, found by type rather than by name."""
    out = []
    for prefix, module in named_scheme_modules(model):
        if isinstance(module, kind):
            out += [(f"{prefix}.{n}" if prefix else n, p) for n, p in module.named_parameters()]
    return out
