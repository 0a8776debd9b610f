// HNAS with one exponential per score (query_normalized.cpp): the UNAS weights are the DNAS
// weights times a rank-one factor, so they cost a multiply instead of an exponential.
//
// With b_j = exp(c_j - cmax) (cmax = the largest c_j over valid keys), the DNAS exponential
// ed_ij = exp(s_ij - c_j - md_i) gives the UNAS one as ed_ij b_j = exp(s_ij - md_i - cmax)
// (md_i = 0 in the one-sweep forward, the row maximum in its fallback):
//
//   Pd_ij = ed_ij / ld_i,  Pu_ij = ed_ij b_j / lu_i = Pd_ij a_i b_j,  a_i = ld_i / lu_i
//   rd_i = md_i + log ld_i,  ru_i = md_i + cmax + log lu_i,  a_i = exp(cmax + rd_i - ru_i)
//
// so the mixed weights are W_ij = Pd_ij (u + (1 - u) a_i b_j), and the backward recovers Pu from
// Pd the same way. Safe while the c_j of valid keys span at most kFoldRange: then b_j >= e^-60,
// every UNAS term that matters (Pu_ij > e^-60 of its row's mass) comes from a normal ed_ij
// (the row's largest DNAS term is ed >= e^-20, so lu_i >= e^-80), and a_i <= N e^60 stays
// finite.
// Wider ranges (scores of hundreds) keep the two-exponential sweeps of rows.h.
#pragma once

#include "rows.h"

namespace {

constexpr double kFoldRange = 60.0;

// b_j = exp(c_j - cmax) on valid keys (0 on padded ones) and cmax, or false (fold unsafe, or
// no valid key: every row is empty then).
template <typename T>
bool fold_factors(const T* c, const T* kbias, int64_t n, T* b, T& cmax) {
  T lo = T(kInf), hi = -T(kInf);
  for (int64_t j = 0; j < n; ++j) {
    if (std::isinf(kbias[j])) continue;
    lo = std::min(lo, c[j]);
    hi = std::max(hi, c[j]);
  }
  if (!(hi >= lo && hi - lo <= T(kFoldRange))) return false;
  cmax = hi;
  for (int64_t j = 0; j < n; ++j) b[j] = std::isinf(kbias[j]) ? T(0) : std::exp(c[j] - hi);
  return true;
}

// a_i = exp(cmax + rd_i - ru_i) = Pu_ij / (Pd_ij b_j); 0 on empty rows (rd = ru = +inf).
template <typename T>
T fold_row_factor(T cmax, T rd, T ru) {
  return std::isinf(rd) ? T(0) : std::exp(cmax + rd - ru);
}

// Forward: x_j <- ed_j = exp(l_j - m) (rows.h: exp_sum, whose one-sweep m = 0 and fallback it
// shares); ld = sum_j ed_j, lu = sum_j ed_j b_j. With ld >= bounded_floor, the row's largest ed
// is >= e^-20, so lu >= e^-80 stays a normal float.
template <typename T>
void exp_sum_dot(T* x, const T* cb, T m, const T* b, int64_t n, T& ld, T& lu) {
  using V = Vectorized<T>;
  V sd(T(0)), su(T(0));
  const V vm(m);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V e = vexp(row_logit(x, cb, j) - vm);
    e.store(x + j);
    sd = sd + e;
    su = at::vec::fmadd(e, V::loadu(b + j), su);
  }
  ld = hsum(sd);
  lu = hsum(su);
  for (; j < n; ++j) {
    x[j] = std::exp(row_logit_at(x, cb, j) - m);
    ld += x[j];
    lu += x[j] * b[j];
  }
}

// x_j <- x_j (alpha + beta b_j): from ed to the mixed weights W (alpha = u / ld, beta = (1 - u) / lu;
// a forward with no backward to come, which needs no od).
template <typename T>
void mix_row(T* x, const T* b, T alpha, T beta, int64_t n) {
  using V = Vectorized<T>;
  const V va(alpha), vb(beta);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size())
    (V::loadu(x + j) * at::vec::fmadd(vb, V::loadu(b + j), va)).store(x + j);
  for (; j < n; ++j) x[j] *= alpha + beta * b[j];
}

// VV = [V | b V] (n x 2 dv), whose product with the DNAS weights ed gives, per row, ld Od and
// lu Ou: both branches' outputs from one product.
template <typename T>
void fold_values(const T* v, int64_t v_row, const T* b, int64_t n, int64_t dv, T* vv) {
  for (int64_t j = 0; j < n; ++j) {
    const T* vj = v + j * v_row;
    std::copy(vj, vj + dv, vv + j * 2 * dv);
    for (int64_t f = 0; f < dv; ++f) vv[j * 2 * dv + dv + f] = b[j] * vj[f];
  }
}

}  // namespace
