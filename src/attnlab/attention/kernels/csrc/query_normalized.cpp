// Fused UNAS / DNAS / HNAS attention for the CPU, with attention dropout: forward and backward
// without any S_q x S_k tensor. (UNAS runs here only where ATen's flash kernel does not serve:
// attention dropout, and scores too large for it; see attnlab.attention.paths.)
//
// Per batch item b and head h, with scale = 1/sqrt(d), scores s_ij = scale q_i.k_j (i: queries,
// rows; j: keys, columns), padded keys at s = -inf and padded queries left out of every column:
//
//   c_j    = logsumexp_i s_ij                          column pass (over valid queries; UNAS: 0)
//   Pd_ij  = exp(s_ij - c_j - rd_i)                    DNAS, rd = row logsumexp of s - c
//   Pu_ij  = exp(s_ij - ru_i)                          UNAS, ru = row logsumexp of s
//   W      = u Pd + (1 - u) Pu                         (DNAS: u = 1, Pu is never computed)
//   out_i  = sum_j W~_ij v_j,  W~ = W * keep / (1 - p) (attention dropout, one mask; p = 0: W)
//
// Backward, with g = dL/dout, dP = g v^T, dP~ = dP * keep / (1 - p) and
// D_i = sum_j P_ij dP~_ij (= g_i . out_i when the output is one branch):
//
//   dS_ij  = u Pd_ij (dP~_ij - Dd_i) + (1 - u) Pu_ij (dP~_ij - Du_i)
//   dL/dc_j = -sum_i u Pd_ij (dP~_ij - Dd_i)            (c enters the DNAS scores as -c_j)
//   ds_ij  = dS_ij + dL/dc_j xi_ij,  xi_ij = exp(s_ij - c_j) = Pd_ij exp(rd_i)
//   dq = scale ds k,  dk = scale ds^T q,  dv = W~^T g,  du = sum_i (Dd_i - Du_i)
//
// dL/dc needs every query before ds is known, so the backward sweeps the query blocks twice:
// pass 1 gets dv and dL/dc, pass 2 gets ds and from it dq, dk (UNAS: pass 2 only, with dv).
// For DNAS, pass 1 needs no dP: Dd_i = g_i . out_i comes from the saved output and
// sum_i Pd_ij dP~_ij = v_j . dv_j (dropout included, since dv is built from W~).
// Block matrix products: forward 3 (column pass, s, W v); backward DNAS 6 (s, Pd^T g; s, g v^T,
// ds k, ds^T q), HNAS 7 (pass 1 needs g v^T too), UNAS 5. Standard flash attention: 2 + 5.
// Exponentials per score: DNAS and HNAS 2 + 2 (column pass and rows; one per backward pass):
// HNAS gets Pu from Pd by a rank-one factor (fold.h) and mixes W before its one W v product.
// Flash: 1 + 1. (HNAS falls back to separate Pu exponentials when the c_j span > 60, fold.h.)
// Sweeps over a row of scores: the column pass reads each twice and writes nothing (row_lse);
// the DNAS/HNAS row pass exponentiates in one sweep without a row maximum, since s - c <= 0
// (exp_sum with m = 0; a row with every weight below e^-20 is recomputed with its maximum); the
// backward passes one sweep each (HNAS pass 1 plus an axpy for the part that needs Dd).
//
// Work runs in blocks of `rows` queries (or keys) against every key (or query): one block of
// scores fits in the L2 cache, and row statistics are exact (no online rescaling). Threads
// split the (b, h) pairs; each owns its buffers, and dk, dv of its pairs.
//
// Empty rows (padded query, or every key padded) get out = 0 and r = +inf, so that P = 0 in
// the backward; a column without valid queries gets c = 0. Nothing produces NaN: every exp()
// argument is <= 0 or -inf, and s - c is clamped at 0, its exact bound, because the column pass
// and the row pass may round s differently (rows.h, add_bias_max): rd <= log N.

#include <ATen/Parallel.h>
#include <torch/library.h>

#include "dropout.h"
#include "fold.h"

namespace {

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

template <typename T>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& u, const std::optional<at::Tensor>& kpm,
                  const std::optional<at::Tensor>& qpm, bool column, const Dropout& drop,
                  at::Tensor& out, at::Tensor& c, at::Tensor& rd, at::Tensor& ru) {
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
    std::vector<T> X(rows * N), E(hybrid ? rows * N : 0);
    std::vector<T> colbuf(column ? block_rows(M, N, sizeof(T)) * M : 0);
    std::vector<T> kbias(N), qbias(M), cbias(N), row_scale(rows), keep(drop.active() ? N : 0);
    std::vector<T> bfac(hybrid ? N : 0);  // fold.h: Pu = Pd a_i b_j
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
      if (column) {
        column_lse<T>(qs, Q.row, ks, K.row, qpm.has_value() ? qbias.data() : nullptr, M, N, d,
                      scale, colbuf.data(), cs);
      } else {
        std::fill(cs, cs + N, T(0));  // UNAS: the DNAS code with c = 0
      }
      for (int64_t j = 0; j < N; ++j) cbias[j] = kbias[j] - cs[j];
      T cmax = 0;
      const bool fold = hybrid && fold_factors<T>(cs, kbias.data(), N, bfac.data(), cmax);

      for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        gemm<T>(false, true, nb, N, d, scale, qs + i0 * Q.row, Q.row, ks, K.row, T(0), X.data(), N);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * N;
          row_scale[r] = T(1);
          if (std::isinf(qbias[i])) {  // padded query
            std::fill(x, x + N, T(0));
            rds[i] = T(kInf);
            if (hybrid) rus[i] = T(kInf);
            continue;
          }
          // DNAS and folded HNAS: one sweep, no row maximum (exp_sum with m = 0). Rare rows whose
          // weights all fall below e^-20 (or with no valid key) get their scores recomputed
          // and take the sweeps with the maximum.
          bool done = false;
          if (column && (!hybrid || fold)) {
            T ld = 0, lu = 0;
            if (fold) {
              exp_sum_dot<T>(x, cbias.data(), T(0), bfac.data(), N, ld, lu);
            } else {
              ld = exp_sum<T>(x, cbias.data(), T(0), N);
            }
            done = ld >= bounded_floor<T>(N);
            if (done && fold) {
              mix_row<T>(x, bfac.data(), uu / ld, (T(1) - uu) / lu, N);
              rus[i] = cmax + std::log(lu);
            }
            if (done) {
              rds[i] = std::log(ld);
              if (!hybrid) row_scale[r] = T(1) / ld;  // normalize after the product
            } else {
              gemm<T>(false, true, 1, N, d, scale, qs + i * Q.row, Q.row, ks, K.row, T(0), x, N);
            }
          }
          if (!done) {
            T mu, md;
            if (hybrid && !fold) {
              add_bias_two_max(x, kbias.data(), cs, N, mu, md);
            } else {
              md = mu = add_bias_max(x, cbias.data(), N, column ? T(0) : T(kInf));
            }
            if (std::isinf(mu)) {  // no valid key
              std::fill(x, x + N, T(0));
              rds[i] = T(kInf);
              if (hybrid) rus[i] = T(kInf);
              continue;
            }
            if (fold) {  // one exp per score: Pu from Pd (fold.h)
              T lu, ld;
              exp_sum_dot<T>(x, nullptr, md, bfac.data(), N, ld, lu);
              mix_row<T>(x, bfac.data(), uu / ld, (T(1) - uu) / lu, N);
              rus[i] = md + cmax + std::log(lu);
              rds[i] = md + std::log(ld);
            } else if (hybrid) {
              T lu, ld;
              two_exp_sum<T>(x, cs, mu, md, E.data() + r * N, N, lu, ld);
              axpby<T>(uu / ld, x, (T(1) - uu) / lu, E.data() + r * N, N);
              rus[i] = mu + std::log(lu);
              rds[i] = md + std::log(ld);
            } else {
              const T ld = exp_sum<T>(x, nullptr, md, N);
              row_scale[r] = T(1) / ld;  // normalize after the product (one sweep less)
              rds[i] = md + std::log(ld);
            }
          }
          if (drop.active()) {  // after the sums: the normalizers count every key
            drop.row<T>(bh, i, keep.data());
            mul_row<T>(x, keep.data(), N);
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
                   bool column, const Dropout& drop, at::Tensor& dq, at::Tensor& dk,
                   at::Tensor& dv, at::Tensor& du) {
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
    std::vector<T> X(rows * N), E(hybrid ? rows * N : 0), D(rows * N), keep(drop.active() ? N : 0);
    std::vector<T> kbias(N), cbias(N), dldc(N), Dd(M), Du(hybrid ? M : 0), bfac(hybrid ? N : 0);
    T* keep_row = drop.active() ? keep.data() : nullptr;
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
      std::fill(dldc.begin(), dldc.end(), T(0));
      for (int64_t i = 0; !hybrid && i < M; ++i)
        Dd[i] = dot(gs + i * G.row, O->at(b, h) + i * O->row, dvs);

      // Pass 1: dv = W~^T g and dL/dc. DNAS: Dd_i = g_i . out_i from the saved output, and
      // dL/dc_j = sum_i Pd_ij Dd_i - v_j . dv_j (no dP needed). HNAS needs dP for Dd, Du.
      T du_acc = 0;
      for (int64_t i0 = 0; column && i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        const T* qb = qs + i0 * Q.row;
        const T* gb = gs + i0 * G.row;
        gemm<T>(false, true, nb, N, d, scale, qb, Q.row, ks, K.row, T(0), X.data(), N);
        if (hybrid) gemm<T>(false, true, nb, N, dvs, T(1), gb, G.row, vs, Vv.row, T(0), D.data(), N);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * N;
          if (keep_row) drop.row<T>(bh, i, keep_row);
          if (hybrid) {
            T* pu = E.data() + r * N;
            T* dp = D.data() + r * N;
            if (keep_row) mul_row<T>(dp, keep_row, N);
            const T a = fold ? fold_row_factor(cmax, rds[i], rus[i]) : T(0);
            const auto [dd, du_i] =
                fold ? fold_pass1_row<T>(x, dp, cbias.data(), bfac.data(), rds[i], a, uu,
                                         dldc.data(), N)
                     : hnas_pass1_row<T>(x, pu, dp, kbias.data(), cbias.data(), rds[i], rus[i],
                                         uu, dldc.data(), N);
            if (fold) {  // dp holds Pd now
              axpby<T>(T(1), dldc.data(), -uu * dd, dp, N);
            } else {
              hnas_pass1_finish<T>(x, pu, dd, uu, dldc.data(), N);
            }
            Dd[i] = dd;
            Du[i] = du_i;
            du_acc += dd - du_i;
          } else {
            dnas_pass1_row<T>(x, cbias.data(), rds[i], Dd[i], dldc.data(), N);
          }
          if (keep_row) mul_row<T>(x, keep_row, N);  // dv is built from the dropped weights
        }
        gemm<T>(true, false, N, dvs, nb, T(1), X.data(), N, gb, G.row, T(1), dvv, DV.row);
      }
      if (hybrid) {
        du_all[bh] = du_acc;
        for (int64_t j = 0; j < N; ++j) dldc[j] = -dldc[j];
      } else if (column) {
        for (int64_t j = 0; j < N; ++j) dldc[j] -= dot(vs + j * Vv.row, dvv + j * DV.row, dvs);
      }

      // Pass 2: ds = dS + dL/dc_j xi_ij, then dq = scale ds k, dk += scale ds^T q
      // (UNAS: ds = P (dP~ - D) and dv += P~^T g in this same pass).
      for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        const T* qb = qs + i0 * Q.row;
        const T* gb = gs + i0 * G.row;
        gemm<T>(false, true, nb, N, d, scale, qb, Q.row, ks, K.row, T(0), X.data(), N);
        gemm<T>(false, true, nb, N, dvs, T(1), gb, G.row, vs, Vv.row, T(0), D.data(), N);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * N;
          T* dp = D.data() + r * N;
          if (keep_row) drop.row<T>(bh, i, keep_row);
          if (!column) {
            unas_grad_row<T>(x, dp, kbias.data(), rds[i], Dd[i], keep_row, N);
            continue;
          }
          if (keep_row) mul_row<T>(dp, keep_row, N);
          const T e = std::isinf(rds[i]) ? T(0) : std::exp(rds[i]);  // rd <= log N: no overflow
          if (fold) {
            fold_score_grad_row<T>(x, dp, cbias.data(), bfac.data(), rds[i], Dd[i], Du[i], uu,
                                   fold_row_factor(cmax, rds[i], rus[i]), e, dldc.data(), N);
            continue;
          }
          score_grad_row<T>(x, dp, hybrid ? kbias.data() : nullptr, cbias.data(), rds[i],
                            hybrid ? rus[i] : T(0), Dd[i], hybrid ? Du[i] : T(0), uu, e,
                            dldc.data(), N);
        }
        if (!column) gemm<T>(true, false, N, dvs, nb, T(1), X.data(), N, gb, G.row, T(1), dvv, DV.row);
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
              "the fused attention kernel runs in float32 or float64");
  auto last_contiguous = [](const at::Tensor& t) {
    return t.stride(-1) == 1 ? t : t.contiguous();
  };
  return {last_contiguous(q), last_contiguous(k), last_contiguous(v)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qn_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& u, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask, bool column, double dropout_p,
    int64_t seed, const std::optional<at::Tensor>& keep_mask) {
  auto qkv = check_inputs(q_in, k_in, v_in);
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  TORCH_CHECK(column || !u.has_value(), "UNAS (column=false) takes no u");
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2);
  const Dropout drop(dropout_p, seed, keep_mask, M, N);
  // (B, S_q, H, d_v) memory seen as (B, H, S_q, d_v): merging the heads afterwards is a view
  at::Tensor out = at::empty({B, M, H, v.size(3)}, q.options()).transpose(1, 2);
  at::Tensor c = at::empty({B, H, N}, q.options());
  at::Tensor rd = at::empty({B, H, M}, q.options());
  at::Tensor ru = u.has_value() ? at::empty({B, H, M}, q.options()) : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "qn_forward", [&] {
    forward_impl<scalar_t>(q, k, v, u, key_padding_mask, query_padding_mask, column, drop, out, c,
                           rd, ru);
  });
  return {out, c, rd, ru};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qn_backward(
    const at::Tensor& g_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out, const std::optional<at::Tensor>& u,
    const at::Tensor& c, const at::Tensor& rd, const at::Tensor& ru,
    const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask, bool column, double dropout_p,
    int64_t seed, const std::optional<at::Tensor>& keep_mask) {
  auto qkv = check_inputs(q_in, k_in, v_in);
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  const at::Tensor g = g_in.stride(-1) == 1 ? g_in : g_in.contiguous();
  TORCH_CHECK(u.has_value() || out.stride(-1) == 1, "the DNAS/UNAS backward needs the saved output");
  const Dropout drop(dropout_p, seed, keep_mask, q.size(2), k.size(2));
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  at::Tensor du = u.has_value() ? at::zeros({q.size(0), q.size(1)}, q.options())
                                : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "qn_backward", [&] {
    backward_impl<scalar_t>(g, q, k, v, out, u, c, rd, ru, key_padding_mask, query_padding_mask,
                            column, drop, dq, dk, dv, du);
  });
  return {dq, dk, dv, du};
}

}  // namespace

TORCH_LIBRARY(attnlab, m) {
  m.def("query_normalized_forward(Tensor q, Tensor k, Tensor v, Tensor? u, "
        "Tensor? key_padding_mask, Tensor? query_padding_mask, bool column, float dropout_p, "
        "int seed, Tensor? keep_mask) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("query_normalized_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, "
        "Tensor? u, Tensor c, Tensor rd, Tensor ru, Tensor? key_padding_mask, "
        "Tensor? query_padding_mask, bool column, float dropout_p, int seed, Tensor? keep_mask) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("query_normalized_forward", qn_forward);
  m.impl("query_normalized_backward", qn_backward);
}
