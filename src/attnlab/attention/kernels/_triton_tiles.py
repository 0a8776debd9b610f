"""Tile-level helpers of the Triton DNAS / HNAS kernels (`_triton_kernels.py`): dropout keep
masks, padding, int64 offsets, tile loads and stores, the 1-D grid, log2 LSEs. Kept apart so the
kernel file reads as the algorithm."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP: tl.constexpr):
    """Bool (BLOCK_M, BLOCK_N) keep mask of rows offs_m, columns offs_n of head bh."""
    if HAS_KEEP:
        ptrs = KEEP + (bh.to(tl.int64) * M + offs_m[:, None]) * N + offs_n[None, :]
        inside = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        kept = tl.load(ptrs, mask=inside, other=0) != 0
    else:  # the counter is 32-bit by definition (dropout.py): B*H*S_q < 2**31, host-checked
        row = (bh * M + offs_m).to(tl.uint32)
        key = _mix32(_mix32(row ^ tl.cast(seed_lo, tl.uint32)) + tl.cast(seed_hi, tl.uint32))
        h = _mix32(key[:, None] + offs_n.to(tl.uint32)[None, :] * 0x9E3779B9)
        kept = (h >> 1) >= tl.cast(threshold, tl.uint32)
    return kept


@triton.jit
def _valid(PM, b, offs, L, HAS_PM: tl.constexpr):
    """In range and not padded (PM: uint8 (B, L), nonzero = padding)."""
    valid = offs < L
    if HAS_PM:
        pad = tl.load(PM + b.to(tl.int64) * L + offs, mask=valid, other=1)
        valid = valid & (pad == 0)
    return valid


@triton.jit
def _head(b, h, stride_b, stride_h):
    """Element offset of head (b, h): int64 (int32 products overflow once H*S*d >= 2**31)."""
    return b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def _rows(X, bh, offs, L):
    """Per-row vector of head bh (a contiguous (B*H, L) buffer): X + bh * L + offs, int64."""
    return X + bh.to(tl.int64) * L + offs


@triton.jit
def _tile(X, base, offs_r, offs_c, stride_r, R, C, CAST: tl.constexpr):
    """(rows, cols) tile of a matrix with unit column stride; zeros outside; float32 if CAST.
    base and the row offsets are int64."""
    x = tl.load(X + base + offs_r.to(tl.int64)[:, None] * stride_r + offs_c[None, :],
                mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0)
    if CAST:  # bf16 under the interpreter (no bf16 arithmetic there)
        x = x.to(tl.float32)
    return x


@triton.jit
def _store_tile(X, base, offs_r, offs_c, stride_r, R, C, x):
    """Stores x (rows, cols) as _tile reads it, in X's dtype."""
    tl.store(X + base + offs_r.to(tl.int64)[:, None] * stride_r + offs_c[None, :],
             x.to(X.dtype.element_ty), mask=(offs_r[:, None] < R) & (offs_c[None, :] < C))


@triton.jit
def _program(L, BLOCK: tl.constexpr):
    """(b * H + h, block index) of this program on the 1-D grid: blocks of one head are
    consecutive programs (they share its K / V in L2), and a 1-D grid has no 65,535 cap."""
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(L, BLOCK)
    return pid // n_blocks, pid % n_blocks


@triton.jit
def _lse2(m, l):
    """log2 sum of 2^x from an online (max m, sum l of 2^(x - m)); +inf where l = 0 (empty)."""
    return tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("inf"))


@triton.jit
def _online(x, m):
    """One step of an online softmax over the rows of x (log2 units), from the running maximum
    m: the new maximum, the factor rescaling what was summed under m, and 2^(x - new max). Rows
    with no entry yet keep the maximum -inf and get factors 2^-inf = 0, never NaN."""
    m_new = tl.maximum(m, tl.max(x, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, tl.exp2(m - m_safe), tl.exp2(x - m_safe[:, None])
