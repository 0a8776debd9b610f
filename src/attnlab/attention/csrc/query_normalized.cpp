// Fused DNAS / HNAS attention for the CPU: forward and backward without any S_q x S_k tensor.
//
// Per batch item b and head h, with scale = 1/sqrt(d), scores s_ij = scale q_i.k_j (i: queries,
// rows; j: keys, columns), padded keys at s = -inf and padded queries left out of every column:
//
//   c_j    = logsumexp_i s_ij                          column pass (over valid queries)
//   Pd_ij  = exp(s_ij - c_j - rd_i)                    DNAS, rd = row logsumexp of s - c
//   Pu_ij  = exp(s_ij - ru_i)                          UNAS, ru = row logsumexp of s
//   out_i  = sum_j W_ij v_j,  W = u Pd + (1 - u) Pu    (DNAS: u = 1, Pu is never computed)
//
// Backward, with g = dL/dout, dP = g v^T and D_i = sum_j P_ij dP_ij (= g_i . out_i per branch):
//
//   dS_ij  = u Pd_ij (dP_ij - Dd_i) + (1 - u) Pu_ij (dP_ij - Du_i)
//   dL/dc_j = -sum_i u Pd_ij (dP_ij - Dd_i)             (c enters the DNAS scores as -c_j)
//   ds_ij  = dS_ij + dL/dc_j xi_ij,  xi_ij = exp(s_ij - c_j) = Pd_ij exp(rd_i)
//   dq = scale ds k,  dk = scale ds^T q,  dv = W^T g,  du = sum_i (Dd_i - Du_i)
//
// dL/dc needs every query before ds is known, so the backward sweeps the query blocks twice:
// pass 1 gets dv and dL/dc, pass 2 gets ds and from it dq, dk. For DNAS, pass 1 needs no dP:
// Dd_i = g_i . out_i comes from the saved output and sum_i Pd_ij dP_ij = v_j . dv_j.
// Block matrix products: forward 3 (column pass, s, W v); backward DNAS 6 (s, Pd^T g; s, g v^T,
// ds k, ds^T q), HNAS 7 (pass 1 needs g v^T too). Standard flash attention: 2 + 5.
//
// Work runs in blocks of `rows` queries (or keys) against every key (or query): one block of
// scores fits in the L2 cache, and row statistics are exact (no online rescaling). Threads
// split the (b, h) pairs; each owns its buffers, and dk, dv of its pairs.
//
// Empty rows (padded query, or every key padded) get out = 0 and r = +inf, so that P = 0 in
// the backward; a column without valid queries gets c = 0. Nothing produces NaN: every exp()
// argument is <= 0 or -inf.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
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

// Rows of queries (or keys) per block: a block of rows x width scores stays in L2 (with its
// companions dP and Pu).
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

// x_j += bias_j; returns max_j x_j.
template <typename T>
T add_bias_max(T* x, const T* bias, int64_t n) {
  using V = Vectorized<T>;
  V vmax(-T(kInf));
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V v = V::loadu(x + j) + V::loadu(bias + j);
    v.store(x + j);
    vmax = at::vec::maximum(vmax, v);
  }
  T m = hmax(vmax);
  for (; j < n; ++j) m = std::max(m, x[j] += bias[j]);
  return m;
}

// x_j <- exp(x_j - m); returns the sum. m finite.
template <typename T>
T exp_sum(T* x, T m, int64_t n) {
  using V = Vectorized<T>;
  V vsum(T(0));
  const V vm(m);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V e = vexp(V::loadu(x + j) - vm);
    e.store(x + j);
    vsum = vsum + e;
  }
  T s = hsum(vsum);
  for (; j < n; ++j) s += x[j] = std::exp(x[j] - m);
  return s;
}

// HNAS forward: x_j += kb_j; mu = max_j x_j, md = max_j (x_j - c_j).
template <typename T>
void add_bias_two_max(T* x, const T* kb, const T* c, int64_t n, T& mu, T& md) {
  using V = Vectorized<T>;
  V vu(-T(kInf)), vd(-T(kInf));
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V v = V::loadu(x + j) + V::loadu(kb + j);
    v.store(x + j);
    vu = at::vec::maximum(vu, v);
    vd = at::vec::maximum(vd, v - V::loadu(c + j));
  }
  mu = hmax(vu);
  md = hmax(vd);
  for (; j < n; ++j) {
    x[j] += kb[j];
    mu = std::max(mu, x[j]);
    md = std::max(md, x[j] - c[j]);
  }
}

// HNAS forward: e_j = exp(x_j - mu), x_j <- exp(x_j - c_j - md); their sums lu, ld.
template <typename T>
void two_exp_sum(T* x, const T* c, T mu, T md, T* e, int64_t n, T& lu, T& ld) {
  using V = Vectorized<T>;
  V su(T(0)), sd(T(0));
  const V vmu(mu), vmd(md);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V v = V::loadu(x + j);
    const V a = vexp(v - vmu), b = vexp(v - V::loadu(c + j) - vmd);
    a.store(e + j);
    b.store(x + j);
    su = su + a;
    sd = sd + b;
  }
  lu = hsum(su);
  ld = hsum(sd);
  for (; j < n; ++j) {
    e[j] = std::exp(x[j] - mu);
    x[j] = std::exp(x[j] - c[j] - md);
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

// DNAS backward pass 1: x_j <- Pd_j = exp(x_j + cb_j - rd) (cb = key bias - c), and
// acc_j += Dd Pd_j. rd = +inf (empty row) gives Pd = 0.
template <typename T>
void dnas_pass1_row(T* x, const T* cb, T rd, T dd, T* acc, int64_t n) {
  using V = Vectorized<T>;
  const V vrd(rd), vdd(dd);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V p = vexp(V::loadu(x + j) + V::loadu(cb + j) - vrd);
    p.store(x + j);
    at::vec::fmadd(vdd, p, V::loadu(acc + j)).store(acc + j);
  }
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] + cb[j] - rd);
    acc[j] += dd * x[j];
  }
}

// HNAS backward pass 1, first sweep: x_j <- Pd_j, pu_j <- Pu_j, acc_j += u Pd_j dP_j;
// returns (Dd, Du) = (sum_j Pd_j dP_j, sum_j Pu_j dP_j). kb = key bias, cb = key bias - c.
template <typename T>
std::pair<T, T> hnas_pass1_row(T* x, T* pu, const T* dp, const T* kb, const T* cb, T rd, T ru,
                               T u, T* acc, int64_t n) {
  using V = Vectorized<T>;
  const V vrd(rd), vru(ru), vu(u);
  V sd(T(0)), su(T(0));
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V s = V::loadu(x + j), g = V::loadu(dp + j);
    const V pd = vexp(s + V::loadu(cb + j) - vrd), pu_v = vexp(s + V::loadu(kb + j) - vru);
    pd.store(x + j);
    pu_v.store(pu + j);
    sd = at::vec::fmadd(pd, g, sd);
    su = at::vec::fmadd(pu_v, g, su);
    at::vec::fmadd(vu * pd, g, V::loadu(acc + j)).store(acc + j);
  }
  T dd = hsum(sd), du = hsum(su);
  for (; j < n; ++j) {
    const T s = x[j];
    x[j] = std::exp(s + cb[j] - rd);
    pu[j] = std::exp(s + kb[j] - ru);
    dd += x[j] * dp[j];
    du += pu[j] * dp[j];
    acc[j] += u * x[j] * dp[j];
  }
  return {dd, du};
}

// HNAS backward pass 1, second sweep: acc_j -= u Dd Pd_j (completing sum_i u Pd (dP - Dd)),
// and x_j <- W_j = u Pd_j + (1 - u) Pu_j.
template <typename T>
void hnas_pass1_finish(T* x, const T* pu, T dd, T u, T* acc, int64_t n) {
  using V = Vectorized<T>;
  const V vud(u * dd), vu(u), v1u(T(1) - u);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V pd = V::loadu(x + j);
    (V::loadu(acc + j) - vud * pd).store(acc + j);
    (vu * pd + v1u * V::loadu(pu + j)).store(x + j);
  }
  for (; j < n; ++j) {
    acc[j] -= u * dd * x[j];
    x[j] = u * x[j] + (T(1) - u) * pu[j];
  }
}

// Backward pass 2: the full score gradient, in place of dp (= dP_j on entry):
//   ds_j = Pd_j (u (dP_j - Dd) + e dLdc_j) + (1 - u) Pu_j (dP_j - Du)
// with Pd_j = exp(x_j + cb_j - rd), Pu_j = exp(x_j + kb_j - ru) (HNAS only: kb non-null), and
// e = exp(rd) (0 on empty rows), so that Pd_j e = xi_j, the column softmax.
template <typename T>
void score_grad_row(const T* x, T* dp, const T* kb, const T* cb, T rd, T ru, T dd, T du, T u,
                    T e, const T* dldc, int64_t n) {
  using V = Vectorized<T>;
  const V vrd(rd), vru(ru), vdd(dd), vdu(du), vu(u), v1u(T(1) - u), ve(e);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V s = V::loadu(x + j), g = V::loadu(dp + j);
    V ds = vexp(s + V::loadu(cb + j) - vrd) * (vu * (g - vdd) + ve * V::loadu(dldc + j));
    if (kb) ds = ds + v1u * vexp(s + V::loadu(kb + j) - vru) * (g - vdu);
    ds.store(dp + j);
  }
  for (; j < n; ++j) {
    T ds = std::exp(x[j] + cb[j] - rd) * (u * (dp[j] - dd) + e * dldc[j]);
    if (kb) ds += (T(1) - u) * std::exp(x[j] + kb[j] - ru) * (dp[j] - du);
    dp[j] = ds;
  }
}

// ---- passes -------------------------------------------------------------------------------

// Column logsumexp c_j over valid queries, for one (b, h): keys as rows of the block, so the
// column statistics are row statistics. A column without valid queries gets c = 0.
template <typename T>
void column_lse(const T* q, int64_t q_row, const T* k, int64_t k_row, const T* query_bias,
                int64_t M, int64_t N, int64_t d, T scale, T* buf, T* c) {
  const int64_t rows = block_rows(M, N, sizeof(T));
  for (int64_t j0 = 0; j0 < N; j0 += rows) {
    const int64_t nb = std::min(rows, N - j0);
    gemm<T>(false, true, nb, M, d, scale, k + j0 * k_row, k_row, q, q_row, T(0), buf, M);
    for (int64_t r = 0; r < nb; ++r) {
      T* x = buf + r * M;
      const T m = add_bias_max(x, query_bias, M);
      c[j0 + r] = std::isinf(m) ? T(0) : m + std::log(exp_sum<T>(x, m, M));
    }
  }
}

template <typename T>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& u, const std::optional<at::Tensor>& kpm,
                  const std::optional<at::Tensor>& qpm, at::Tensor& out, at::Tensor& c,
                  at::Tensor& rd, at::Tensor& ru) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), d = q.size(3),
                dv = v.size(3);
  const bool hybrid = u.has_value();
  const T scale = T(1) / std::sqrt(T(d));
  const Slice<T> Q(q), K(k), V(v), O(out);
  T* c_all = c.data_ptr<T>();
  T* rd_all = rd.data_ptr<T>();
  T* ru_all = hybrid ? ru.data_ptr<T>() : nullptr;
  const T* u_all = hybrid ? u->data_ptr<T>() : nullptr;
  const int64_t rows = block_rows(N, M, sizeof(T));

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> X(rows * N), E(hybrid ? rows * N : 0), colbuf(block_rows(M, N, sizeof(T)) * M);
    std::vector<T> kbias(N), qbias(M), cbias(N), row_scale(rows);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      padding_bias<T>(kpm, b, N, kbias.data());
      padding_bias<T>(qpm, b, M, qbias.data());
      const T *qs = Q.at(b, h), *ks = K.at(b, h), *vs = V.at(b, h);
      T* os = O.at(b, h);
      T* cs = c_all + bh * N;
      T* rds = rd_all + bh * M;
      T* rus = hybrid ? ru_all + bh * M : nullptr;
      const T uu = hybrid ? u_all[bh] : T(1);
      column_lse<T>(qs, Q.row, ks, K.row, qbias.data(), M, N, d, scale, colbuf.data(), cs);
      for (int64_t j = 0; j < N; ++j) cbias[j] = kbias[j] - cs[j];

      for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        gemm<T>(false, true, nb, N, d, scale, qs + i0 * Q.row, Q.row, ks, K.row, T(0), X.data(), N);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * N;
          row_scale[r] = T(1);
          T mu, md;
          if (hybrid) {
            add_bias_two_max(x, kbias.data(), cs, N, mu, md);
          } else {
            md = mu = add_bias_max(x, cbias.data(), N);
          }
          if (std::isinf(qbias[i]) || std::isinf(mu)) {  // padded query / no valid key
            std::fill(x, x + N, T(0));
            rds[i] = T(kInf);
            if (hybrid) rus[i] = T(kInf);
            continue;
          }
          if (hybrid) {
            T lu, ld;
            two_exp_sum<T>(x, cs, mu, md, E.data() + r * N, N, lu, ld);
            axpby<T>(uu / ld, x, (T(1) - uu) / lu, E.data() + r * N, N);
            rus[i] = mu + std::log(lu);
            rds[i] = md + std::log(ld);
          } else {
            const T ld = exp_sum<T>(x, md, N);
            row_scale[r] = T(1) / ld;  // normalize after the product (one sweep less)
            rds[i] = md + std::log(ld);
          }
        }
        T* ob = os + i0 * O.row;
        gemm<T>(false, false, nb, dv, N, T(1), X.data(), N, vs, V.row, T(0), ob, O.row);
        if (!hybrid) {
          for (int64_t r = 0; r < nb; ++r)
            for (int64_t f = 0; f < dv; ++f) ob[r * O.row + f] *= row_scale[r];
        }
      }
    }
  });
}

template <typename T>
void backward_impl(const at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const std::optional<at::Tensor>& u,
                   const at::Tensor& c, const at::Tensor& rd, const at::Tensor& ru,
                   const std::optional<at::Tensor>& kpm, const std::optional<at::Tensor>& qpm,
                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& du) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), d = q.size(3),
                dvs = v.size(3);
  const bool hybrid = u.has_value();
  const T scale = T(1) / std::sqrt(T(d));
  const Slice<T> G(g), Q(q), K(k), Vv(v), DQ(dq), DK(dk), DV(dv);
  const std::optional<Slice<T>> O = hybrid ? std::nullopt : std::optional<Slice<T>>(out);
  const T* c_all = c.data_ptr<T>();
  const T* rd_all = rd.data_ptr<T>();
  const T* ru_all = hybrid ? ru.data_ptr<T>() : nullptr;
  const T* u_all = hybrid ? u->data_ptr<T>() : nullptr;
  T* du_all = hybrid ? du.data_ptr<T>() : nullptr;
  const int64_t rows = block_rows(N, M, sizeof(T));

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    // X: scores, then Pd and W (pass 1); E: Pu (pass 1); D: dP, then ds
    std::vector<T> X(rows * N), E(hybrid ? rows * N : 0), D(rows * N);
    std::vector<T> kbias(N), cbias(N), dldc(N), Dd(M), Du(hybrid ? M : 0);
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
      std::fill(dldc.begin(), dldc.end(), T(0));

      // Pass 1: dv = W^T g and dL/dc. DNAS: Dd_i = g_i . out_i from the saved output, and
      // dL/dc_j = sum_i Pd_ij Dd_i - v_j . dv_j (no dP needed). HNAS needs dP for Dd, Du.
      T du_acc = 0;
      for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        const T* qb = qs + i0 * Q.row;
        const T* gb = gs + i0 * G.row;
        gemm<T>(false, true, nb, N, d, scale, qb, Q.row, ks, K.row, T(0), X.data(), N);
        if (hybrid) gemm<T>(false, true, nb, N, dvs, T(1), gb, G.row, vs, Vv.row, T(0), D.data(), N);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * N;
          if (hybrid) {
            T* pu = E.data() + r * N;
            const auto [dd, du_i] = hnas_pass1_row<T>(x, pu, D.data() + r * N, kbias.data(),
                                                      cbias.data(), rds[i], rus[i], uu, dldc.data(), N);
            hnas_pass1_finish<T>(x, pu, dd, uu, dldc.data(), N);
            Dd[i] = dd;
            Du[i] = du_i;
            du_acc += dd - du_i;
          } else {
            Dd[i] = dot(gb + r * G.row, O->at(b, h) + i * O->row, dvs);
            dnas_pass1_row<T>(x, cbias.data(), rds[i], Dd[i], dldc.data(), N);
          }
        }
        gemm<T>(true, false, N, dvs, nb, T(1), X.data(), N, gb, G.row, T(1), dvv, DV.row);
      }
      if (hybrid) {
        du_all[bh] = du_acc;
        for (int64_t j = 0; j < N; ++j) dldc[j] = -dldc[j];
      } else {
        for (int64_t j = 0; j < N; ++j) dldc[j] -= dot(vs + j * Vv.row, dvv + j * DV.row, dvs);
      }

      // Pass 2: ds = dS + dL/dc_j xi_ij, then dq = scale ds k, dk += scale ds^T q.
      for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        const T* qb = qs + i0 * Q.row;
        const T* gb = gs + i0 * G.row;
        gemm<T>(false, true, nb, N, d, scale, qb, Q.row, ks, K.row, T(0), X.data(), N);
        gemm<T>(false, true, nb, N, dvs, T(1), gb, G.row, vs, Vv.row, T(0), D.data(), N);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          const T e = std::isinf(rds[i]) ? T(0) : std::exp(rds[i]);  // rd <= log N: no overflow
          score_grad_row<T>(X.data() + r * N, D.data() + r * N, hybrid ? kbias.data() : nullptr,
                            cbias.data(), rds[i], hybrid ? rus[i] : T(0), Dd[i],
                            hybrid ? Du[i] : T(0), uu, e, dldc.data(), N);
        }
        gemm<T>(false, false, nb, d, N, scale, D.data(), N, ks, K.row, T(0), dqs + i0 * DQ.row, DQ.row);
        gemm<T>(true, false, N, d, nb, scale, D.data(), N, qb, Q.row, T(1), dks, DK.row);
      }
    }
  });
}

// ---- operators ----------------------------------------------------------------------------

std::vector<at::Tensor> check_inputs(const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, H, S, d)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "q, k, v must share one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "the fused DNAS/HNAS kernel runs in float32 or float64");
  auto last_contiguous = [](const at::Tensor& t) {
    return t.stride(-1) == 1 ? t : t.contiguous();
  };
  return {last_contiguous(q), last_contiguous(k), last_contiguous(v)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qn_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& u, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask) {
  auto qkv = check_inputs(q_in, k_in, v_in);
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2);
  // (B, S_q, H, d_v) memory seen as (B, H, S_q, d_v): merging the heads afterwards is a view
  at::Tensor out = at::empty({B, M, H, v.size(3)}, q.options()).transpose(1, 2);
  at::Tensor c = at::empty({B, H, N}, q.options());
  at::Tensor rd = at::empty({B, H, M}, q.options());
  at::Tensor ru = u.has_value() ? at::empty({B, H, M}, q.options()) : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "qn_forward", [&] {
    forward_impl<scalar_t>(q, k, v, u, key_padding_mask, query_padding_mask, out, c, rd, ru);
  });
  return {out, c, rd, ru};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qn_backward(
    const at::Tensor& g_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out, const std::optional<at::Tensor>& u,
    const at::Tensor& c, const at::Tensor& rd, const at::Tensor& ru,
    const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask) {
  auto qkv = check_inputs(q_in, k_in, v_in);
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  const at::Tensor g = g_in.stride(-1) == 1 ? g_in : g_in.contiguous();
  TORCH_CHECK(u.has_value() || out.stride(-1) == 1, "the DNAS backward needs the saved output");
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  at::Tensor du = u.has_value() ? at::zeros({q.size(0), q.size(1)}, q.options())
                                : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "qn_backward", [&] {
    backward_impl<scalar_t>(g, q, k, v, out, u, c, rd, ru, key_padding_mask, query_padding_mask,
                            dq, dk, dv, du);
  });
  return {dq, dk, dv, du};
}

}  // namespace

TORCH_LIBRARY(attnlab, m) {
  m.def("query_normalized_forward(Tensor q, Tensor k, Tensor v, Tensor? u, "
        "Tensor? key_padding_mask, Tensor? query_padding_mask) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("query_normalized_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, "
        "Tensor? u, Tensor c, Tensor rd, Tensor ru, Tensor? key_padding_mask, "
        "Tensor? query_padding_mask) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("query_normalized_forward", qn_forward);
  m.impl("query_normalized_backward", qn_backward);
}
