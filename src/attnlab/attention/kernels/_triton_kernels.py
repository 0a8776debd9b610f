"""Triton kernels of DNAS / HNAS attention (imported on first use only: triton is optional).

Notation and math as in csrc/query_normalized.cpp: s = scale q k^T, c_j = logsumexp_i s_ij over
valid queries, t = s - c, Pd = softmax_j(t), Pu = softmax_j(s), W = u Pd + (1 - u) Pu (DNAS: u = 1),
out = (W * keep / (1 - p)) v. Every kernel takes one block of rows (queries or keys) of one
(b, h) and loops over the blocks of the other side with masked loads, so lengths need not be
block multiples and nothing S_q x S_k is ever stored:

- `_column_lse`: key blocks over query blocks, online max / sum: c_j.
- `_forward`: query blocks over key blocks, online softmax of t (and for HNAS of s, in the same
  sweep over QK^T: two accumulators), the per-key bias -c_j; writes out and the row LSEs.
- `_backward_kv`: key blocks over query blocks: dV, dc_j = -sum_i dT_ij (dT: the u-weighted DNAS
  score gradient), and dK = scale (sum_i dS_ij q_i + dc_j sum_i xi_ij q_i), xi = exp(t), with
  dP = dO V^T computed once for both branches. No atomics: each program owns its keys.
- `_backward_q`: query blocks over key blocks: dQ = scale sum_j (dS_ij + dc_j xi_ij) k_j.

Grids are 1-D (`_program`): program = (b * H + h) * blocks + block. Tile sizes are autotuned
(`_triton_configs.py`); head dims up to 256 (the host declines larger ones).

Rows with no valid entry have l = 0: their output is 0 and their LSE +inf, so that their
weights recomputed in the backward are exp(-inf) = 0; nothing is NaN. Dropout: the
counter-based mask of kernels/dropout.py, or an explicit keep mask (tests).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

from attnlab.attention.kernels._triton_configs import tuned

# arguments that change from call to call: never specialize (recompile) on their values
_PER_CALL = ["seed_lo", "seed_hi", "threshold", "inv_keep", "TUNE_M", "TUNE_N"]


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
    else:
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
        pad = tl.load(PM + b * L + offs, mask=valid, other=1)
        valid = valid & (pad == 0)
    return valid


@triton.jit
def _tile(X, base, offs_r, offs_c, stride_r, R, C, CAST: tl.constexpr):
    """(rows, cols) tile of a matrix with unit column stride; zeros outside; float32 if CAST."""
    x = tl.load(X + base + offs_r[:, None] * stride_r + offs_c[None, :],
                mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0)
    if CAST:  # bf16 under the interpreter (no bf16 arithmetic there)
        x = x.to(tl.float32)
    return x


@triton.jit
def _program(L, BLOCK: tl.constexpr):
    """(b * H + h, block index) of this program on the 1-D grid: blocks of one head are
    consecutive programs (they share its K / V in L2), and a 1-D grid has no 65,535 cap."""
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(L, BLOCK)
    return pid // n_blocks, pid % n_blocks


@triton.jit(do_not_specialize=["TUNE_M", "TUNE_N"])
def _column_lse(Q, K, QPM, C, sqb, sqh, sqm, skb, skh, skn, H, M, N, D, scale, TUNE_M, TUNE_N,
                HAS_QPM: tl.constexpr, CAST: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh, pid = _program(N, BLOCK_N)
    b, h = bh // H, bh % H
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _tile(K, b.to(tl.int64) * skb + h * skh, offs_n, offs_d, skn, N, D, CAST)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, M, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        q = _tile(Q, b.to(tl.int64) * sqb + h * sqh, offs_m, offs_d, sqm, M, D, CAST)
        s = tl.dot(k, tl.trans(q), input_precision=PRECISION) * scale  # (keys, queries)
        s = tl.where(_valid(QPM, b, offs_m, M, HAS_QPM)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        lsum = lsum * tl.exp(m - m_safe) + tl.sum(tl.exp(s - m_safe[:, None]), 1)
        m = m_new
    c = tl.where(lsum > 0, m + tl.log(tl.where(lsum > 0, lsum, 1.0)), 0.0)
    tl.store(C + bh * N + offs_n, c, mask=offs_n < N)


@triton.jit(do_not_specialize=_PER_CALL)
def _forward(Q, K, V, C, U, KPM, QPM, KEEP, O, OD, OU, LSE_D, LSE_U,
             sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
             H, M, N, D, DV, scale, seed_lo, seed_hi, threshold, inv_keep, TUNE_M, TUNE_N,
             HYBRID: tl.constexpr, HAS_KPM: tl.constexpr, HAS_QPM: tl.constexpr,
             DROPOUT: tl.constexpr, HAS_KEEP: tl.constexpr, CAST: tl.constexpr,
             PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    bh, pid = _program(M, BLOCK_M)
    b, h = bh // H, bh % H
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _tile(Q, b.to(tl.int64) * sqb + h * sqh, offs_m, offs_d, sqm, M, D, CAST)
    valid_q = _valid(QPM, b, offs_m, M, HAS_QPM)
    m_d = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_d = tl.zeros([BLOCK_M], tl.float32)
    acc_d = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    m_u = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_u = tl.zeros([BLOCK_M], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = _tile(K, b.to(tl.int64) * skb + h * skh, offs_n, offs_d, skn, N, D, CAST)
        v = _tile(V, b.to(tl.int64) * svb + h * svh, offs_n, offs_dv, svn, N, DV, CAST)
        c = tl.load(C + bh * N + offs_n, mask=offs_n < N, other=0.0)
        valid = valid_q[:, None] & _valid(KPM, b, offs_n, N, HAS_KPM)[None, :]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if DROPOUT:
            kept = _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP)
        # DNAS: online softmax of t = s - c (the sums count every key; dropout after them)
        # s - c <= 0 exactly; clamped because _column_lse rounds s in another tile order
        t = tl.where(valid, tl.minimum(s - c[None, :], 0.0), float("-inf"))
        m_new = tl.maximum(m_d, tl.max(t, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_d - m_safe)
        p = tl.exp(t - m_safe[:, None])
        l_d = l_d * alpha + tl.sum(p, 1)
        m_d = m_new
        if DROPOUT:
            p = tl.where(kept, p, 0.0)
        acc_d = acc_d * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        if HYBRID:  # UNAS: online softmax of s in the same sweep
            su = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_u, tl.max(su, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_u - m_safe)
            p = tl.exp(su - m_safe[:, None])
            l_u = l_u * alpha + tl.sum(p, 1)
            m_u = m_new
            if DROPOUT:
                p = tl.where(kept, p, 0.0)
            acc_u = acc_u * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    rows = offs_m < M
    o_d = acc_d * (inv_keep / tl.where(l_d > 0, l_d, 1.0))[:, None]
    lse_d = tl.where(l_d > 0, m_d + tl.log(tl.where(l_d > 0, l_d, 1.0)), float("inf"))
    tl.store(LSE_D + bh * M + offs_m, lse_d, mask=rows)
    out = o_d
    if HYBRID:
        o_u = acc_u * (inv_keep / tl.where(l_u > 0, l_u, 1.0))[:, None]
        lse_u = tl.where(l_u > 0, m_u + tl.log(tl.where(l_u > 0, l_u, 1.0)), float("inf"))
        tl.store(LSE_U + bh * M + offs_m, lse_u, mask=rows)
        u = tl.load(U + bh)
        out = u * o_d + (1.0 - u) * o_u
        # the branch outputs (float32, contiguous) give the backward its row sums and du
        branch = bh.to(tl.int64) * M * DV + offs_m[:, None] * DV + offs_dv[None, :]
        inside = rows[:, None] & (offs_dv[None, :] < DV)
        tl.store(OD + branch, o_d, mask=inside)
        tl.store(OU + branch, o_u, mask=inside)
    o_ptrs = O + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=rows[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _row_stats(LSE_D, DELTA_D, LSE_U, DELTA_U, bh, offs_m, M, HYBRID: tl.constexpr):
    """Row LSEs and D_i = sum_j P_ij dP~_ij of rows offs_m (DNAS: the U ones repeat the D ones);
    rows outside get LSE +inf, hence weights 0."""
    rows = bh * M + offs_m
    lse_d = tl.load(LSE_D + rows, mask=offs_m < M, other=float("inf"))
    delta_d = tl.load(DELTA_D + rows, mask=offs_m < M, other=0.0)
    lse_u = lse_d
    delta_u = delta_d
    if HYBRID:
        lse_u = tl.load(LSE_U + rows, mask=offs_m < M, other=float("inf"))
        delta_u = tl.load(DELTA_U + rows, mask=offs_m < M, other=0.0)
    return lse_d, delta_d, lse_u, delta_u


@triton.jit
def _score_grads(q, k, g, v, c, lse_d, lse_u, delta_d, delta_u, u, valid, kept, scale,
                 inv_keep, HYBRID: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """For one (queries x keys) tile: xi, the dropped mixed weights W~, the u-weighted DNAS score
    gradient dT and the score gradient dS of both branches (without the c term)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    t = tl.minimum(s - c[None, :], 0.0)  # as in _forward: exp(t) = xi <= 1, never inf
    xi = tl.exp(tl.where(valid, t, float("-inf")))
    pd = tl.exp(tl.where(valid, t - lse_d[:, None], float("-inf")))
    dp = tl.dot(g, tl.trans(v), input_precision=PRECISION)
    if DROPOUT:
        dp = tl.where(kept, dp * inv_keep, 0.0)
    dt = pd * (dp - delta_d[:, None])
    if HYBRID:
        pu = tl.exp(tl.where(valid, s - lse_u[:, None], float("-inf")))
        w = u * pd + (1.0 - u) * pu
        dt = u * dt
        ds = dt + (1.0 - u) * pu * (dp - delta_u[:, None])
    else:
        w = pd
        ds = dt
    if DROPOUT:
        w = tl.where(kept, w * inv_keep, 0.0)
    return xi, w, dt, ds


@triton.jit(do_not_specialize=_PER_CALL)
def _backward_kv(Q, K, V, G, C, U, KPM, QPM, KEEP, LSE_D, LSE_U, DELTA_D, DELTA_U, DK, DV_, DC,
                 sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sgb, sgh, sgm,
                 H, M, N, D, DV, scale, seed_lo, seed_hi, threshold, inv_keep, TUNE_M, TUNE_N,
                 HYBRID: tl.constexpr, HAS_KPM: tl.constexpr, HAS_QPM: tl.constexpr,
                 DROPOUT: tl.constexpr, HAS_KEEP: tl.constexpr, CAST: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    bh, pid = _program(N, BLOCK_N)
    b, h = bh // H, bh % H
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = _tile(K, b.to(tl.int64) * skb + h * skh, offs_n, offs_d, skn, N, D, CAST)
    v = _tile(V, b.to(tl.int64) * svb + h * svh, offs_n, offs_dv, svn, N, DV, CAST)
    c = tl.load(C + bh * N + offs_n, mask=offs_n < N, other=0.0)
    valid_k = _valid(KPM, b, offs_n, N, HAS_KPM)
    u = tl.load(U + bh) if HYBRID else 1.0
    acc_dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    acc_dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i dS_ij q_i
    acc_qbar = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i xi_ij q_i
    colsum = tl.zeros([BLOCK_N], tl.float32)  # sum_i dT_ij
    for start in range(0, M, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        q = _tile(Q, b.to(tl.int64) * sqb + h * sqh, offs_m, offs_d, sqm, M, D, CAST)
        g = _tile(G, b.to(tl.int64) * sgb + h * sgh, offs_m, offs_dv, sgm, M, DV, CAST)
        lse_d, delta_d, lse_u, delta_u = _row_stats(LSE_D, DELTA_D, LSE_U, DELTA_U, bh, offs_m,
                                                    M, HYBRID)
        valid = _valid(QPM, b, offs_m, M, HAS_QPM)[:, None] & valid_k[None, :]
        kept = valid
        if DROPOUT:
            kept = _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP)
        xi, w, dt, ds = _score_grads(q, k, g, v, c, lse_d, lse_u, delta_d, delta_u, u, valid,
                                     kept, scale, inv_keep, HYBRID, DROPOUT, PRECISION)
        acc_dv += tl.dot(tl.trans(w).to(g.dtype), g, input_precision=PRECISION)
        acc_dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
        acc_qbar += tl.dot(tl.trans(xi).to(q.dtype), q, input_precision=PRECISION)
        colsum += tl.sum(dt, 0)
    dc = -colsum
    dk = scale * (acc_dk + dc[:, None] * acc_qbar)
    keys = bh.to(tl.int64) * N + offs_n
    tl.store(DC + keys, dc, mask=offs_n < N)
    dk_ptrs = DK + keys[:, None] * D + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=(offs_n[:, None] < N) & (offs_d[None, :] < D))
    dv_ptrs = DV_ + keys[:, None] * DV + offs_dv[None, :]
    tl.store(dv_ptrs, acc_dv.to(DV_.dtype.element_ty),
             mask=(offs_n[:, None] < N) & (offs_dv[None, :] < DV))


@triton.jit(do_not_specialize=_PER_CALL)
def _backward_q(Q, K, V, G, C, DC, U, KPM, QPM, KEEP, LSE_D, LSE_U, DELTA_D, DELTA_U, DQ,
                sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sgb, sgh, sgm,
                H, M, N, D, DV, scale, seed_lo, seed_hi, threshold, inv_keep, TUNE_M, TUNE_N,
                HYBRID: tl.constexpr, HAS_KPM: tl.constexpr, HAS_QPM: tl.constexpr,
                DROPOUT: tl.constexpr, HAS_KEEP: tl.constexpr, CAST: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    bh, pid = _program(M, BLOCK_M)
    b, h = bh // H, bh % H
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _tile(Q, b.to(tl.int64) * sqb + h * sqh, offs_m, offs_d, sqm, M, D, CAST)
    g = _tile(G, b.to(tl.int64) * sgb + h * sgh, offs_m, offs_dv, sgm, M, DV, CAST)
    lse_d, delta_d, lse_u, delta_u = _row_stats(LSE_D, DELTA_D, LSE_U, DELTA_U, bh, offs_m, M,
                                                HYBRID)
    valid_q = _valid(QPM, b, offs_m, M, HAS_QPM)
    u = tl.load(U + bh) if HYBRID else 1.0
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = _tile(K, b.to(tl.int64) * skb + h * skh, offs_n, offs_d, skn, N, D, CAST)
        v = _tile(V, b.to(tl.int64) * svb + h * svh, offs_n, offs_dv, svn, N, DV, CAST)
        c = tl.load(C + bh * N + offs_n, mask=offs_n < N, other=0.0)
        dc = tl.load(DC + bh * N + offs_n, mask=offs_n < N, other=0.0)
        valid = valid_q[:, None] & _valid(KPM, b, offs_n, N, HAS_KPM)[None, :]
        kept = valid
        if DROPOUT:
            kept = _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP)
        xi, _, _, ds = _score_grads(q, k, g, v, c, lse_d, lse_u, delta_d, delta_u, u, valid,
                                    kept, scale, inv_keep, HYBRID, DROPOUT, PRECISION)
        ds = ds + dc[None, :] * xi
        acc += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    dq_ptrs = DQ + (bh.to(tl.int64) * M + offs_m)[:, None] * D + offs_d[None, :]
    tl.store(dq_ptrs, (scale * acc).to(DQ.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_d[None, :] < D))


# What the host launches: autotuned when compiled, as they are under the interpreter
INTERPRETED = knobs.runtime.interpret
column_lse = tuned("column", _column_lse)
forward = tuned("forward", _forward)
backward_kv = tuned("backward_kv", _backward_kv)
backward_q = tuned("backward_q", _backward_q)
