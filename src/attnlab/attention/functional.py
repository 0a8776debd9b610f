"""The public functional API: `attend` (fused, never S x S for unas/dnas/hnas) and
`attention_weights` (materialized, for analysis and tests).

Which implementation `attend` runs is decided in `kernels/__init__.py` (`kernels.route`): per
scheme, device, dtype and options, a fast path (ATen / SDPA flash for unas, the fused C++ kernel
on the CPU and the Triton kernels on CUDA for dnas / hnas, attention dropout included), or the
exact materialized reference (`reference.py`) where none serves (sinkhorn with n_iter > 1, ...).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.attention import kernels, reference
from attnlab.attention.spec import QUERY_NORMALIZED, SCHEMES
from attnlab.errors import ConfigError


def check_causal(scheme: str, causal: bool) -> None:
    if causal and scheme in QUERY_NORMALIZED:
        raise ConfigError(
            f"causal attention with scheme={scheme!r} is not allowed: {scheme} normalizes every key "
            f"column over all queries, so each position's weights depend on future positions "
            f"(it leaks the future and breaks step-by-step decoding). Decoders must use "
            f"scheme='unas' (use model=unas for decoder attention; tasks keep their decoder UNAS)."
        )


def _check_mask(mask: Tensor | None, name: str, batch: int, length: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ConfigError(
            f"{name} must be a bool tensor (True = padding), got {got}; "
            f"pass e.g. `token_ids == pad_id`"
        )
    if tuple(mask.shape) != (batch, length):
        raise ConfigError(
            f"{name} has shape {tuple(mask.shape)} but the attention inputs need (B, S) = "
            f"{(batch, length)} (True = padding)"
        )


def validate(
    q: Tensor,
    k: Tensor,
    v: Tensor | None,
    scheme: str,
    key_padding_mask: Tensor | None,
    query_padding_mask: Tensor | None,
    u: Tensor | float | None,
    n_iter: int,
    causal: bool,
) -> None:
    """One clear error per kind of bad input (shapes, masks, scheme options, causal guard)."""
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown attention scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    tensors = {"q": q, "k": k} if v is None else {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if t.dim() != 4:
            raise ConfigError(
                f"{name} must be 4-D (B, H, S, d), got shape {tuple(t.shape)}; "
                f"split heads before calling attend"
            )
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ConfigError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must share B, H and head size d"
        )
    if v is not None and (v.shape[:2] != k.shape[:2] or v.shape[-2] != k.shape[-2]):
        raise ConfigError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} in B, H and S_k")
    batch = q.shape[0]
    _check_mask(key_padding_mask, "key_padding_mask", batch, k.shape[-2])
    _check_mask(query_padding_mask, "query_padding_mask", batch, q.shape[-2])
    if scheme == "hnas" and u is None:
        raise ConfigError("scheme='hnas' needs u (the weight of DNAS, broadcastable to (B, H, 1, 1))")
    if scheme == "sinkhorn" and int(n_iter) < 1:
        raise ConfigError(f"n_iter={n_iter} must be >= 1 (1 equals dnas)")
    check_causal(scheme, causal)


def _as_u(u: Tensor | float | None, like: Tensor) -> Tensor | None:
    if u is None:
        return None
    u = torch.as_tensor(u, device=like.device)
    return u if u.is_floating_point() else u.float()


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scheme: str = "unas",
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    u: Tensor | float | None = None,
    n_iter: int = 1,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention output (B, H, S_q, d_v) for `scheme`; see docs/architecture.md.

    unas/dnas/hnas (and sinkhorn with n_iter=1, which is dnas) never materialize S_q x S_k on
    the CPU and CUDA, with or without dropout; Sinkhorn with n_iter > 1 uses the materialized
    reference. `dropout_p` drops attention weights (training only; the caller passes 0 in eval).
    """
    validate(q, k, v, scheme, key_padding_mask, query_padding_mask, u, n_iter, causal)
    if scheme == "sinkhorn" and int(n_iter) == 1:
        scheme = "dnas"
    call = kernels.Call(q, k, v, scheme, key_padding_mask, query_padding_mask, _as_u(u, q),
                        int(n_iter), causal, float(dropout_p))
    return kernels.attend(call)


def attention_weights(
    q: Tensor,
    k: Tensor,
    scheme: str = "unas",
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    u: Tensor | float | None = None,
    n_iter: int = 1,
    causal: bool = False,
) -> Tensor:
    """Materialized weights (B, H, S_q, S_k), float32 (float64 for float64 input).

    Padded keys and padded queries get weight 0; valid rows sum to 1 (unless every key of the
    row is padded, then the row is 0).
    """
    validate(q, k, None, scheme, key_padding_mask, query_padding_mask, u, n_iter, causal)
    return reference.reference_weights(
        q, k, scheme, key_padding_mask, query_padding_mask, _as_u(u, q), n_iter, causal
    )
