"""Positions that act inside attention, on the split heads: RoPE and ALiBi (`AttentionPositions`,
built by `MultiHeadAttention(positions=...)`). Both change only q and k, so every scheme and
every fast path serves them unchanged (no kernel knows about positions).

RoPE (Su et al. 2021), the GPT-NeoX / Llama "rotate half" convention: feature f and feature
f + d/2 of a head form a pair, rotated by the angle p * base^(-2f/d) at position p (base 10000,
the whole head dim). q_i . k_j then depends on i - j only. `rope` is the function.

ALiBi (Press et al. 2022, "Train Short, Test Long"): head h adds -m_h (i - j) to the logit of
query i and key j <= i, with the paper's slopes (`alibi_slopes`). Here the bias is carried by q
and k themselves, so that q'.k' / sqrt(d') = q.k / sqrt(d) - m_h (i - j) with d' = d + 6:

    q' = [q sqrt(d'/d), C_h, -P(i)]      k' = [k, P(j), C_h]      C_h . P(n) = c_h n

with c_h = sqrt(d') m_h (in the input's dtype), P(n) = [8 a, 8 a, b / 8] for n = 256 a + b (a, b
integers < 256) and C_h = [16 c_h, 16 c_h, 8 c_h]. The split keeps every position feature an
integer of 8 bits times a power of 2: exact in bfloat16, float16 and TF32, so that in those each
product c_h * a is exact in the kernels' float32 accumulators. The bias is then as precise in
bf16 as in fp32 (no call needs to leave its dtype): only c_h rounds to the input's precision (in
bf16 a relative 2^-8: a slope off by at most 0.4 %, the same at every distance), never the
positions. What remains is the float32 accumulation of c_h i and c_h j, which cancel:
|error of a logit| <~ 2^-22 m_h S at S positions (tested at S = 4096, float32 and bf16 features,
against a float64 additive bias). The powers of 2 and the repeated 8 a (16 c_h twice rather than
32 c_h once) balance q's and k's largest entries (<= 128 at 4096 positions, d = 64). The kernels
see q and k of d + 6 over a value of d: ATen's flash kernel takes one head size, so on the CPU
UNAS and SSMax run on the row-wise C++ kernel's softmax, which takes any value width (and every
other causal scheme's CPU kernel does too: tested at S = 4096, 12 heads, d = 64 and 128; none
falls to S x S). On CUDA, SDPA picks a kernel that takes the widths, or its math kernel (not
measured here). Positions stop at 65,536.
Every scheme sees the bias as part of its logits (SSMax scales it with the row, sigmoid adds
its b, stick-breaking breaks the stick on it, a CODA / RealFormer cascade carries it on).

A head scheme that forms several q.k products from one head's features (differential attention
v1: two halves) declares `query_key_groups`; each group then gets its own rotation or features,
as the Differential Transformer's code rotates each half.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.errors import ConfigError

# what the attention itself can do; learned and sinusoidal positions are the models' embeddings
SCHEMES = ("none", "rope", "alibi")
ROPE_BASE = 10000.0
ALIBI_FEATURES = 6  # features ALiBi adds to each q.k group
ALIBI_MAX_POSITIONS = 256 * 256  # n = 256 a + b with a, b < 256: each exact in bf16


def rope(x: Tensor, positions: Tensor, base: float = ROPE_BASE) -> Tensor:
    """x (..., S, d) rotated by `positions` (S,): features f and f + d/2 by the angle
    positions * base^(-2f/d) (GPT-NeoX rotate-half), computed in float32 (float64 stays);
    out in x's dtype."""
    d = x.shape[-1]
    if d % 2:
        raise ConfigError(f"positions=rope rotates pairs of features, but the head size is {d} "
                          f"(odd); use an even d_model / nhead")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    inverse_frequency = base ** (-torch.arange(0, d, 2, dtype=dtype, device=x.device) / d)
    angles = positions.to(dtype)[:, None] * inverse_frequency[None]  # (S, d/2)
    cos, sin = angles.cos(), angles.sin()
    first, second = x.to(dtype).chunk(2, dim=-1)
    rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return rotated.to(x.dtype)


def alibi_slopes(num_heads: int) -> list[float]:
    """The paper's head slopes m_h: for 2^k heads the geometric sequence from 2^(-8/n) with that
    ratio (8 heads: 1/2, 1/4, ..., 1/256); otherwise those of the closest power of 2 below,
    then every other slope of twice that many (the authors' get_slopes, github.com/ofirpress/
    attention_with_linear_biases, fairseq/models/transformer.py)."""
    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (h + 1) for h in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def _position_features(positions: Tensor) -> Tensor:
    """P(n) = [8 a, 8 a, b / 8] for n = 256 a + b, (S, 3): integers of 8 bits times powers of 2."""
    high = torch.div(positions, 256, rounding_mode="floor")
    return torch.stack([high * 8.0, high * 8.0, (positions - 256 * high) / 8.0], dim=-1)


class AttentionPositions:
    """The position scheme of one attention module (`scheme` in SCHEMES): `query(q, start)` and
    `key(k, start)` transform split heads (B, H, S, d) whose first position is `start`; their
    head size is `head_dim(d)`. Holds no tensors and no per-call state: the positions come with
    each call."""

    def __init__(self, scheme: str, num_heads: int, groups: int = 1) -> None:
        if scheme not in SCHEMES:
            raise ConfigError(f"positions={scheme!r} in attention; use one of {', '.join(SCHEMES)}")
        self.scheme = scheme
        self.groups = int(groups)
        self.slopes = alibi_slopes(num_heads) if scheme == "alibi" else None

    def head_dim(self, d: int) -> int:
        """The head size the scheme's kernels see."""
        return d + self.groups * ALIBI_FEATURES if self.scheme == "alibi" else d

    def query(self, q: Tensor, start: int = 0) -> Tensor:
        return self._apply(q, start, is_query=True)

    def key(self, k: Tensor, start: int = 0) -> Tensor:
        return self._apply(k, start, is_query=False)

    def _apply(self, x: Tensor, start: int, is_query: bool) -> Tensor:
        if self.scheme == "none":
            return x
        b, h, s, d = x.shape
        if self.scheme == "alibi" and start + s > ALIBI_MAX_POSITIONS:
            raise ConfigError(f"positions=alibi takes at most {ALIBI_MAX_POSITIONS} positions, "
                              f"asked for {start + s}; use shorter windows or positions=rope|none")
        positions = torch.arange(start, start + s, device=x.device)
        grouped = x.reshape(b, h, s, self.groups, d // self.groups).transpose(2, 3)  # (B,H,g,S,d_g)
        if self.scheme == "rope":
            out = rope(grouped, positions)
        else:
            out = self._alibi(grouped, positions, is_query)
        return out.transpose(2, 3).reshape(b, h, s, -1)

    def _alibi(self, x: Tensor, positions: Tensor, is_query: bool) -> Tensor:
        """[x sqrt(d'/d), C_h, -P(i)] for queries, [x, P(j), C_h] for keys (module docstring)."""
        d = x.shape[-1]
        extended = d + ALIBI_FEATURES
        # c_h in x's dtype: in bf16 the slope rounds (a relative 2^-8), the positions never do
        c = torch.tensor([math.sqrt(extended) * m for m in self.slopes], dtype=x.dtype, device=x.device)
        slope = c[:, None] * torch.tensor([16.0, 16.0, 8.0], dtype=x.dtype, device=x.device)  # (H, 3)
        slope = slope[None, :, None, None, :].expand(*x.shape[:-1], 3)
        place = _position_features(positions).to(x.dtype).expand(*x.shape[:-1], 3)
        if is_query:
            return torch.cat([x * math.sqrt(extended / d), slope, -place], dim=-1)
        return torch.cat([x, place, slope], dim=-1)
