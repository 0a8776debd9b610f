"""UNAS: standard attention, softmax over keys (upper-normalized). Vaswani et al. 2017."""

from torch import Tensor

from attnlab.attention import paths
from attnlab.attention.reference import safe_log_normalize
from attnlab.attention.schemes.base import Normalizer
from attnlab.attention.schemes.registry import register


@register
class UNAS(Normalizer):
    name = "unas"
    fast_paths = paths.UNAS_PATHS

    def weights(self, logits: Tensor) -> Tensor:
        return safe_log_normalize(logits, dim=-1).exp()
