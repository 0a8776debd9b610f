"""Attention schemes, one class per file, registered by name (see base.py and registry.py).

Every module of this package is imported here, so a new scheme is one file in this folder (plus
`conf/model/<name>.yaml`): nothing else has to list it.
"""

import importlib
import pkgutil

from attnlab.attention.schemes.base import (
    HeadScheme,
    LogitTransform,
    NoOptions,
    Normalizer,
    apply_weights,
    build_options,
)
from attnlab.attention.schemes.registry import (
    HEAD_SCHEMES,
    NORMALIZERS,
    TRANSFORMS,
    fitting,
    known_keys,
    module_name,
    named_scheme_modules,
    names,
    normalizer_class,
    query_normalized,
    register,
    scheme_parameters,
    scheme_values,
    unregister,
)

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("base", "registry", "tables"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "HEAD_SCHEMES",
    "NORMALIZERS",
    "TRANSFORMS",
    "HeadScheme",
    "LogitTransform",
    "NoOptions",
    "Normalizer",
    "apply_weights",
    "build_options",
    "fitting",
    "known_keys",
    "module_name",
    "named_scheme_modules",
    "names",
    "normalizer_class",
    "query_normalized",
    "register",
    "scheme_parameters",
    "scheme_values",
    "unregister",
]
