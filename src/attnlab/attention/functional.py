"""The public functional API, string in: `attend` (fast paths, never S x S where one serves),
`attention_weights` (materialized, for analysis and tests), `reference_attend` (the exact
materialized computation, for tests and benchmarks), `route` (the kernel `attend` runs for given
arguments) and `candidates` (the kernels that serve a kind of call).

`scheme` names a registered normalizer (attention/schemes/); `**scheme_args` are its options
(e.g. `n_iter=5` for sinkhorn, `alpha=2` for entmax) and inputs (`u` for hnas). Arguments that only
other registered schemes take are ignored, so one call pattern serves every scheme; unknown ones
are an error. Which path `attend` runs is the scheme's own choice (its `fast_paths`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.attention.schemes import Normalizer, build_options, known_keys, normalizer_class
from attnlab.attention.schemes.base import option_names
from attnlab.errors import ConfigError


def normalizer(scheme: str, **scheme_args: Any) -> tuple[Normalizer, dict[str, Any]]:
    """The registered normalizer `scheme` built with its options from `scheme_args`, and the
    inputs it takes from them (e.g. {"u": ...})."""
    cls = normalizer_class(scheme)
    unknown = sorted(set(scheme_args) - known_keys())
    if unknown:
        raise ConfigError(f"attention scheme {scheme!r} got unknown argument(s) {', '.join(unknown)}; "
                          f"its options are {', '.join(option_names(cls.Options)) or 'none'} and its "
                          f"inputs {', '.join(cls.input_names) or 'none'}")
    options = {k: v for k, v in scheme_args.items() if k in option_names(cls.Options)}
    inputs = {k: v for k, v in scheme_args.items() if k in cls.input_names and v is not None}
    return cls(build_options(cls.name, cls.Options, options)), inputs


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: str = "unas",
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    **scheme_args: Any,
) -> Tensor:
    """Attention output (B, H, S_q, d_v) for `scheme`; see docs/architecture.md.

    q (B, H, S_q, d), k (B, H, S_k, d), v (B, H, S_k, d_v); masks bool (B, S), True = padding.
    `dropout_p` drops attention weights (training only; callers pass 0 in eval).
    """
    norm, inputs = normalizer(scheme, **scheme_args)
    return norm.attend(q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p, **inputs)


def reference_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: str = "unas",
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    **scheme_args: Any,
) -> Tensor:
    """`attend` on the scheme's materialized reference, whatever fast paths it has."""
    norm, inputs = normalizer(scheme, **scheme_args)
    call = norm.call(q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p, **inputs)
    return norm.reference(call)


def route(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: str = "unas",
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    **scheme_args: Any,
) -> str:
    """The name of the kernel `attend` runs for exactly these arguments (the scheme's first fast
    path that accepts the call, e.g. "fused_cpu"), or "reference"."""
    norm, inputs = normalizer(scheme, **scheme_args)
    return norm.route(norm.call(q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p,
                                **inputs))


def candidates(scheme: str, device: str, dtype: torch.dtype, dropout_p: float = 0.0,
               causal: bool = False, **scheme_args: Any) -> list[str]:
    """The fast paths that serve such calls on `device` in `dtype` (some only for some masks or
    shapes: `route` says which runs), in the scheme's order, then "reference" (e.g.
    candidates("hnas", "cuda", torch.bfloat16, 0.1) -> ["triton", "reference"])."""
    norm, _ = normalizer(scheme, **scheme_args)
    return norm.candidates(device, dtype, dropout_p, causal)


def attention_weights(
    q: Tensor,
    k: Tensor,
    scheme: str = "unas",
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    causal: bool = False,
    **scheme_args: Any,
) -> Tensor:
    """Materialized weights (B, H, S_q, S_k), float32 (float64 for float64 input).

    Padded keys and padded queries get weight 0; valid rows sum to 1 (unless every key of the
    row is padded, then the row is 0).
    """
    norm, inputs = normalizer(scheme, **scheme_args)
    return norm.attention_weights(q, k, key_padding_mask, query_padding_mask, causal, **inputs)
