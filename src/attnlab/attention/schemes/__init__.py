"""Attention schemes, one class per file, registered by name (see base.py and registry.py).

Every module of this package but the kinds' own (`KINDS`) is a scheme and is imported here, so a
new scheme is one file in this folder (plus `conf/model/<name>.yaml`): nothing else lists it.
"""

import importlib
import pkgutil

from attnlab.attention.schemes.base import Attended, Heads, NoOptions, SchemeModule, build_options
from attnlab.attention.schemes.head_scheme import HeadScheme
from attnlab.attention.schemes.normalizer import Normalizer, apply_weights
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
    reported_label,
    scheme_parameters,
    scheme_values,
    unregister,
)
from attnlab.attention.schemes.transform import LogitTransform

# what every scheme is built on, not schemes
KINDS = ("base", "normalizer", "transform", "head_scheme", "registry", "tables")

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in KINDS:
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "HEAD_SCHEMES",
    "NORMALIZERS",
    "TRANSFORMS",
    "Attended",
    "HeadScheme",
    "Heads",
    "LogitTransform",
    "NoOptions",
    "Normalizer",
    "SchemeModule",
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
    "reported_label",
    "scheme_parameters",
    "scheme_values",
    "unregister",
]
