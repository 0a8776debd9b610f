"""The Triton DNAS / HNAS backward with dQ summed by atomics: 6 (HNAS 7) products per score
instead of the deterministic kernels' 8 (`_triton_kernels.py`: `_backward_kv`, `_backward_q`).

It runs unless torch's deterministic algorithms are on (`torch.use_deterministic_algorithms`,
Lightning's `trainer.deterministic`), as flash attention's backward does: float atomics add the
key blocks' dQ terms in whatever order the programs finish, so the last bits of dQ differ from
run to run (triton_query_normalized.backward chooses). Both kernels own key blocks and loop over
every query block; notation as in `_triton_kernels.py`.

- `_backward_dv_dc` (2 products, HNAS 3: s, then the values' products): dV, and the column
  sums dc_j = -u sum_i Pd_ij (dP~_ij - D_i), without dP: sum_i Pd_ij dP~_ij = v_j . A_j with
  A = Pd~^T dO (dropped DNAS weights), which for DNAS is dV itself, so that dc_j = -u (v_j . A_j
  - sum_i Pd_ij D_i). HNAS forms A and B = Pu~^T dO, dV = u A + (1 - u) B.
- `_backward_dk_dq` (4 products: s, dP, dS~^T Q, dS~ K): with every dc_j known, the complete
  score gradient dS~ = dS + dc xi serves dK (summed in the program) and dQ (added to a float32
  buffer by atomics, one add per (query, d) element and key block).

The identity trades the per-score fp32 difference Pd (dP~ - D) for a bf16 product (Pd is
rounded to the values' dtype in A, as in dV): a relative error of order 2^-9 in each term of
dc's first sum; the gradient tests compare both backwards with float64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnlab.attention.kernels._triton_configs import tuned
from attnlab.attention.kernels._triton_kernels import (
    _PER_CALL,
    LOG2E,
    _dnas_weights,
    _key_block,
    _row_stats,
    _score_grads,
    _unas_weights,
)
from attnlab.attention.kernels._triton_tiles import (
    _head,
    _keep,
    _rows,
    _store_tile,
    _tile,
    _valid,
)


@triton.jit(do_not_specialize=_PER_CALL)
def _backward_dv_dc(Q, K, V, G, C, U, CREF, KPM, QPM, KEEP, LSE_D, LSE_U, DELTA_D, DELTA_U,
                    DV_, DC, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sgb, sgh, sgm,
                    H, M, N, D, DV, scale, seed_lo, seed_hi, threshold, inv_keep, TUNE_M, TUNE_N,
                    HYBRID: tl.constexpr, HAS_KPM: tl.constexpr, HAS_QPM: tl.constexpr,
                    DROPOUT: tl.constexpr, HAS_KEEP: tl.constexpr, CAST: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    bh, b, h, offs_n, offs_d, offs_dv, k, v, c, valid_k, u, cref, fold, bk = _key_block(
        K, V, C, U, CREF, KPM, skb, skh, skn, svb, svh, svn, H, N, D, DV, HYBRID, HAS_KPM, CAST,
        BLOCK_N, BLOCK_D, BLOCK_DV)
    qk_scale = scale * LOG2E
    q_head, g_head = _head(b, h, sqb, sqh), _head(b, h, sgb, sgh)
    acc_a = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)  # sum_i Pd~_ij dO_i
    acc_b = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)  # sum_i Pu~_ij dO_i (HNAS)
    weighted_delta = tl.zeros([BLOCK_N], tl.float32)  # sum_i Pd_ij D_i
    for start in range(0, M, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        q = _tile(Q, q_head, offs_m, offs_d, sqm, M, D, CAST)
        g = _tile(G, g_head, offs_m, offs_dv, sgm, M, DV, CAST)
        rd, ru, dd, _, _, a = _row_stats(LSE_D, DELTA_D, LSE_U, DELTA_U, cref, fold, bh, offs_m, M,
                                         HYBRID)
        valid = _valid(QPM, b, offs_m, M, HAS_QPM)[:, None] & valid_k[None, :]
        s, pd = _dnas_weights(q, k, c, rd, valid, qk_scale, PRECISION)
        weighted_delta += tl.sum(pd * dd[:, None], 0)
        pd_kept = pd
        kept = valid
        if DROPOUT:
            kept = _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP)
            pd_kept = tl.where(kept, pd * inv_keep, 0.0)
        acc_a += tl.dot(tl.trans(pd_kept).to(g.dtype), g, input_precision=PRECISION)
        if HYBRID:
            pu = _unas_weights(s, pd, a, bk, ru, fold, valid)
            if DROPOUT:
                pu = tl.where(kept, pu * inv_keep, 0.0)
            acc_b += tl.dot(tl.trans(pu).to(g.dtype), g, input_precision=PRECISION)
    dc = -u * (tl.sum(v.to(tl.float32) * acc_a, 1) - weighted_delta)
    dv = acc_a
    if HYBRID:
        dv = u * acc_a + (1.0 - u) * acc_b
    tl.store(_rows(DC, bh, offs_n, N), dc, mask=offs_n < N)
    _store_tile(DV_, bh.to(tl.int64) * N * DV, offs_n, offs_dv, DV, N, DV, dv)


@triton.jit(do_not_specialize=_PER_CALL)
def _backward_dk_dq(Q, K, V, G, C, DC, U, CREF, KPM, QPM, KEEP, LSE_D, LSE_U, DELTA_D, DELTA_U,
                    DK, DQ, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sgb, sgh, sgm,
                    H, M, N, D, DV, scale, seed_lo, seed_hi, threshold, inv_keep, TUNE_M, TUNE_N,
                    HYBRID: tl.constexpr, HAS_KPM: tl.constexpr, HAS_QPM: tl.constexpr,
                    DROPOUT: tl.constexpr, HAS_KEEP: tl.constexpr, CAST: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    bh, b, h, offs_n, offs_d, offs_dv, k, v, c, valid_k, u, cref, fold, bk = _key_block(
        K, V, C, U, CREF, KPM, skb, skh, skn, svb, svh, svn, H, N, D, DV, HYBRID, HAS_KPM, CAST,
        BLOCK_N, BLOCK_D, BLOCK_DV)
    qk_scale = scale * LOG2E
    q_head, g_head = _head(b, h, sqb, sqh), _head(b, h, sgb, sgh)
    dq_head = bh.to(tl.int64) * M * D  # DQ: contiguous float32 (B, H, S_q, d)
    dc = tl.load(_rows(DC, bh, offs_n, N), mask=offs_n < N, other=0.0)
    acc_dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, M, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        q = _tile(Q, q_head, offs_m, offs_d, sqm, M, D, CAST)
        g = _tile(G, g_head, offs_m, offs_dv, sgm, M, DV, CAST)
        rd, ru, dd, du, e, a = _row_stats(LSE_D, DELTA_D, LSE_U, DELTA_U, cref, fold, bh, offs_m, M,
                                          HYBRID)
        valid = _valid(QPM, b, offs_m, M, HAS_QPM)[:, None] & valid_k[None, :]
        kept = valid
        if DROPOUT:
            kept = _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP)
        xi, _, _, ds = _score_grads(q, k, g, v, c, bk, rd, ru, dd, du, e, a, u, fold, valid,
                                    kept, qk_scale, inv_keep, HYBRID, DROPOUT, PRECISION)
        ds = ds + dc[None, :] * xi
        acc_dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
        dq = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION) * scale
        tl.atomic_add(DQ + dq_head + offs_m.to(tl.int64)[:, None] * D + offs_d[None, :], dq,
                      mask=(offs_m[:, None] < M) & (offs_d[None, :] < D), sem="relaxed")
    _store_tile(DK, bh.to(tl.int64) * N * D, offs_n, offs_d, D, N, D, scale * acc_dk)


backward_dv_dc = tuned("backward_dv_dc", _backward_dv_dc)
backward_dk_dq = tuned("backward_dk_dq", _backward_dk_dq)
