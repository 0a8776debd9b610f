// Building blocks of the fused attention CPU kernel (query_normalized.cpp): BLAS, vector
// helpers, the vectorized row sweeps, and the counter-based attention dropout.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

extern "C" {
// BLAS (column-major), exported by libtorch_cpu (MKL). Called inside at::parallel_for, where
// MKL runs single-threaded, as ATen's own flash attention kernel does.
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b,
            const int* ldb, const double* beta, double* c, const int* ldc);
}

namespace {

using at::vec::Vectorized;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Row-major C (m x n) = alpha op(A) op(B) + beta C, as the column-major C^T = op(B)^T op(A)^T.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int M = m, N = n, K = k, LDA = lda, LDB = ldb, LDC = ldc;
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&tb, &ta, &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
  } else {
    dgemm_(&tb, &ta, &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
  }
}

template <typename T>
inline Vectorized<T> vexp(const Vectorized<T>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x.exp_u20();  // rel. error < 1e-6; exp(-inf) = 0 (ATen's flash kernel uses it too)
  } else {
    return x.exp();
  }
}

// Horizontal sum / max of a vector (once per row: not worth intrinsics).
template <typename T>
T hsum(const Vectorized<T>& v) {
  T buf[Vectorized<T>::size()];
  v.store(buf);
  T s = 0;
  for (int64_t i = 0; i < Vectorized<T>::size(); ++i) s += buf[i];
  return s;
}

template <typename T>
T hmax(const Vectorized<T>& v) {
  T buf[Vectorized<T>::size()];
  v.store(buf);
  T m = buf[0];
  for (int64_t i = 1; i < Vectorized<T>::size(); ++i) m = std::max(m, buf[i]);
  return m;
}

template <typename T>
T dot(const T* x, const T* y, int64_t n) {
  T s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j] * y[j];
  return s;
}

// Rows of queries (or keys) per block of rows x width scores: about 2 MiB per buffer (a block
// and its companions, dP and W, stay in the cache hierarchy; tall blocks keep the products
// efficient). The backward asks for keys per block (width S_q; its blocks are stored query-major).
int64_t block_rows(int64_t width, int64_t total, int64_t elem_bytes) {
  const int64_t budget = 2048 * 1024;  // bytes per buffer; measured: 1-4 MiB equally fast, 96 KiB 20% slower
  const int64_t rows = std::clamp<int64_t>(budget / std::max<int64_t>(1, width * elem_bytes), 8, 256);
  return std::min(rows / 8 * 8, std::max<int64_t>(total, 1));
}

// Strided (b, h) slice of a 4-D tensor whose last dim is contiguous.
template <typename T>
struct Slice {
  T* base;
  int64_t sb, sh, row;
  explicit Slice(const at::Tensor& t)
      : base(t.data_ptr<T>()), sb(t.stride(0)), sh(t.stride(1)), row(t.stride(2)) {}
  T* at(int64_t b, int64_t h) const { return base + b * sb + h * sh; }
};

// Additive padding bias of batch item b (n entries): 0, or -inf where padded.
template <typename T>
void padding_bias(const std::optional<at::Tensor>& mask, int64_t b, int64_t n, T* out) {
  if (!mask.has_value()) {
    std::fill(out, out + n, T(0));
    return;
  }
  const bool* m = mask->data_ptr<bool>() + b * n;
  for (int64_t j = 0; j < n; ++j) out[j] = m[j] ? -T(kInf) : T(0);
}

// ---- row sweeps (vectorized over j; x is one row of a score block) --------------------------

// x_j <- min(x_j + bias_j, ceiling); returns max_j x_j. The DNAS log-weights s_ij - c_j are <= 0
// exactly, but the column pass and the row pass compute s_ij with differently shaped products,
// which may round it differently (by hundreds at |s| ~ 1e8): ceiling 0 restores the bound that
// keeps the row LSE rd <= log N and exp(rd) finite. UNAS and the column pass: ceiling +inf.
template <typename T>
T add_bias_max(T* x, const T* bias, int64_t n, T ceiling) {
  using V = Vectorized<T>;
  const V vc(ceiling);
  V vmax(-T(kInf));
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V v = at::vec::minimum(V::loadu(x + j) + V::loadu(bias + j), vc);
    v.store(x + j);
    vmax = at::vec::maximum(vmax, v);
  }
  T m = hmax(vmax);
  for (; j < n; ++j) m = std::max(m, x[j] = std::min(x[j] + bias[j], ceiling));
  return m;
}

// The DNAS log-weight x_j + cb_j = s_j - c_j (+ key bias), clamped at its exact bound 0 (see
// add_bias_max).
template <typename T>
inline Vectorized<T> dnas_logit(const Vectorized<T>& s, const Vectorized<T>& cb) {
  return at::vec::minimum(s + cb, Vectorized<T>(T(0)));
}

// log sum_j exp(x_j + bias_j) without writing x (bias null: none), for the column pass, which
// needs only the sums; -inf when every entry is -inf.
template <typename T>
T row_lse(const T* x, const T* bias, int64_t n) {
  using V = Vectorized<T>;
  auto at_j = [&](int64_t j) { return bias ? V::loadu(x + j) + V::loadu(bias + j) : V::loadu(x + j); };
  V vmax(-T(kInf));
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) vmax = at::vec::maximum(vmax, at_j(j));
  T m = hmax(vmax);
  for (int64_t t = j; t < n; ++t) m = std::max(m, bias ? x[t] + bias[t] : x[t]);
  if (std::isinf(m)) return m;
  const V vm(m);
  V vsum(T(0));
  for (j = 0; j + V::size() <= n; j += V::size()) vsum = vsum + vexp(at_j(j) - vm);
  T s = hsum(vsum);
  for (; j < n; ++j) s += std::exp((bias ? x[j] + bias[j] : x[j]) - m);
  return m + std::log(s);
}

// Column logsumexp c_j over valid queries, for one (b, h): keys as rows of the block, so the
// column statistics are row statistics. A column without valid queries gets c = 0.
// query_bias: null without query padding.
template <typename T>
void column_lse(const T* q, int64_t q_row, const T* k, int64_t k_row, const T* query_bias,
                int64_t M, int64_t N, int64_t d, T scale, T* buf, T* c) {
  const int64_t rows = block_rows(M, N, sizeof(T));
  for (int64_t j0 = 0; j0 < N; j0 += rows) {
    const int64_t nb = std::min(rows, N - j0);
    gemm<T>(false, true, nb, M, d, scale, k + j0 * k_row, k_row, q, q_row, T(0), buf, M);
    for (int64_t r = 0; r < nb; ++r) {
      const T lse = row_lse<T>(buf + r * M, query_bias, M);
      c[j0 + r] = std::isinf(lse) ? T(0) : lse;
    }
  }
}

// The log-weight of a row sweep: x_j + cb_j clamped at 0 (the DNAS log-weight s_j - c_j, see
// dnas_logit), or x_j as it is (cb null: x already holds the log-weights).
template <typename T>
inline Vectorized<T> row_logit(const T* x, const T* cb, int64_t j) {
  return cb ? dnas_logit(Vectorized<T>::loadu(x + j), Vectorized<T>::loadu(cb + j))
            : Vectorized<T>::loadu(x + j);
}

template <typename T>
inline T row_logit_at(const T* x, const T* cb, int64_t j) {
  return cb ? std::min(x[j] + cb[j], T(0)) : x[j];
}

// x_j <- exp(l_j - m) for the row's log-weights l (row_logit); returns the sum. The DNAS row pass
// takes m = 0 in one sweep: its log-weights s_j - c_j are <= 0, so exp() needs no row maximum.
// A row whose sum is then below bounded_floor(n) (every weight under e^-20: a query outweighed
// in every column) has lost precision to underflow and is redone with its maximum (the caller's
// fallback). m finite.
template <typename T>
T exp_sum(T* x, const T* cb, T m, int64_t n) {
  using V = Vectorized<T>;
  V vsum(T(0));
  const V vm(m);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V e = vexp(row_logit(x, cb, j) - vm);
    e.store(x + j);
    vsum = vsum + e;
  }
  T s = hsum(vsum);
  for (; j < n; ++j) s += x[j] = std::exp(row_logit_at(x, cb, j) - m);
  return s;
}

// A row sum of exp_sum with m = 0 at or above this puts the row's largest weight at >= e^-20.
template <typename T>
T bounded_floor(int64_t n) {
  return T(n) * std::exp(T(-20));
}

// HNAS forward: x_j += kb_j; mu = max_j x_j, md = max_j min(x_j - c_j, 0).
template <typename T>
void add_bias_two_max(T* x, const T* kb, const T* c, int64_t n, T& mu, T& md) {
  using V = Vectorized<T>;
  V vu(-T(kInf)), vd(-T(kInf));
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V v = V::loadu(x + j) + V::loadu(kb + j);
    v.store(x + j);
    vu = at::vec::maximum(vu, v);
    vd = at::vec::maximum(vd, dnas_logit(v, -V::loadu(c + j)));
  }
  mu = hmax(vu);
  md = hmax(vd);
  for (; j < n; ++j) {
    x[j] += kb[j];
    mu = std::max(mu, x[j]);
    md = std::max(md, std::min(x[j] - c[j], T(0)));
  }
}

// HNAS forward: e_j = exp(x_j - mu), x_j <- exp(min(x_j - c_j, 0) - md); their sums lu, ld.
template <typename T>
void two_exp_sum(T* x, const T* c, T mu, T md, T* e, int64_t n, T& lu, T& ld) {
  using V = Vectorized<T>;
  V su(T(0)), sd(T(0));
  const V vmu(mu), vmd(md);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V v = V::loadu(x + j);
    const V a = vexp(v - vmu), b = vexp(dnas_logit(v, -V::loadu(c + j)) - vmd);
    a.store(e + j);
    b.store(x + j);
    su = su + a;
    sd = sd + b;
  }
  lu = hsum(su);
  ld = hsum(sd);
  for (; j < n; ++j) {
    e[j] = std::exp(x[j] - mu);
    x[j] = std::exp(std::min(x[j] - c[j], T(0)) - md);
    lu += e[j];
    ld += x[j];
  }
}

// x_j <- a x_j + b y_j.
template <typename T>
void axpby(T a, T* x, T b, const T* y, int64_t n) {
  using V = Vectorized<T>;
  const V va(a), vb(b);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size())
    (va * V::loadu(x + j) + vb * V::loadu(y + j)).store(x + j);
  for (; j < n; ++j) x[j] = a * x[j] + b * y[j];
}

// x_j *= s_j.
template <typename T>
void mul_row(T* x, const T* s, int64_t n) {
  using V = Vectorized<T>;
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) (V::loadu(x + j) * V::loadu(s + j)).store(x + j);
  for (; j < n; ++j) x[j] *= s[j];
}

// UNAS backward row: P_j = exp(x_j + kb_j - r); with dP~ = dP drop (no dropout: drop null),
// dp_j <- ds_j = P_j (dP~_j - D) and x_j <- P_j drop_j, the weights that dv is built from.
// r = +inf (empty row) gives P = 0.
template <typename T>
void unas_grad_row(T* x, T* dp, const T* kb, T r, T D, const T* drop, int64_t n) {
  using V = Vectorized<T>;
  const V vr(r), vD(D);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V p = vexp(V::loadu(x + j) + V::loadu(kb + j) - vr);
    V g = V::loadu(dp + j);
    if (drop) {
      const V s = V::loadu(drop + j);
      g = g * s;
      (p * s).store(x + j);
    } else {
      p.store(x + j);
    }
    (p * (g - vD)).store(dp + j);
  }
  for (; j < n; ++j) {
    const T p = std::exp(x[j] + kb[j] - r);
    const T g = drop ? dp[j] * drop[j] : dp[j];
    x[j] = drop ? p * drop[j] : p;
    dp[j] = p * (g - D);
  }
}

}  // namespace
