"""The registry's tables (name -> class) and what is read from them alone: a leaf, so that
base.py's messages can name the schemes that fit (registry.py imports base.py, which must not
import it back). `registry` fills the tables and re-exports them."""

from __future__ import annotations

NORMALIZERS: dict[str, type] = {}  # Normalizer subclasses
TRANSFORMS: dict[str, type] = {}  # LogitTransform subclasses
# schemes that compute the heads' outputs themselves (diff), with the spec's normalizer
HEAD_SCHEMES: dict[str, type] = {}


def names() -> list[str]:
    return sorted(NORMALIZERS) + sorted(TRANSFORMS) + sorted(HEAD_SCHEMES)


def fitting(causal: bool) -> list[str]:
    """Names of the schemes that run in causal attention (causal=True: none that normalizes
    over queries) or in attention that is not causal (causal=False: none that is causal-only),
    transforms included (they take any normalization that fits; a causal-only one, selective
    attention, only causal attention)."""
    bad = "over_queries" if causal else "causal_only"
    tables = (NORMALIZERS, TRANSFORMS, HEAD_SCHEMES)
    return [n for n in names() if not getattr(next(t[n] for t in tables if n in t), bad, False)]
