"""A class's constructor arguments as a config may name them (test_task_configs.py,
test_config_schema.py)."""

from __future__ import annotations

import inspect


def constructor_arguments(target) -> set[str]:
    """The named arguments of `target` (a class's __init__ or a function), and its bases' where
    it passes **kwargs on; not self, *args or **kwargs themselves."""
    names: set[str] = set()
    for owner in target.__mro__ if isinstance(target, type) else (target,):
        if isinstance(target, type) and "__init__" not in vars(owner):
            continue
        params = inspect.signature(owner.__init__ if isinstance(target, type) else owner).parameters
        names |= {n for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return names
