"""Sinkhorn attention: `n_iter` alternating normalizations, over queries first (seed paper,
Sec. 3.2). `n_iter=1` is DNAS (and runs on DNAS's kernels); it converges to a doubly stochastic
matrix. More iterations run on FlexAttention on CUDA (2 n_iter passes, never S x S), elsewhere
on the materialized reference."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnlab.attention.reference import sinkhorn_log_weights
from attnlab.attention.schemes.dnas import QUERY_NORMALIZED_PATHS
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class SinkhornOptions:
    n_iter: int = 5  # alternating normalizations (1 equals dnas)

    def __post_init__(self) -> None:
        if self.n_iter < 1:
            raise ConfigError(f"model.n_iter={self.n_iter} must be >= 1 (1 equals dnas)")


def _one_round(normalizer) -> bool:
    return normalizer.options.n_iter == 1


# one round is DNAS: DNAS's kernels serve it; FlexAttention serves any number of rounds
PATHS = tuple(p if p.name == "flex" else p.when(_one_round) for p in QUERY_NORMALIZED_PATHS)


@register
class Sinkhorn(Normalizer):
    name = "sinkhorn"
    over_queries = True
    Options = SinkhornOptions
    fast_paths = PATHS

    def weights(self, logits: Tensor) -> Tensor:
        return sinkhorn_log_weights(logits, self.options.n_iter).exp()
