// The fused kernel's backward (query_normalized.cpp has the math): blocks of keys J against every
// query, and its two sweeps over such a block.
// Each row of the block is one query i and the keys j in J (n of them), so the column sums over
// i that the gradient through c_j needs are complete after one sweep of the block:
//
//   sweep A  Pd_ij = exp(min(s_ij - c_j, 0) - rd_i), dP~ = dP keep, col_j += Pd (dP~ - Dd_i),
//            W~_ij = (u Pd + (1 - u) Pu) keep (dv is built from it), Du_i += sum_j Pu dP~
//   (then dL/dc_j = -u col_j)
//   sweep B  ds_ij = Pd (u (dP~ - Dd_i) + e_i dL/dc_j) + Pu ((1 - u) dP~ - Eu_i)
//
// with e_i = exp(rd_i) (Pd e = xi, the column softmax), Eu_i = g_i . out_i - u Dd_i, which is
// (1 - u) Du_i without the sum that sweep A is still building, and Pu = Pd a_i b_j (fold.h) or,
// where the fold is unsafe, exp(s_ij + kb_j - ru_i). DNAS: u = 1 and no Pu.
#pragma once

#include <ATen/Parallel.h>

#include "dropout.h"
#include "fold.h"

namespace {

enum class Mix { none, fold, exp };  // DNAS; HNAS with Pu = Pd a b; HNAS with Pu's own exp

// What a row of the block needs (per query) and the key-block's vectors (offset to J).
template <typename T>
struct GradRow {
  T rd, ru, a, e, dd, eu, u;
  const T *cb, *kb, *b, *keep;  // keep: null without dropout
};

template <typename T, Mix mix>
inline Vectorized<T> unas_weight(const GradRow<T>& r, const Vectorized<T>& s,
                                 const Vectorized<T>& pd, int64_t j) {
  using V = Vectorized<T>;
  if constexpr (mix == Mix::fold) return pd * (V(r.a) * V::loadu(r.b + j));
  return vexp(s + V::loadu(r.kb + j) - V(r.ru));
}

template <typename T, Mix mix>
inline T unas_weight_at(const GradRow<T>& r, T s, T pd, int64_t j) {
  if constexpr (mix == Mix::fold) return pd * r.a * r.b[j];
  return std::exp(s + r.kb[j] - r.ru);
}

// Sweep A over one row: x holds s on entry and Pd after (Mix::exp keeps s: sweep B needs it);
// dp holds dP, then dP~; w (null: W~ = Pd, x is used) gets W~; col_j += Pd (dP~ - Dd).
// Returns sum_j Pu dP~ (0 for DNAS).
template <typename T, Mix mix>
T grad_sweep_a(const GradRow<T>& r, T* x, T* dp, T* w, T* col, int64_t n) {
  using V = Vectorized<T>;
  const V vrd(r.rd), vdd(r.dd), vu(r.u), v1u(T(1) - r.u);
  V su(T(0));
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V s = V::loadu(x + j);
    const V pd = vexp(dnas_logit(s, V::loadu(r.cb + j)) - vrd);
    V g = V::loadu(dp + j);
    if (r.keep) {
      g = g * V::loadu(r.keep + j);
      g.store(dp + j);
    }
    if constexpr (mix != Mix::exp) pd.store(x + j);
    at::vec::fmadd(pd, g - vdd, V::loadu(col + j)).store(col + j);
    V wv = pd;
    if constexpr (mix != Mix::none) {
      const V pu = unas_weight<T, mix>(r, s, pd, j);
      su = at::vec::fmadd(pu, g, su);
      wv = at::vec::fmadd(vu, pd, v1u * pu);
    }
    if (w) (r.keep ? wv * V::loadu(r.keep + j) : wv).store(w + j);
  }
  T du = hsum(su);
  for (; j < n; ++j) {
    const T s = x[j];
    const T pd = std::exp(std::min(s + r.cb[j], T(0)) - r.rd);
    const T g = r.keep ? dp[j] * r.keep[j] : dp[j];
    dp[j] = g;
    if constexpr (mix != Mix::exp) x[j] = pd;
    col[j] += pd * (g - r.dd);
    T wv = pd;
    if constexpr (mix != Mix::none) {
      const T pu = unas_weight_at<T, mix>(r, s, pd, j);
      du += pu * g;
      wv = r.u * pd + (T(1) - r.u) * pu;
    }
    if (w) w[j] = r.keep ? wv * r.keep[j] : wv;
  }
  return du;
}

// Sweep B over one row: dp (dP~ on entry) <- ds; x holds Pd (Mix::exp: s, and Pd and Pu are
// recomputed). dldc: dL/dc_j of the block's keys.
template <typename T, Mix mix>
void grad_sweep_b(const GradRow<T>& r, const T* x, T* dp, const T* dldc, int64_t n) {
  using V = Vectorized<T>;
  const V vrd(r.rd), vdd(r.dd), vu(r.u), v1u(T(1) - r.u), ve(r.e), veu(r.eu);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V g = V::loadu(dp + j), s = V::loadu(x + j);
    const V pd = mix == Mix::exp ? vexp(dnas_logit(s, V::loadu(r.cb + j)) - vrd) : s;
    V ds = pd * at::vec::fmadd(ve, V::loadu(dldc + j), vu * (g - vdd));
    if constexpr (mix != Mix::none)
      ds = at::vec::fmadd(unas_weight<T, mix>(r, s, pd, j), at::vec::fmsub(v1u, g, veu), ds);
    ds.store(dp + j);
  }
  for (; j < n; ++j) {
    const T s = x[j];
    const T pd = mix == Mix::exp ? std::exp(std::min(s + r.cb[j], T(0)) - r.rd) : s;
    T ds = pd * (r.u * (dp[j] - r.dd) + r.e * dldc[j]);
    if constexpr (mix != Mix::none)
      ds += unas_weight_at<T, mix>(r, s, pd, j) * ((T(1) - r.u) * dp[j] - r.eu);
    dp[j] = ds;
  }
}

template <typename T>
void backward_impl(const at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& od,
                   const std::optional<at::Tensor>& u, const at::Tensor& c, const at::Tensor& rd,
                   const at::Tensor& ru, const std::optional<at::Tensor>& kpm, bool column,
                   const Dropout& drop, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                   at::Tensor& du) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), d = q.size(3),
                dvs = v.size(3);
  const bool hybrid = u.has_value();
  const T scale = T(1) / std::sqrt(T(d));
  const Slice<T> G(g), Q(q), K(k), Vv(v), O(out), DQ(dq), DK(dk), DV(dv);
  const std::optional<Slice<T>> OD = hybrid ? std::optional<Slice<T>>(od) : std::nullopt;
  const T* c_all = c.data_ptr<T>();
  const T* rd_all = rd.data_ptr<T>();
  const T* ru_all = hybrid ? ru.data_ptr<T>() : nullptr;
  const T* u_all = hybrid ? u->data_ptr<T>() : nullptr;
  T* du_all = hybrid ? du.data_ptr<T>() : nullptr;
  const int64_t cols = block_rows(M, N, sizeof(T));  // keys per block

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    // X: scores, then Pd (P for UNAS); D: dP, then dP~, then ds; W: W~ (HNAS or dropout)
    const bool own_w = column && (hybrid || drop.active());
    std::vector<T> X(M * cols), D(M * cols), W(own_w ? M * cols : 0), keep(drop.active() ? cols : 0);
    std::vector<T> kbias(N), cbias(N), bfac(hybrid ? N : 0), col(cols), dldc(cols);
    std::vector<T> Dd(M), Du(M), Eu(hybrid ? M : 0), a(hybrid ? M : 0), e(column ? M : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const T *gs = G.at(b, h), *qs = Q.at(b, h), *ks = K.at(b, h), *vs = Vv.at(b, h);
      T *dqs = DQ.at(b, h), *dks = DK.at(b, h), *dvv = DV.at(b, h);
      const T* cs = c_all + bh * N;
      const T* rds = rd_all + bh * M;
      const T* rus = hybrid ? ru_all + bh * M : nullptr;
      const T uu = hybrid ? u_all[bh] : T(1);
      padding_bias<T>(kpm, b, N, kbias.data());
      for (int64_t j = 0; j < N; ++j) cbias[j] = kbias[j] - cs[j];
      T cmax = 0;  // the forward's choice, from the same c and padding
      const bool fold = hybrid && fold_factors<T>(cs, kbias.data(), N, bfac.data(), cmax);
      const Mix mix = !hybrid ? Mix::none : fold ? Mix::fold : Mix::exp;
      // Row sums from the saved outputs (dropout included): D_i = g_i . out_i; HNAS Dd_i =
      // g_i . Od_i and Eu_i = g_i . out_i - u Dd_i = (1 - u) Du_i.
      for (int64_t i = 0; i < M; ++i) {
        const T go = dot(gs + i * G.row, O.at(b, h) + i * O.row, dvs);
        Dd[i] = hybrid ? dot(gs + i * G.row, OD->at(b, h) + i * OD->row, dvs) : go;
        Du[i] = T(0);
        if (hybrid) {
          Eu[i] = go - uu * Dd[i];
          a[i] = fold ? fold_row_factor(cmax, rds[i], rus[i]) : T(0);
        }
        if (column) e[i] = std::isinf(rds[i]) ? T(0) : std::exp(rds[i]);  // rd <= log N
      }

      for (int64_t j0 = 0; j0 < N; j0 += cols) {
        const int64_t nj = std::min(cols, N - j0);
        gemm<T>(false, true, M, nj, d, scale, qs, Q.row, ks + j0 * K.row, K.row, T(0), X.data(), nj);
        gemm<T>(false, true, M, nj, dvs, T(1), gs, G.row, vs + j0 * Vv.row, Vv.row, T(0), D.data(), nj);
        const T* keep_row = drop.active() ? keep.data() : nullptr;
        if (!column) {  // UNAS: ds = P (dP~ - D), X <- P~
          for (int64_t i = 0; i < M; ++i) {
            if (keep_row) drop.row<T>(bh, i, keep.data(), j0, nj);
            unas_grad_row<T>(X.data() + i * nj, D.data() + i * nj, kbias.data() + j0, rds[i],
                             Dd[i], keep_row, nj);
          }
        } else {
          GradRow<T> r{};
          r.u = uu;
          r.cb = cbias.data() + j0;
          r.kb = kbias.data() + j0;
          r.b = hybrid ? bfac.data() + j0 : nullptr;
          std::fill(col.begin(), col.begin() + nj, T(0));
          auto row = [&](int64_t i) {  // the row's scalars
            r.rd = rds[i], r.dd = Dd[i], r.e = e[i];
            if (hybrid) r.ru = rus[i], r.a = a[i], r.eu = Eu[i];
          };
          for (int64_t i = 0; i < M; ++i) {
            row(i);
            if (keep_row) drop.row<T>(bh, i, keep.data(), j0, nj);
            r.keep = keep_row;
            T* x = X.data() + i * nj;
            T* dp = D.data() + i * nj;
            T* w = own_w ? W.data() + i * nj : nullptr;
            switch (mix) {
              case Mix::none: grad_sweep_a<T, Mix::none>(r, x, dp, w, col.data(), nj); break;
              case Mix::fold: Du[i] += grad_sweep_a<T, Mix::fold>(r, x, dp, w, col.data(), nj); break;
              case Mix::exp: Du[i] += grad_sweep_a<T, Mix::exp>(r, x, dp, w, col.data(), nj); break;
            }
          }
          for (int64_t t = 0; t < nj; ++t) dldc[t] = -uu * col[t];
          for (int64_t i = 0; i < M; ++i) {
            row(i);
            const T* x = X.data() + i * nj;
            T* dp = D.data() + i * nj;
            switch (mix) {
              case Mix::none: grad_sweep_b<T, Mix::none>(r, x, dp, dldc.data(), nj); break;
              case Mix::fold: grad_sweep_b<T, Mix::fold>(r, x, dp, dldc.data(), nj); break;
              case Mix::exp: grad_sweep_b<T, Mix::exp>(r, x, dp, dldc.data(), nj); break;
            }
          }
        }
        // dv_J = W~^T g, dk_J = scale ds^T q, dq += scale ds k_J
        const T* wt = own_w ? W.data() : X.data();
        gemm<T>(true, false, nj, dvs, M, T(1), wt, nj, gs, G.row, T(0), dvv + j0 * DV.row, DV.row);
        gemm<T>(true, false, nj, d, M, scale, D.data(), nj, qs, Q.row, T(0), dks + j0 * DK.row, DK.row);
        gemm<T>(false, false, M, d, nj, scale, D.data(), nj, ks + j0 * K.row, K.row, T(1), dqs, DQ.row);
      }
      if (hybrid) {
        T acc = 0;
        for (int64_t i = 0; i < M; ++i) acc += Dd[i] - Du[i];
        du_all[bh] = acc;
      }
    }
  });
}

}  // namespace
