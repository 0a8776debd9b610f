// Fused row-wise attention for the CPU (sigmoid, sink, softpick, softmax): forward and exact backward
// without any S_q x S_k tensor, with key / query padding, a causal mask (top-left aligned: row i
// sees keys j <= i) and attention dropout (dropout.h, the same keep mask as everywhere).
//
// Per batch item b and head h, scores s_ij = scale q_i.k_j (masked pairs at -inf), beta_i a
// per-row input (B, H, S_q), g = dL/dout, dP = g v^T, dP~ = dP keep / (1 - p), D_i = g_i . out_i:
//
//   sigmoid   w_ij = sigmoid(s_ij + beta_i)            (beta: the bias, -log n or b_h or 0)
//             ds_ij = w (1 - w) dP~,  dbeta_i = sum_j ds_ij
//   sink      w_ij = exp(s_ij - r_i), r_i = log(exp(beta_i) + sum_j exp(s_ij))  (beta: b_h)
//             ds_ij = w (dP~ - D_i),  dbeta_i = -exp(beta_i - r_i) D_i   (the sink's value is 0)
//   softmax   the sink without its term: r_i = log(sum_j exp(s_ij)), no beta (UNAS where the
//             value is wider than the query, which ATen's flash kernel refuses: diff's maps)
//   softpick  w_ij = relu(e^{s-c} - e^{-c}) / L_i, L_i = sum_valid |e^{s-c} - e^{-c}| + eps, c_i =
//             max(max_j s_ij, 0) (as schemes/softpick.py: eps added to the shifted sum),
//             r_i = c_i + log L_i, w_ij = max(exp(s_ij - r_i) - exp(-r_i), 0)
//             ds_ij = exp(s_ij - r_i) ([s_ij > 0] dP~ - sign(s_ij) D_i), plus, through c_i
//             (= the row max when > 0, whose gradient goes to its argmax), -eps D_i / L_i at
//             (i, argmax_i): the forward returns c and the argmax, and kernels/rowwise.py adds
//             that one entry per row to dq and dk
//   out_i = sum_j w~_ij v_j,  w~ = w keep / (1 - p);  dq = scale ds k, dk = scale ds^T q, dv = w~^T g
//
// Forward: blocks of queries against every key (one
// sweep for sigmoid; max, then exp-and-sum for sink / softpick, normalized after the product);
// backward: blocks of keys against every query (rows.h, backward.h), five products as flash.
// Causal: a block of rows [i0, i1) computes the keys j < i1 only, a block of keys [j0, j1) the
// queries i >= j0 only (about half the work at S_q = S_k); only the diagonal's own pairs are
// masked. The dropout mask is a function of (b, h, i, j) alone, so skipping changes none of it.
// Rows of padded queries, and rows without a valid key, give 0 and no gradient, never NaN:
// every exp() argument is <= 0 or -inf (sigmoid: exp(-|t|)).

#include <ATen/Parallel.h>
#include <torch/library.h>

#include "dropout.h"
#include "rows.h"

namespace {

enum Kind : int64_t { kSigmoid = 0, kSink = 1, kSoftpick = 2, kSoftmax = 3 };

// Vector chunk j of a row of n (count lanes valid; the rest read as `fill`), and its store.
template <typename T>
inline Vectorized<T> ld(const T* p, int64_t j, int64_t count, T fill) {
  using V = Vectorized<T>;
  if (count == V::size()) return V::loadu(p + j);
  return V::set(V(fill), V::loadu(p + j, count), count);
}

template <typename T>
inline void st(const Vectorized<T>& v, T* p, int64_t j, int64_t count) {
  if (count == Vectorized<T>::size()) v.store(p + j);
  else v.store(p + j, count);
}

template <typename T, typename F>
inline void chunks(int64_t n, F f) {
  constexpr int64_t W = Vectorized<T>::size();
  int64_t j = 0;
  for (; j + W <= n; j += W) f(j, W);
  if (j < n) f(j, n - j);
}

template <typename T>
inline Vectorized<T> vsigmoid(const Vectorized<T>& t) {
  using V = Vectorized<T>;
  const V e = vexp(-t.abs());  // <= 1; exp(-inf) = 0
  return V::blendv(e, V(T(1)), t >= V(T(0))) / (V(T(1)) + e);
}

template <typename T>
inline Vectorized<T> vsign(const Vectorized<T>& s) {
  using V = Vectorized<T>;
  return V::blendv(V::blendv(V(T(0)), V(T(-1)), s < V(T(0))), V(T(1)), s > V(T(0)));
}

// Scores of a block: rows i0 .. i0 + nb - 1 (queries) against keys j0 .. j0 + nj - 1: + key
// padding bias, -inf past the causal diagonal.
template <typename T>
void mask_block(T* x, int64_t ld_x, int64_t i0, int64_t nb, int64_t j0, int64_t nj, const T* kb,
                bool causal) {
  for (int64_t r = 0; r < nb; ++r) {
    T* row = x + r * ld_x;
    chunks<T>(nj, [&](int64_t j, int64_t c) {
      st(ld(row, j, c, T(0)) + ld(kb + j0, j, c, T(0)), row, j, c);
    });
    if (causal) {
      const int64_t first = std::max<int64_t>(i0 + r + 1 - j0, 0);  // keys j > i are masked
      for (int64_t t = first; t < nj; ++t) row[t] = -T(kInf);
    }
  }
}

template <typename T>
T row_max(const T* x, int64_t n) {
  using V = Vectorized<T>;
  V m(-T(kInf));
  chunks<T>(n, [&](int64_t j, int64_t c) { m = at::vec::maximum(m, ld(x, j, c, -T(kInf))); });
  return hmax(m);
}

template <typename T>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t kind,
                  const T* beta_all, const std::optional<at::Tensor>& kpm,
                  const std::optional<at::Tensor>& qpm, bool causal, T eps, const Dropout& drop,
                  at::Tensor& out, at::Tensor& r_t, at::Tensor& c_t, at::Tensor& idx_t) {
  using V = Vectorized<T>;
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), d = q.size(3),
                dv = v.size(3);
  const T scale = T(1) / std::sqrt(T(d));
  const Slice<T> Q(q), K(k), Vs(v), O(out);
  T* r_all = r_t.data_ptr<T>();
  T* c_all = kind == kSoftpick ? c_t.data_ptr<T>() : nullptr;
  int64_t* idx_all = kind == kSoftpick ? idx_t.data_ptr<int64_t>() : nullptr;
  const int64_t rows = block_rows(N, M, sizeof(T));

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> X(rows * N), kbias(N), qbias(M), keep(drop.active() ? N : 0), row_scale(rows);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      padding_bias<T>(kpm, b, N, kbias.data());
      padding_bias<T>(qpm, b, M, qbias.data());
      const T *qs = Q.at(b, h), *ks = K.at(b, h), *vs = Vs.at(b, h);
      T* os = O.at(b, h);
      T* rs = r_all + bh * M;
      const T* beta = beta_all ? beta_all + bh * M : nullptr;
      for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        // causal: the block's last row, i0 + nb - 1, sees keys j <= i0 + nb - 1; the keys after
        // are masked for every row of the block, so their scores are never computed
        const int64_t n = causal ? std::min(N, i0 + nb) : N;
        gemm<T>(false, true, nb, n, d, scale, qs + i0 * Q.row, Q.row, ks, K.row, T(0), X.data(), n);
        mask_block<T>(X.data(), n, i0, nb, 0, n, kbias.data(), causal);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * n;
          if (std::isinf(qbias[i])) {  // padded query: out 0, r = +inf
            std::fill(x, x + n, T(0));
            row_scale[r] = T(0);
            rs[i] = T(kInf);
            if (c_all) c_all[bh * M + i] = T(0), idx_all[bh * M + i] = 0;
            continue;
          }
          if (kind == kSigmoid) {
            const V vb(beta[i]);
            chunks<T>(n, [&](int64_t j, int64_t c) { st(vsigmoid(ld(x, j, c, T(0)) + vb), x, j, c); });
            row_scale[r] = T(1);
            rs[i] = T(0);
          } else if (kind == kSink || kind == kSoftmax) {
            const T mx = row_max(x, n);
            const T m = kind == kSink ? std::max(mx, beta[i]) : mx;  // beta finite
            if (std::isinf(m)) {  // softmax, no valid key: out 0, r = +inf (no gradient)
              std::fill(x, x + n, T(0));
              row_scale[r] = T(0);
              rs[i] = T(kInf);
              continue;
            }
            const V vm(m);
            V sum(T(0));
            chunks<T>(n, [&](int64_t j, int64_t c) {
              const V e = vexp(ld(x, j, c, -T(kInf)) - vm);
              st(e, x, j, c);
              sum = sum + e;
            });
            const T l = hsum(sum) + (kind == kSink ? std::exp(beta[i] - m) : T(0));
            row_scale[r] = T(1) / l;
            rs[i] = m + std::log(l);
          } else {  // softpick
            const T mx = row_max(x, n);
            const T m = std::max(mx, T(0));
            const T e0 = std::exp(-m);
            c_all[bh * M + i] = m;
            int64_t arg = 0;
            if (mx > T(0)) while (x[arg] != mx) ++arg;  // the first maximum (before the sweep)
            idx_all[bh * M + i] = arg;
            const V vm(m), ve0(e0), zero(T(0)), ninf(-T(kInf));
            V sum(T(0));
            chunks<T>(n, [&](int64_t j, int64_t c) {
              const V s = ld(x, j, c, -T(kInf));
              const V a = vexp(s - vm) - ve0;
              sum = sum + V::blendv(zero, a.abs(), s > ninf);  // valid keys only
              st(at::vec::maximum(a, zero), x, j, c);
            });
            const T l = hsum(sum) + eps;
            row_scale[r] = T(1) / l;
            rs[i] = m + std::log(l);
          }
          if (drop.active()) {  // the keep mask of (i, j) for j < n: the same as without skipping
            drop.row<T>(bh, i, keep.data(), 0, n);
            mul_row<T>(x, keep.data(), n);
          }
        }
        T* ob = os + i0 * O.row;
        gemm<T>(false, false, nb, dv, n, T(1), X.data(), n, vs, Vs.row, T(0), ob, O.row);
        for (int64_t r = 0; r < nb; ++r)
          for (int64_t f = 0; f < dv; ++f) ob[r * O.row + f] *= row_scale[r];
      }
    }
  });
}

// One row of a backward block: x holds s on entry and w~ after; dp holds dP, then ds.
// Returns the row's sum of ds (sigmoid's dbeta part).
template <typename T>
T grad_row(int64_t kind, T* x, T* dp, T beta, T r, T D, const T* keep, int64_t n) {
  using V = Vectorized<T>;
  V acc(T(0));
  const V vb(beta), vr(r), vD(D), zero(T(0)), one(T(1));
  const V er(kind == kSoftpick ? std::exp(-r) : T(0));
  chunks<T>(n, [&](int64_t j, int64_t c) {
    const V s = ld(x, j, c, -T(kInf));
    V g = ld(dp, j, c, T(0));
    V kp = one;
    if (keep) {
      kp = ld(keep, j, c, T(0));
      g = g * kp;
    }
    V w, ds;
    if (kind == kSigmoid) {
      w = vsigmoid(s + vb);
      ds = w * (one - w) * g;
      acc = acc + ds;
    } else if (kind == kSink || kind == kSoftmax) {
      w = vexp(s - vr);
      ds = w * (g - vD);
    } else {
      const V e = vexp(s - vr);
      const V pos = s > zero;
      w = V::blendv(zero, e - er, pos);
      ds = e * (V::blendv(zero, g, pos) - vsign(s) * vD);
    }
    st(keep ? w * kp : w, x, j, c);
    st(ds, dp, j, c);
  });
  return hsum(acc);
}

template <typename T>
void backward_impl(const at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& r_t, int64_t kind,
                   const T* beta_all, const std::optional<at::Tensor>& kpm,
                   const std::optional<at::Tensor>& qpm, bool causal, const Dropout& drop,
                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dbeta) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), d = q.size(3),
                dvs = v.size(3);
  const T scale = T(1) / std::sqrt(T(d));
  const Slice<T> G(g), Q(q), K(k), Vv(v), O(out), DQ(dq), DK(dk), DV(dv);
  const T* r_all = r_t.data_ptr<T>();
  T* db_all = dbeta.data_ptr<T>();
  const int64_t cols = block_rows(M, N, sizeof(T));  // keys per block

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> X(M * cols), Dp(M * cols), keep(drop.active() ? cols : 0), kbias(N), qbias(M);
    std::vector<T> Drow(M);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const T *gs = G.at(b, h), *qs = Q.at(b, h), *ks = K.at(b, h), *vs = Vv.at(b, h);
      T *dqs = DQ.at(b, h), *dks = DK.at(b, h), *dvv = DV.at(b, h);
      const T* rs = r_all + bh * M;
      const T* beta = beta_all ? beta_all + bh * M : nullptr;
      T* db = db_all + bh * M;
      padding_bias<T>(kpm, b, N, kbias.data());
      padding_bias<T>(qpm, b, M, qbias.data());
      for (int64_t i = 0; i < M; ++i) {
        Drow[i] = kind == kSigmoid ? T(0) : dot(gs + i * G.row, O.at(b, h) + i * O.row, dvs);
        const bool live = !std::isinf(qbias[i]) && !std::isinf(rs[i]);
        db[i] = kind == kSink && live ? -std::exp(beta[i] - rs[i]) * Drow[i] : T(0);
      }
      for (int64_t j0 = 0; j0 < N; j0 += cols) {
        const int64_t nj = std::min(cols, N - j0);
        // causal: key j is seen by the queries i >= j only, so the block's keys by i >= j0; the
        // queries before have no weight on it (their ds and w~ are 0) and are skipped. With
        // S_q <= j0 no query sees the block: its dk and dv stay 0.
        const int64_t i0 = causal ? std::min(j0, M) : 0, m = M - i0;
        if (m == 0) continue;
        const T* qb = qs + i0 * Q.row;
        const T* gb = gs + i0 * G.row;
        gemm<T>(false, true, m, nj, d, scale, qb, Q.row, ks + j0 * K.row, K.row, T(0), X.data(), nj);
        gemm<T>(false, true, m, nj, dvs, T(1), gb, G.row, vs + j0 * Vv.row, Vv.row, T(0), Dp.data(), nj);
        mask_block<T>(X.data(), nj, i0, m, j0, nj, kbias.data(), causal);
        for (int64_t r = 0; r < m; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * nj;
          T* dp = Dp.data() + r * nj;
          if (std::isinf(qbias[i])) {  // padded query: no weight, no gradient
            std::fill(x, x + nj, T(0));
            std::fill(dp, dp + nj, T(0));
            continue;
          }
          if (drop.active()) drop.row<T>(bh, i, keep.data(), j0, nj);  // (i, j) as the forward's
          const T sum = grad_row<T>(kind, x, dp, beta ? beta[i] : T(0), rs[i], Drow[i],
                                    drop.active() ? keep.data() : nullptr, nj);
          if (kind == kSigmoid) db[i] += sum;
        }
        // dv_J = w~^T g, dk_J = scale ds^T q, dq += scale ds k_J (over the queries i >= i0)
        gemm<T>(true, false, nj, dvs, m, T(1), X.data(), nj, gb, G.row, T(0), dvv + j0 * DV.row, DV.row);
        gemm<T>(true, false, nj, d, m, scale, Dp.data(), nj, qb, Q.row, T(0), dks + j0 * DK.row, DK.row);
        gemm<T>(false, false, m, d, nj, scale, Dp.data(), nj, ks + j0 * K.row, K.row, T(1),
                dqs + i0 * DQ.row, DQ.row);
      }
    }
  });
}

at::Tensor last_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t kind,
           const std::optional<at::Tensor>& beta) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, H, S, d)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "q, k, v must share one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "the fused row-wise kernel runs in float32 or float64");
  TORCH_CHECK(kind >= 0 && kind <= 3, "kind: 0 sigmoid, 1 sink, 2 softpick, 3 softmax");
  TORCH_CHECK(kind >= kSoftpick || beta.has_value(), "sigmoid and sink need beta (B, H, S_q)");
  if (beta.has_value())
    TORCH_CHECK(beta->is_contiguous() && beta->scalar_type() == q.scalar_type() &&
                    beta->numel() == q.size(0) * q.size(1) * q.size(2),
                "beta must be a contiguous (B, H, S_q) tensor in q's dtype");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rw_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, int64_t kind,
    const std::optional<at::Tensor>& beta, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask, bool causal, double eps, double dropout_p,
    int64_t seed, const std::optional<at::Tensor>& keep_mask) {
  const at::Tensor q = last_contiguous(q_in), k = last_contiguous(k_in), v = last_contiguous(v_in);
  check(q, k, v, kind, beta);
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2);
  const Dropout drop(dropout_p, seed, keep_mask, M, N);
  at::Tensor out = at::empty({B, M, H, v.size(3)}, q.options()).transpose(1, 2);
  at::Tensor r = at::empty({B, H, M}, q.options());
  // softpick: the shift c_i and the argmax of row i (the gradient through c), else empty
  const bool pick = kind == kSoftpick;
  at::Tensor c = pick ? at::empty({B, H, M}, q.options()) : at::empty({0}, q.options());
  at::Tensor idx = at::empty({pick ? B * H * M : 0}, q.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rw_forward", [&] {
    forward_impl<scalar_t>(q, k, v, kind, beta ? beta->data_ptr<scalar_t>() : nullptr,
                           key_padding_mask, query_padding_mask, causal, scalar_t(eps), drop, out, r, c, idx);
  });
  return {out, r, c, idx.view({pick ? B : 0, pick ? H : 0, pick ? M : 0})};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rw_backward(
    const at::Tensor& g_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out, const at::Tensor& r, int64_t kind,
    const std::optional<at::Tensor>& beta, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask, bool causal, double dropout_p,
    int64_t seed, const std::optional<at::Tensor>& keep_mask) {
  const at::Tensor q = last_contiguous(q_in), k = last_contiguous(k_in), v = last_contiguous(v_in);
  const at::Tensor g = last_contiguous(g_in);
  check(q, k, v, kind, beta);
  TORCH_CHECK(out.stride(-1) == 1 && r.is_contiguous(), "the backward needs the saved out and r");
  const Dropout drop(dropout_p, seed, keep_mask, q.size(2), k.size(2));
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  at::Tensor dbeta = at::zeros({q.size(0), q.size(1), q.size(2)}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rw_backward", [&] {
    backward_impl<scalar_t>(g, q, k, v, out, r, kind, beta ? beta->data_ptr<scalar_t>() : nullptr,
                            key_padding_mask, query_padding_mask, causal, drop, dq, dk, dv, dbeta);
  });
  return {dq, dk, dv, dbeta};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def("rowwise_forward(Tensor q, Tensor k, Tensor v, int kind, Tensor? beta, "
        "Tensor? key_padding_mask, Tensor? query_padding_mask, bool causal, float eps, "
        "float dropout_p, int seed, Tensor? keep_mask) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("rowwise_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor r, "
        "int kind, Tensor? beta, Tensor? key_padding_mask, Tensor? query_padding_mask, "
        "bool causal, float dropout_p, int seed, Tensor? keep_mask) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("rowwise_forward", rw_forward);
  m.impl("rowwise_backward", rw_backward);
}
