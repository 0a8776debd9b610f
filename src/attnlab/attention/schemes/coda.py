"""CODA, cascaded head-colliding attention (Zheng et al. 2021), as a logit transform.

The logits are latent, `z^l = mu^l + eps` with `eps ~ N(0, I)` in training and `z^l = mu^l` in
evaluation, where

    mu^l = C^l + sigma^l(Z^{l-1} + C^l) [+ Z^{l-1}]      C^l = Q K^T / sqrt(d)

and `sigma^l` is a small MLP per layer across the head axis ((B, H, T, S) moved to (B, T, S, H)):
Linear(H, alpha H), LeakyReLU(0.2), Linear(alpha H, alpha H), LeakyReLU(0.2), Linear(alpha H, H)
(`alpha` default 4, `mlp_layers` hidden layers, default 2). The outer residual `+ Z^{l-1}` is what
the published code does (`prev_residual=true`, the default); `prev_residual=false` drops it. The
first layer of a stack has no previous logits: `mu^1 = C^1` (with the noise off, exactly the
normalization on plain scores). `cascade=false` is the paper's `coda_cs` ablation: noise, no
cascade, no MLP. The weights come from the spec's normalization (unas by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.attention.schemes.registry import register
from attnlab.attention.schemes.transform import LogitTransform
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class CodaOptions:
    cascade: bool = True  # pass the logits on to the next layer of the stack (false: coda_cs)
    noise: bool = True  # training: z = mu + N(0, I)
    alpha: int = 4  # the head MLP is alpha * H wide
    mlp_layers: int = 2  # hidden layers of the head MLP
    prev_residual: bool = True  # mu = C + sigma(Z_prev + C) + Z_prev (published code)

    def __post_init__(self) -> None:
        for key in ("alpha", "mlp_layers"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)} must be an integer >= 1")


class HeadMixer(nn.Module):
    """CODA's sigma^l: an MLP over the head axis at every (query, key) position."""

    def __init__(self, num_heads: int, alpha: int = 4, hidden_layers: int = 2) -> None:
        super().__init__()
        dims = [num_heads] + [alpha * num_heads] * hidden_layers + [num_heads]
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                layers.append(nn.LeakyReLU(0.2))
        self.net = nn.Sequential(*layers)
        for m in self.net:  # the published initialization (tasks may re-initialize their Linears)
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight, gain=1 / math.sqrt(2))
                nn.init.zeros_(m.bias)

    def forward(self, logits: Tensor) -> Tensor:
        """(B, H, T, S) -> (B, H, T, S)."""
        weight = self.net[0].weight
        out = self.net(logits.movedim(1, -1).to(weight.dtype))
        return out.movedim(-1, 1).to(logits.dtype)


@register
class Coda(LogitTransform):
    name = "coda"
    Options = CodaOptions
    # the head MLP mixes the heads of one (query, key) pair; the noise is off in eval
    row_wise = True

    def __init__(self, options: CodaOptions | None = None, num_heads: int = 1,
                 receives_logits: bool = False) -> None:
        super().__init__(options, num_heads, receives_logits)
        # sigma^l exists from the second layer of a stack on (the first has no Z^{l-1})
        if self.receives_logits:
            self.mixer = HeadMixer(num_heads, self.options.alpha, self.options.mlp_layers)

    @property
    def passes_logits(self) -> bool:
        return self.options.cascade

    def forward(self, scores: Tensor, previous: Tensor | None) -> Tensor:
        z = scores
        if previous is not None:
            mixed = self.mixer(scores + previous)
            z = scores + mixed + previous if self.options.prev_residual else scores + mixed
        if self.options.noise and self.training:
            z = z + torch.randn_like(z)
        return z
