"""RealFormer (He et al. 2020), CODA's deterministic ablation: residual attention logits,
`z^l = C^l + z^{l-1}` within a stack, no parameters. The weights come from the spec's
normalization (unas by default)."""

from torch import Tensor

from attnlab.attention.schemes.registry import register
from attnlab.attention.schemes.transform import LogitTransform


@register
class RealFormer(LogitTransform):
    name = "realformer"
    row_wise = True  # z_ij = C_ij + z_prev_ij

    def forward(self, scores: Tensor, previous: Tensor | None) -> Tensor:
        return scores if previous is None else scores + previous
