"""Triton kernels of DNAS / HNAS attention (imported on first use only: triton is optional).

Notation and math as in csrc/query_normalized.cpp: s = scale q k^T, c_j = logsumexp_i s_ij over
valid queries, t = s - c, Pd = softmax_j(t), Pu = softmax_j(s), W = u Pd + (1 - u) Pu (DNAS: u = 1),
out = (W * keep / (1 - p)) v. Every kernel takes one block of rows (queries or keys) of one
(b, h) and loops over the blocks of the other side with masked loads, so lengths need not be
block multiples and nothing S_q x S_k is ever stored:

- `_column_lse`: key blocks over query blocks, online max / sum: c_j.
- `_forward`: query blocks over key blocks, online softmax of t, the per-key bias -c_j; HNAS
  sums the UNAS branch from the same exponentials (below); writes out and the row LSEs.
- `_backward_kv`: key blocks over query blocks: dV, dc_j = -sum_i dT_ij (dT: the u-weighted DNAS
  score gradient), and dK = scale (sum_i dS_ij q_i + dc_j sum_i xi_ij q_i), xi = exp(t), with
  dP = dO V^T computed once for both branches. No atomics: each program owns its keys.
- `_backward_q`: query blocks over key blocks: dQ = scale sum_j (dS_ij + dc_j xi_ij) k_j.

The two backward kernels here are the deterministic backward (no atomics), which runs when
torch's deterministic algorithms are on; by default `_triton_atomic_dq.py`'s runs (dQ summed by
atomics, 2 products per score fewer). Work per score (docs/gpu.md, "Work per score", counts
every path) with these: 11 matrix products for DNAS (column 1, forward 2, backward_kv 5,
backward_q 3), 12 for HNAS (two value products in the forward), and 4 exponentials. The fused
CPU kernel's backward does 5 products, not 8, because a thread holds the scores of a key block
against every query (S_q x 256 floats), finishes the column sums dc_j, then forms ds = dS + dc xi
once for both dK and dQ. A Triton program holds a block against a block: dc_j is complete only
after its loop over every query, so dK takes the dc term by linearity (the 5th product, sum_i
xi_ij q_i) and dQ, summed over keys, needs every dc_j before it starts: a second pass over the
scores (3 products), whose sums run in a fixed order.

One exponential per score in each pass, as on the CPU: exp2, with log2(e) folded into the scale,
so that s, c and every row LSE here are in log2 units (LSE_D, LSE_U and C are stored so). The
backward takes Pd = exp2(t - rd) and derives xi = Pd e_i (e_i = 2^rd_i <= S_k: rd <= log2 S_k as
t <= 0) and, for HNAS, Pu = Pd a_i b_j (csrc/fold.h: b_j = 2^(c_j - cref), a_i =
2^(cref + rd_i - ru_i), cref = the head's largest c_j over valid keys). The forward sums both
branches from the DNAS exponentials p: the UNAS sum is sum_j p b_j. The fold is exact algebra;
it is used where the head's c_j (valid keys) span at most FOLD_RANGE (60 nats, as on the CPU):
then every UNAS weight that matters comes from a normal float. Heads with a wider span (scores
of hundreds) get cref = +inf from the host and take Pu's own exponential (2 per score).

Offsets: every pointer offset is int64 (the (b, h) base, row offsets, the per-row vectors), so
B*H*S*d may pass 2**31 elements; 32-bit are only the program ids and the dropout counter
(`triton_query_normalized.declines`).

Grids are 1-D (`_program`): program = (b * H + h) * blocks + block. Tile sizes are autotuned
(`_triton_configs.py`); head dims up to 256 (the host declines larger ones).

Rows with no valid entry have l = 0: their output is 0 and their LSE +inf, so that their
weights recomputed in the backward are 2^-inf = 0; nothing is NaN. Dropout: the
counter-based mask of kernels/dropout.py, or an explicit keep mask (tests).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

from attnlab.attention.kernels._triton_configs import tuned
from attnlab.attention.kernels._triton_tiles import (
    _head,
    _keep,
    _lse2,
    _online,
    _program,
    _rows,
    _store_tile,
    _tile,
    _valid,
)

# arguments that change from call to call: never specialize (recompile) on their values
_PER_CALL = ["seed_lo", "seed_hi", "threshold", "inv_keep", "TUNE_M", "TUNE_N"]
LOG2E = tl.constexpr(1.4426950408889634)  # s in log2 units: exp(x) = exp2(x log2 e)


@triton.jit
def _fold_keys(c, cref, valid_k):
    """b_j = 2^(c_j - cref) of the keys (0 on padded ones) of a head that folds (cref finite);
    unused where it does not (cref = +inf from the host: its c_j span too wide a range)."""
    # valid keys have c <= cref; min(., 0) keeps padded keys' (unused) factors finite
    return tl.where(valid_k, tl.exp2(tl.minimum(c - cref, 0.0)), 0.0)


@triton.jit(do_not_specialize=["TUNE_M", "TUNE_N"])
def _column_lse(Q, K, QPM, C, sqb, sqh, sqm, skb, skh, skn, H, M, N, D, scale, TUNE_M, TUNE_N,
                HAS_QPM: tl.constexpr, CAST: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh, pid = _program(N, BLOCK_N)
    b, h = bh // H, bh % H
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    qk_scale = scale * LOG2E
    k = _tile(K, _head(b, h, skb, skh), offs_n, offs_d, skn, N, D, CAST)
    q_head = _head(b, h, sqb, sqh)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, M, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        q = _tile(Q, q_head, offs_m, offs_d, sqm, M, D, CAST)
        s = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # (keys, queries)
        s = tl.where(_valid(QPM, b, offs_m, M, HAS_QPM)[None, :], s, float("-inf"))
        m_new, alpha, p = _online(s, m)
        lsum = lsum * alpha + tl.sum(p, 1)
        m = m_new
    c = tl.where(lsum > 0, m + tl.log2(tl.where(lsum > 0, lsum, 1.0)), 0.0)
    tl.store(_rows(C, bh, offs_n, N), c, mask=offs_n < N)


@triton.jit(do_not_specialize=_PER_CALL)
def _forward(Q, K, V, C, U, CREF, KPM, QPM, KEEP, O, OD, OU, LSE_D, LSE_U,
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
    qk_scale = scale * LOG2E
    q = _tile(Q, _head(b, h, sqb, sqh), offs_m, offs_d, sqm, M, D, CAST)
    k_head, v_head = _head(b, h, skb, skh), _head(b, h, svb, svh)
    valid_q = _valid(QPM, b, offs_m, M, HAS_QPM)
    m_d = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_d = tl.zeros([BLOCK_M], tl.float32)
    acc_d = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    m_u = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_u = tl.zeros([BLOCK_M], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    cref = 0.0
    fold = False
    if HYBRID:
        cref = tl.load(CREF + bh)
        fold = cref < float("inf")
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = _tile(K, k_head, offs_n, offs_d, skn, N, D, CAST)
        v = _tile(V, v_head, offs_n, offs_dv, svn, N, DV, CAST)
        c = tl.load(_rows(C, bh, offs_n, N), mask=offs_n < N, other=0.0)
        valid_k = _valid(KPM, b, offs_n, N, HAS_KPM)
        valid = valid_q[:, None] & valid_k[None, :]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if DROPOUT:
            kept = _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP)
        # DNAS: online softmax of t = s - c (the sums count every key; dropout after them)
        # s - c <= 0 exactly; clamped because _column_lse rounds s in another tile order
        t = tl.where(valid, tl.minimum(s - c[None, :], 0.0), float("-inf"))
        m_new, alpha, p = _online(t, m_d)
        l_d = l_d * alpha + tl.sum(p, 1)
        m_d = m_new
        if HYBRID:  # UNAS in the same sweep over QK^T
            if fold:  # p b_j = 2^(s - cref - m_d): the same running maximum, no exponential
                pu = p * _fold_keys(c, cref, valid_k)[None, :]
                alpha_u = alpha
                m_u_new = m_u  # m_u is m_d + cref, set after the loop
            else:  # a wide c range: the online softmax of s, with its own exponentials
                su = tl.where(valid, s, float("-inf"))
                m_u_new, alpha_u, pu = _online(su, m_u)
            l_u = l_u * alpha_u + tl.sum(pu, 1)
            m_u = m_u_new
            if DROPOUT:
                pu = tl.where(kept, pu, 0.0)
            acc_u = acc_u * alpha_u[:, None] + tl.dot(pu.to(v.dtype), v,
                                                      input_precision=PRECISION)
        if DROPOUT:
            p = tl.where(kept, p, 0.0)
        acc_d = acc_d * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    rows = offs_m < M
    o_d = acc_d * (inv_keep / tl.where(l_d > 0, l_d, 1.0))[:, None]
    tl.store(_rows(LSE_D, bh, offs_m, M), _lse2(m_d, l_d), mask=rows)
    out = o_d
    if HYBRID:
        if fold:
            m_u = m_d + cref
        o_u = acc_u * (inv_keep / tl.where(l_u > 0, l_u, 1.0))[:, None]
        tl.store(_rows(LSE_U, bh, offs_m, M), _lse2(m_u, l_u), mask=rows)
        u = tl.load(U + bh)
        out = u * o_d + (1.0 - u) * o_u
        # the branch outputs (float32, contiguous) give the backward its row sums and du
        branch = bh.to(tl.int64) * M * DV
        _store_tile(OD, branch, offs_m, offs_dv, DV, M, DV, o_d)
        _store_tile(OU, branch, offs_m, offs_dv, DV, M, DV, o_u)
    _store_tile(O, _head(b, h, sob, soh), offs_m, offs_dv, som, M, DV, out)


@triton.jit
def _row_stats(LSE_D, DELTA_D, LSE_U, DELTA_U, cref, fold, bh, offs_m, M,
               HYBRID: tl.constexpr):
    """Per row of offs_m: the LSEs (log2) rd, ru, D_i = sum_j P_ij dP~_ij of each branch (DNAS:
    the U ones repeat the D ones), e_i = 2^rd_i and the fold factor a_i = 2^(cref + rd - ru);
    rows outside or empty get LSE +inf, hence weights 0, and e = a = 0."""
    inside = offs_m < M
    rd = tl.load(_rows(LSE_D, bh, offs_m, M), mask=inside, other=float("inf"))
    dd = tl.load(_rows(DELTA_D, bh, offs_m, M), mask=inside, other=0.0)
    ru = rd
    du = dd
    live = rd < float("inf")
    e = tl.where(live, tl.exp2(tl.where(live, rd, 0.0)), 0.0)  # rd <= log2 S_k: finite
    a = e
    if HYBRID:
        ru = tl.load(_rows(LSE_U, bh, offs_m, M), mask=inside, other=float("inf"))
        du = tl.load(_rows(DELTA_U, bh, offs_m, M), mask=inside, other=0.0)
        fold_row = tl.where(fold, live, False)  # (interpreter: no scalar & vector)
        a = tl.where(fold_row, tl.exp2(tl.where(fold_row, cref + rd, 0.0) -
                                       tl.where(fold_row, ru, 0.0)), 0.0)
    return rd, ru, dd, du, e, a


@triton.jit
def _key_block(K, V, C, U, CREF, KPM, skb, skh, skn, svb, svh, svn, H, N, D, DV,
               HYBRID: tl.constexpr, HAS_KPM: tl.constexpr, CAST: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """What a backward program owning a block of keys holds throughout: (b * H + h, b, h, its
    key rows, the d and d_v offsets, its k and v tiles, c, which keys are valid, and the head's
    u, cref, fold and b_j; DNAS: u = 1, no fold)."""
    bh, pid = _program(N, BLOCK_N)
    b, h = bh // H, bh % H
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = _tile(K, _head(b, h, skb, skh), offs_n, offs_d, skn, N, D, CAST)
    v = _tile(V, _head(b, h, svb, svh), offs_n, offs_dv, svn, N, DV, CAST)
    c = tl.load(_rows(C, bh, offs_n, N), mask=offs_n < N, other=0.0)
    valid_k = _valid(KPM, b, offs_n, N, HAS_KPM)
    u = 1.0
    cref = 0.0
    fold = False
    bk = c
    if HYBRID:
        u = tl.load(U + bh)
        cref = tl.load(CREF + bh)
        fold = cref < float("inf")
        bk = _fold_keys(c, cref, valid_k)
    return bh, b, h, offs_n, offs_d, offs_dv, k, v, c, valid_k, u, cref, fold, bk


@triton.jit
def _dnas_weights(q, k, c, rd, valid, qk_scale, PRECISION: tl.constexpr):
    """The scores s (log2 units) of a tile and Pd = 2^(t - rd), its one exponential; t clamped
    as in _forward, and rd = +inf on empty rows gives Pd = 0."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    pd = tl.exp2(tl.where(valid, tl.minimum(s - c[None, :], 0.0) - rd[:, None], float("-inf")))
    return s, pd


@triton.jit
def _unas_weights(s, pd, a, bk, ru, fold, valid):
    """Pu: Pd a_i b_j where the head folds (csrc/fold.h), else its own exponential."""
    if fold:
        pu = pd * (a[:, None] * bk[None, :])
    else:
        pu = tl.exp2(tl.where(valid, s - ru[:, None], float("-inf")))
    return pu


@triton.jit
def _score_grads(q, k, g, v, c, bk, rd, ru, dd, du, e, a, u, fold, valid, kept, qk_scale,
                 inv_keep, HYBRID: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """For one (queries x keys) tile: xi, the dropped mixed weights W~, the u-weighted DNAS score
    gradient dT and the score gradient dS of both branches (without the c term); one
    exponential (Pd) unless the head does not fold (then Pu has its own)."""
    s, pd = _dnas_weights(q, k, c, rd, valid, qk_scale, PRECISION)
    dp = tl.dot(g, tl.trans(v), input_precision=PRECISION)
    if DROPOUT:
        dp = tl.where(kept, dp * inv_keep, 0.0)
    dt = pd * (dp - dd[:, None])
    xi = pd * e[:, None]  # exp(t): the column softmax times 2^rd
    if HYBRID:
        pu = _unas_weights(s, pd, a, bk, ru, fold, valid)
        w = u * pd + (1.0 - u) * pu
        dt = u * dt
        ds = dt + (1.0 - u) * pu * (dp - du[:, None])
    else:
        w = pd
        ds = dt
    if DROPOUT:
        w = tl.where(kept, w * inv_keep, 0.0)
    return xi, w, dt, ds


@triton.jit(do_not_specialize=_PER_CALL)
def _backward_kv(Q, K, V, G, C, U, CREF, KPM, QPM, KEEP, LSE_D, LSE_U, DELTA_D, DELTA_U, DK,
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
    acc_dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    acc_dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i dS_ij q_i
    acc_qbar = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i xi_ij q_i
    colsum = tl.zeros([BLOCK_N], tl.float32)  # sum_i dT_ij
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
        xi, w, dt, ds = _score_grads(q, k, g, v, c, bk, rd, ru, dd, du, e, a, u, fold, valid,
                                     kept, qk_scale, inv_keep, HYBRID, DROPOUT, PRECISION)
        acc_dv += tl.dot(tl.trans(w).to(g.dtype), g, input_precision=PRECISION)
        acc_dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
        acc_qbar += tl.dot(tl.trans(xi).to(q.dtype), q, input_precision=PRECISION)
        colsum += tl.sum(dt, 0)
    dc = -colsum
    dk = scale * (acc_dk + dc[:, None] * acc_qbar)
    tl.store(_rows(DC, bh, offs_n, N), dc, mask=offs_n < N)
    keys = bh.to(tl.int64) * N  # dK, dV: contiguous (B, H, S_k, .)
    _store_tile(DK, keys * D, offs_n, offs_d, D, N, D, dk)
    _store_tile(DV_, keys * DV, offs_n, offs_dv, DV, N, DV, acc_dv)


@triton.jit(do_not_specialize=_PER_CALL)
def _backward_q(Q, K, V, G, C, DC, U, CREF, KPM, QPM, KEEP, LSE_D, LSE_U, DELTA_D, DELTA_U, DQ,
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
    qk_scale = scale * LOG2E
    q = _tile(Q, _head(b, h, sqb, sqh), offs_m, offs_d, sqm, M, D, CAST)
    g = _tile(G, _head(b, h, sgb, sgh), offs_m, offs_dv, sgm, M, DV, CAST)
    k_head, v_head = _head(b, h, skb, skh), _head(b, h, svb, svh)
    u = 1.0
    cref = 0.0
    fold = False
    if HYBRID:
        u = tl.load(U + bh)
        cref = tl.load(CREF + bh)
        fold = cref < float("inf")
    rd, ru, dd, du, e, a = _row_stats(LSE_D, DELTA_D, LSE_U, DELTA_U, cref, fold, bh, offs_m, M,
                                      HYBRID)
    valid_q = _valid(QPM, b, offs_m, M, HAS_QPM)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = _tile(K, k_head, offs_n, offs_d, skn, N, D, CAST)
        v = _tile(V, v_head, offs_n, offs_dv, svn, N, DV, CAST)
        c = tl.load(_rows(C, bh, offs_n, N), mask=offs_n < N, other=0.0)
        dc = tl.load(_rows(DC, bh, offs_n, N), mask=offs_n < N, other=0.0)
        valid_k = _valid(KPM, b, offs_n, N, HAS_KPM)
        valid = valid_q[:, None] & valid_k[None, :]
        bk = c
        if HYBRID:  # b_j: BLOCK_N exponentials per tile, 1 / BLOCK_M per score
            bk = _fold_keys(c, cref, valid_k)
        kept = valid
        if DROPOUT:
            kept = _keep(KEEP, bh, offs_m, offs_n, M, N, seed_lo, seed_hi, threshold, HAS_KEEP)
        xi, _, _, ds = _score_grads(q, k, g, v, c, bk, rd, ru, dd, du, e, a, u, fold, valid,
                                    kept, qk_scale, inv_keep, HYBRID, DROPOUT, PRECISION)
        ds = ds + dc[None, :] * xi
        acc += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    _store_tile(DQ, bh.to(tl.int64) * M * D, offs_m, offs_d, D, M, D, scale * acc)


# What the host launches: autotuned when compiled, as they are under the interpreter
INTERPRETED = knobs.runtime.interpret
column_lse = tuned("column", _column_lse)
forward = tuned("forward", _forward)
backward_kv = tuned("backward_kv", _backward_kv)
backward_q = tuned("backward_q", _backward_q)
