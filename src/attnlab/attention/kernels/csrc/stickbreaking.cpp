// Stick-breaking attention for the CPU (schemes/stickbreaking.py; Tan et al., arXiv 2410.17980):
// forward and exact backward without any S_q x S_k tensor, causal (top-left aligned), with key /
// query padding. kernels/stickbreaking.py wraps it (autograd, the fallback, the math in words).
//
// Per batch item b and head h, z_ij = scale q_i.k_j; key j is valid for query i when j < i
// (j <= i with attend_current), neither is padded. With s(x) = sigmoid(x) and 1 - s(x) = s(-x):
//
//   A_ij  = s(z_ij) R_ij,   R_ij = prod_{valid k > j} s(-z_ik)   (what the keys nearer i left)
//   out_i = sum_j A_ij v_j
//
// R is carried from the diagonal leftwards, one multiplication per score: in linear space it needs
// one exp and one division per score (e = exp(-|z|), 1 / (1 + e) gives s(z) and s(-z)), where
// the log-space form exp(logsigmoid(z) - sum softplus) needs an exp, a log1p and another exp.
// R only shrinks; once it underflows the row's remaining weights are below the dtype's smallest
// normal, and they flush to 0 (FTZ / DAZ set for the sweep: denormal arithmetic is ~100x slower).
//
// Backward, with g = dL/dout, dA_ij = g_i.v_j, log A_ij = z_ij - sum_{valid k >= j} softplus(z_ik):
//
//   dz_ik = A_ik dA_ik - s(z_ik) P_ik,   P_ik = sum_{j <= k} A_ij dA_ij = D_i - sum_{j > k} A_ij dA_ij
//
// D_i = g_i.out_i (as flash attention's). The sum over j > k is carried leftwards with R, so A is
// recomputed bit for bit as in the forward. dq = scale dz k, dk = scale dz^T q, dv = A^T g.
//
// Layout: a block of nb queries against the keys before its end, stored key-major (X[j][t] =
// z_{i0+t, j}), so the sweep over keys runs down the rows with one vector of queries (lanes) per
// row and the carries R, sum A dA in registers. Products: 2 forward (as flash), 5 backward
// (as flash: recomputed scores, g v^T, dv, dk, dq). Keys after the block's last query are never
// touched, so a causal call does half the work of the full product. Parallel over (b, h).

#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define ATTNLAB_HAS_MXCSR 1
#endif

#include "rows.h"

namespace {

// Flush-to-zero and denormals-are-zero for one thread's sweep, restored after (see the header).
struct FlushDenormals {
#ifdef ATTNLAB_HAS_MXCSR
  unsigned int saved;
  FlushDenormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// Vector chunk of lanes [t, t + count) of a row (missing lanes read as `fill`), and its store.
template <typename T>
inline Vectorized<T> load_lanes(const T* p, int64_t count, T fill) {
  using V = Vectorized<T>;
  if (count == V::size()) return V::loadu(p);
  return V::set(V(fill), V::loadu(p, count), count);
}

template <typename T>
inline void store_lanes(const Vectorized<T>& v, T* p, int64_t count) {
  if (count == Vectorized<T>::size()) v.store(p);
  else v.store(p, count);
}

// The queries per block (lanes): about 2 MiB per key-major buffer at the longest key range, a
// multiple of the vector width (the products stay tall enough, the buffers in the caches).
int64_t lanes_per_block(int64_t n_keys, int64_t n_queries, int64_t elem_bytes, int64_t width) {
  const int64_t budget = 2048 * 1024;
  int64_t rows = std::clamp<int64_t>(budget / std::max<int64_t>(1, n_keys * elem_bytes), width, 256);
  rows = rows / width * width;
  const int64_t need = (std::max<int64_t>(n_queries, 1) + width - 1) / width * width;
  return std::min(rows, need);
}

// Lane masks of one chunk: which lanes are real, unpadded queries (else their z is -inf).
template <typename T>
Vectorized<T> query_bias(const bool* qpad, int64_t i, int64_t count) {
  T bias[Vectorized<T>::size()];
  for (int64_t t = 0; t < Vectorized<T>::size(); ++t)
    bias[t] = (t < count && !(qpad && qpad[i + t])) ? T(0) : -T(kInf);
  return Vectorized<T>::loadu(bias);
}

// One chunk of lanes (queries i0 + c .. i0 + c + count - 1) of a key-major block X (n keys, row
// stride ld): the sweep from the last key any lane sees down to key 0. Forward: X[j] <- A_j.
// Backward (G: the key-major dA, D: the lanes' D_i): X[j] <- A_j, G[j] <- dz_j. Rows past the
// chunk's last visible key are zeroed (the products read all n rows).
template <typename T, bool kBackward>
void sweep(T* X, T* G, const T* D, int64_t ld, int64_t n, int64_t i_first, int64_t count, int64_t off,
           const bool* kpad, const Vectorized<T>& qbias, bool any_qpad) {
  using V = Vectorized<T>;
  const V zero(T(0)), one(T(1));
  // lane t sees key j when j <= i_first + t - off
  const int64_t last = std::min<int64_t>(n - 1, i_first + count - 1 - off);
  for (int64_t j = n - 1; j > last && j >= 0; --j) {
    store_lanes(zero, X + j * ld, count);
    if constexpr (kBackward) store_lanes(zero, G + j * ld, count);
  }
  T lane_pos[V::size()];
  for (int64_t t = 0; t < V::size(); ++t) lane_pos[t] = T(i_first + t - off);
  const V pos = V::loadu(lane_pos);
  V rem(T(1)), after(T(0));
  const V d = kBackward ? load_lanes(D, count, T(0)) : zero;
  for (int64_t j = last; j >= 0; --j) {
    T* xr = X + j * ld;
    if (kpad && kpad[j]) {  // a padded key takes no share and breaks none of the stick
      store_lanes(zero, xr, count);
      if constexpr (kBackward) store_lanes(zero, G + j * ld, count);
      continue;
    }
    V z = load_lanes(xr, count, -T(kInf));
    if (any_qpad) z = z + qbias;
    if (j > i_first - off) z = V::blendv(V(-T(kInf)), z, pos >= V(T(j)));  // the diagonal block
    const V e = vexp(-z.abs());  // in (0, 1]; 0 at z = -inf
    const V r = one / (one + e);
    const V er = e * r;
    const V nonneg = z >= zero;
    const V s_pos = V::blendv(er, r, nonneg);  // sigmoid(z)
    const V s_neg = V::blendv(r, er, nonneg);  // sigmoid(-z) = 1 - sigmoid(z)
    const V a = s_pos * rem;
    rem = rem * s_neg;
    store_lanes(a, xr, count);
    if constexpr (kBackward) {
      T* gr = G + j * ld;
      const V ag = a * load_lanes(gr, count, T(0));
      store_lanes(ag - s_pos * (d - after), gr, count);
      after = after + ag;
    }
  }
}

at::Tensor last_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
           const std::optional<at::Tensor>& kpm, const std::optional<at::Tensor>& qpm) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, H, S, d)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "q, k, v must share one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "the stick-breaking kernel runs in float32 or float64");
  TORCH_CHECK(k.size(2) == v.size(2) && q.size(3) == k.size(3), "k, v lengths or q, k widths differ");
  if (kpm) TORCH_CHECK(kpm->is_contiguous() && kpm->scalar_type() == at::kBool &&
                       kpm->numel() == q.size(0) * k.size(2), "key_padding_mask: contiguous bool (B, S_k)");
  if (qpm) TORCH_CHECK(qpm->is_contiguous() && qpm->scalar_type() == at::kBool &&
                       qpm->numel() == q.size(0) * q.size(2), "query_padding_mask: contiguous bool (B, S_q)");
}

// Forward (g null) or backward (g: dL/dout; dq, dk, dv zeroed) over every (b, h).
template <typename T, bool kBackward>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
         const std::optional<at::Tensor>& kpm, const std::optional<at::Tensor>& qpm,
         bool attend_current, at::Tensor& out, const at::Tensor* g, at::Tensor* dq, at::Tensor* dk,
         at::Tensor* dv) {
  using V = Vectorized<T>;
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), d = q.size(3),
                dvs = v.size(3);
  const T scale = T(1) / std::sqrt(T(d));
  const int64_t off = attend_current ? 0 : 1;
  const Slice<T> Q(q), K(k), Vv(v), O(out);
  const int64_t nb = lanes_per_block(std::min(M, N), M, sizeof(T), V::size());
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    FlushDenormals flush;
    std::vector<T> X(nb * std::max<int64_t>(N, 1)), G(kBackward ? X.size() : 0), D(kBackward ? nb : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const bool* kpad = kpm ? kpm->data_ptr<bool>() + b * N : nullptr;
      const bool* qpad = qpm ? qpm->data_ptr<bool>() + b * M : nullptr;
      const T *qs = Q.at(b, h), *ks = K.at(b, h), *vs = Vv.at(b, h);
      T* os = O.at(b, h);
      for (int64_t i0 = 0; i0 < M; i0 += nb) {
        const int64_t rows = std::min(nb, M - i0);
        const int64_t n = std::min(i0 + rows, N);  // keys at or past the block's end: no row's
        if (n == 0) {
          if constexpr (!kBackward)
            for (int64_t t = 0; t < rows; ++t) std::fill(os + (i0 + t) * O.row, os + (i0 + t) * O.row + dvs, T(0));
          continue;
        }
        const T* qb = qs + i0 * Q.row;
        gemm<T>(false, true, n, rows, d, scale, ks, K.row, qb, Q.row, T(0), X.data(), nb);
        const T* gb = nullptr;
        if constexpr (kBackward) {
          const Slice<T> Gs(*g);
          gb = Gs.at(b, h) + i0 * Gs.row;
          gemm<T>(false, true, n, rows, dvs, T(1), vs, Vv.row, gb, Gs.row, T(0), G.data(), nb);
          for (int64_t t = 0; t < rows; ++t) D[t] = dot(gb + t * Gs.row, os + (i0 + t) * O.row, dvs);
        }
        for (int64_t c = 0; c < rows; c += V::size()) {
          const int64_t count = std::min<int64_t>(V::size(), rows - c);
          bool any_qpad = count < V::size();
          for (int64_t t = 0; qpad && t < count; ++t) any_qpad |= qpad[i0 + c + t];
          const V qbias = query_bias<T>(qpad, i0 + c, count);
          sweep<T, kBackward>(X.data() + c, kBackward ? G.data() + c : nullptr,
                              kBackward ? D.data() + c : nullptr, nb, n, i0 + c, count, off, kpad,
                              qbias, any_qpad);
        }
        if constexpr (!kBackward) {
          gemm<T>(true, false, rows, dvs, n, T(1), X.data(), nb, vs, Vv.row, T(0), os + i0 * O.row, O.row);
        } else {
          const Slice<T> DQ(*dq), DK(*dk), DV(*dv);
          const int64_t g_row = Slice<T>(*g).row;
          gemm<T>(false, false, n, dvs, rows, T(1), X.data(), nb, gb, g_row, T(1), DV.at(b, h), DV.row);
          gemm<T>(false, false, n, d, rows, scale, G.data(), nb, qb, Q.row, T(1), DK.at(b, h), DK.row);
          gemm<T>(true, false, rows, d, n, scale, G.data(), nb, ks, K.row, T(0), DQ.at(b, h) + i0 * DQ.row, DQ.row);
        }
      }
    }
  });
}

at::Tensor sb_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                      const std::optional<at::Tensor>& key_padding_mask,
                      const std::optional<at::Tensor>& query_padding_mask, bool attend_current) {
  const at::Tensor q = last_contiguous(q_in), k = last_contiguous(k_in), v = last_contiguous(v_in);
  check(q, k, v, key_padding_mask, query_padding_mask);
  // (B, S_q, H, d_v) memory, as the row-wise kernel's: the heads merge without a copy
  at::Tensor out = at::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.options()).transpose(1, 2);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sb_forward", [&] {
    run<scalar_t, false>(q, k, v, key_padding_mask, query_padding_mask, attend_current, out,
                         nullptr, nullptr, nullptr, nullptr);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sb_backward(
    const at::Tensor& g_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask, bool attend_current) {
  const at::Tensor q = last_contiguous(q_in), k = last_contiguous(k_in), v = last_contiguous(v_in);
  const at::Tensor g = last_contiguous(g_in);
  at::Tensor out = last_contiguous(out_in);
  check(q, k, v, key_padding_mask, query_padding_mask);
  TORCH_CHECK(g.sizes() == out.sizes() && g.scalar_type() == q.scalar_type(),
              "grad must be (B, H, S_q, d_v) in q's dtype");
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sb_backward", [&] {
    run<scalar_t, true>(q, k, v, key_padding_mask, query_padding_mask, attend_current, out, &g,
                        &dq, &dk, &dv);
  });
  return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def("stickbreaking_forward(Tensor q, Tensor k, Tensor v, Tensor? key_padding_mask, "
        "Tensor? query_padding_mask, bool attend_current) -> Tensor");
  m.def("stickbreaking_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, "
        "Tensor? key_padding_mask, Tensor? query_padding_mask, bool attend_current) "
        "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("stickbreaking_forward", sb_forward);
  m.impl("stickbreaking_backward", sb_backward);
}
