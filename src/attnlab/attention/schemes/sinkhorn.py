"""Sinkhorn attention: `n_iter` alternating normalizations, over queries first (seed paper,
Sec. 3.2). `n_iter=1` is DNAS (and runs on DNAS's kernels); it converges to a doubly stochastic
matrix. More iterations run on the materialized reference."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnlab.attention import paths
from attnlab.attention.reference import sinkhorn_log_weights
from attnlab.attention.schemes.base import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class SinkhornOptions:
    n_iter: int = 5  # alternating normalizations (1 equals dnas)

    def __post_init__(self) -> None:
        if self.n_iter < 1:
            raise ConfigError(f"model.n_iter={self.n_iter} must be >= 1 (1 equals dnas)")


def _one_iteration_only(path):
    """DNAS's kernel serves Sinkhorn when it is one iteration, i.e. DNAS."""

    def run(normalizer, call):
        return path(normalizer, call) if normalizer.options.n_iter == 1 else None

    run.__name__ = f"{path.__name__}_when_n_iter_is_1"
    return run


@register
class Sinkhorn(Normalizer):
    name = "sinkhorn"
    over_queries = True
    Options = SinkhornOptions
    fast_paths = (_one_iteration_only(paths.query_normalized_cpu_fused),
                  _one_iteration_only(paths.query_normalized_cpu_composed))

    def weights(self, logits: Tensor) -> Tensor:
        return sinkhorn_log_weights(logits, self.options.n_iter).exp()
