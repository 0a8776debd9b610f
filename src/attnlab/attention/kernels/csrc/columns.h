// The backward's two sweeps over a block of keys J against every query (query_normalized.cpp).
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

}  // namespace
