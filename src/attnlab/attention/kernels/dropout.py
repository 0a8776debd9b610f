"""Counter-based attention dropout shared by the fused kernels (C++ on the CPU, Triton on CUDA).

One keep mask on the mixed attention weights, scaled by 1/(1-p), exactly as `reference.py`
drops them (`F.dropout` of the weights). The mask is never stored: element (i, j) of head
(b, h) is kept iff

    mix(mix(mix(row ^ seed_lo) + seed_hi) + j * 0x9E3779B9) >> 1  >=  floor(p * 2**31),
    row = (b * H + h) * S_q + i,

with `mix` the "lowbias32" integer hash (a bijection of 32-bit words, every output bit
depending on every input bit) and (seed_lo, seed_hi) the low and high 31 bits of a 62-bit seed
drawn from torch's generator per call and saved for the backward, which regenerates the same
mask. (31-bit halves and threshold: Triton then passes them as int32 whatever their values.)
`keep_mask` here is the same function in torch, for tests and for checking the kernels.

The exception: UNAS on CUDA runs on SDPA (flash / memory-efficient), which drops weights with
its own Philox generator (torch's CUDA generator), not with this mask. There the same seed does
not drop the same weights as on the other paths (the rate and the 1/(1-p) scaling are the same);
DNAS / HNAS on CUDA (Triton) and every CPU path do use this mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def draw_seed_tensor() -> Tensor:
    """A 62-bit seed from torch's default (CPU) generator, as a 0-d int64 CPU tensor: the Triton
    ops take it so, and read it inside the op (no `.item()` where torch.compile traces)."""
    return torch.randint(0, 2**62, (), dtype=torch.int64)


def draw_seed() -> int:
    """A 62-bit seed from torch's default generator (reproducible under torch.manual_seed);
    the same draw as `draw_seed_tensor`."""
    return int(draw_seed_tensor().item())


def _mul32(x: Tensor, c: int) -> Tensor:
    """x * c mod 2**32 for int64 tensors of 32-bit words, without int64 overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _MASK32


def mix32(x: Tensor) -> Tensor:
    """lowbias32 on int64 tensors holding 32-bit words (the C++/Triton `mix32`)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def threshold(p: float) -> int:
    """Elements whose hash / 2 is below this are dropped (p < 1, so it fits 31 bits)."""
    return int(p * 2**31)


def seed_halves(seed: int) -> tuple[int, int]:
    """The low and high 31 bits of a 62-bit seed (what the kernels take)."""
    return seed & 0x7FFFFFFF, (seed >> 31) & 0x7FFFFFFF


def keep_mask(seed: int, shape: tuple[int, int, int, int], p: float,
              device: torch.device | str = "cpu") -> Tensor:
    """The bool (B, H, S_q, S_k) keep mask that the kernels generate for `seed` (True = kept)."""
    B, H, M, N = shape
    seed_lo, seed_hi = seed_halves(seed)
    rows = torch.arange(B * H * M, dtype=torch.int64, device=device)
    key = (mix32(rows ^ seed_lo) + seed_hi) & _MASK32
    key = mix32(key)
    cols = _mul32(torch.arange(N, dtype=torch.int64, device=device), _GOLDEN)
    h = mix32((key[:, None] + cols[None, :]) & _MASK32)
    return ((h >> 1) >= threshold(p)).view(B, H, M, N)
