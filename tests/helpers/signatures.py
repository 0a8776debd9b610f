"""A class's constructor arguments as a config may name them, and the `_target_` nodes of a config
(test_task_configs.py, test_config_homes.py, test_config_schema.py)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf


def constructor_parameters(target) -> dict[str, inspect.Parameter]:
    """The named parameters of `target` (a class's __init__ or a function), and its bases' where
    it passes **kwargs on (the first that names one wins); not self, *args or **kwargs
    themselves."""
    found: dict[str, inspect.Parameter] = {}
    for owner in target.__mro__ if isinstance(target, type) else (target,):
        if isinstance(target, type) and "__init__" not in vars(owner):
            continue
        params = inspect.signature(owner.__init__ if isinstance(target, type) else owner).parameters
        for name, p in params.items():
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                found.setdefault(name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return found


def constructor_arguments(target) -> set[str]:
    """The names of `constructor_parameters(target)`."""
    return set(constructor_parameters(target))


def target_nodes(node, key: str = "task") -> Iterator[tuple[str, DictConfig]]:
    """(key, node) of every `_target_` node under `node` (interpolations not followed)."""
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield key, node
        for name in node:
            if not OmegaConf.is_interpolation(node, name):
                yield from target_nodes(node.get(name), f"{key}.{name}")
