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
// Backward, with g = dL/dout, dP = g v^T, dP~ = dP * keep / (1 - p), Dd_i = sum_j Pd_ij dP~_ij
// = g_i . Od_i and Du_i = g_i . Ou_i (Od, Ou: the DNAS and UNAS branches' outputs):
//
//   dS_ij  = u Pd_ij (dP~_ij - Dd_i) + (1 - u) Pu_ij (dP~_ij - Du_i)
//   dL/dc_j = -sum_i u Pd_ij (dP~_ij - Dd_i)            (c enters the DNAS scores as -c_j)
//   ds_ij  = dS_ij + dL/dc_j xi_ij,  xi_ij = exp(s_ij - c_j) = Pd_ij exp(rd_i)
//   dq = scale ds k,  dk = scale ds^T q,  dv = W~^T g,  du = sum_i (Dd_i - Du_i)
//
// The forward saves what the row sums need: out (DNAS and UNAS: Od = out) and, for HNAS, Od
// (one product of width 2 d_v against [V | b V], fold.h; without a backward to come, save_branch
// = false, it mixes W before one product of width d_v instead), so Dd_i = g_i . Od_i and
// (1 - u) Du_i = g_i . out_i - u Dd_i cost no product. The backward then runs over blocks of
// keys against every query, so that the column sums behind dL/dc_j are complete within a
// block: s and dP are computed once, and two sweeps (backward.h) give W~ and dL/dc, then ds.
// Matrix products per score: forward DNAS 3 (column pass, s, W v), HNAS 4 (width 2 d_v), backward
// 5 (s, g v^T, W~^T g, ds^T q, ds k); flash 2 + 5. Exponentials: 2 + 1 (column pass, rows;
// sweep A), flash 1 + 1: Pu = Pd a_i b_j (fold.h; own exponentials when the c_j span > 60).
// Sweeps over a row of scores: the column pass reads each twice and writes nothing (row_lse);
// the DNAS/HNAS row pass exponentiates in one sweep without a row maximum, since s - c <= 0
// (exp_sum with m = 0; a row with every weight below e^-20 is recomputed with its maximum).
//
// Blocks of queries against every key (forward) or of keys against every query (column pass,
// backward): exact row and column statistics. Threads split the (b, h) pairs and own their outputs.
//
// Empty rows (padded query, or every key padded) get out = 0 and r = +inf, so that P = 0 in
// the backward; a column without valid queries gets c = 0. Nothing produces NaN: every exp()
// argument is <= 0 or -inf, and s - c is clamped at 0, its exact bound, because the column pass
// and the row pass may round s differently (rows.h, add_bias_max): rd <= log N.

#include <ATen/Parallel.h>
#include <torch/library.h>

#include "backward.h"
#include "dropout.h"
#include "fold.h"

namespace {

template <typename T>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& u, const std::optional<at::Tensor>& kpm,
                  const std::optional<at::Tensor>& qpm, bool column, bool save_branch,
                  const Dropout& drop, at::Tensor& out, at::Tensor& od, at::Tensor& c,
                  at::Tensor& rd, at::Tensor& ru) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), N = k.size(2), d = q.size(3),
                dv = v.size(3);
  const bool hybrid = u.has_value();
  const T scale = T(1) / std::sqrt(T(d));
  const Slice<T> Q(q), K(k), V(v), O(out);
  const bool branch = hybrid && save_branch;  // HNAS for a backward: od too
  const std::optional<Slice<T>> OD = branch ? std::optional<Slice<T>>(od) : std::nullopt;
  T* c_all = c.data_ptr<T>();
  T* rd_all = rd.data_ptr<T>();
  T* ru_all = hybrid ? ru.data_ptr<T>() : nullptr;
  const T* u_all = hybrid ? u->data_ptr<T>() : nullptr;
  const int64_t rows = block_rows(N, M, sizeof(T));

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> X(rows * N), E(hybrid ? rows * N : 0);
    std::vector<T> colbuf(column ? block_rows(M, N, sizeof(T)) * M : 0);
    std::vector<T> kbias(N), qbias(M), cbias(N), keep(drop.active() ? N : 0);
    // 1 / (row sums) of the DNAS (or UNAS) and, for HNAS, the UNAS weights; 0 on empty rows
    std::vector<T> row_scale(rows), row_scale_u(hybrid ? rows : 0);
    // HNAS: [V | b V] (fold.h: Pu = Pd a_i b_j) and the block's two products with it
    std::vector<T> bfac(hybrid ? N : 0), VV(branch ? N * 2 * dv : 0), OO(branch ? rows * 2 * dv : 0);
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
      if (fold && branch) fold_values<T>(vs, V.row, bfac.data(), N, dv, VV.data());

      for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t nb = std::min(rows, M - i0);
        gemm<T>(false, true, nb, N, d, scale, qs + i0 * Q.row, Q.row, ks, K.row, T(0), X.data(), N);
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t i = i0 + r;
          T* x = X.data() + r * N;
          // the row's sums ld, lu of its weights exp(. - m): row LSEs, and 1/sums (normalized
          // after the products)
          auto set_sums = [&](T m, T ld, T lu, T mu) {
            rds[i] = m + std::log(ld);
            row_scale[r] = T(1) / ld;
            if (hybrid) {
              rus[i] = mu + std::log(lu);
              row_scale_u[r] = T(1) / lu;
            }
          };
          auto empty_row = [&] {  // out = 0, r = +inf (P = 0 in the backward)
            std::fill(x, x + N, T(0));
            if (hybrid && !fold) std::fill(E.data() + r * N, E.data() + (r + 1) * N, T(0));
            rds[i] = T(kInf);
            if (hybrid) rus[i] = T(kInf);
            row_scale[r] = T(0);
            if (hybrid) row_scale_u[r] = T(0);
          };
          if (std::isinf(qbias[i])) {  // padded query
            empty_row();
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
            if (done) {
              set_sums(T(0), ld, lu, cmax);
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
              empty_row();
              continue;
            }
            if (fold) {  // one exp per score: Pu from Pd (fold.h)
              T lu, ld;
              exp_sum_dot<T>(x, nullptr, md, bfac.data(), N, ld, lu);
              set_sums(md, ld, lu, md + cmax);
            } else if (hybrid) {
              T lu, ld;
              two_exp_sum<T>(x, cs, mu, md, E.data() + r * N, N, lu, ld);
              set_sums(md, ld, lu, mu);
            } else {
              set_sums(md, exp_sum<T>(x, nullptr, md, N), T(1), T(0));
            }
          }
          if (drop.active()) {  // after the sums: the normalizers count every key
            drop.row<T>(bh, i, keep.data(), 0, N);
            mul_row<T>(x, keep.data(), N);
            if (hybrid && !fold) mul_row<T>(E.data() + r * N, keep.data(), N);
          }
        }
        T* ob = os + i0 * O.row;
        if (hybrid && !branch) {  // no backward to come: W = u Pd + (1 - u) Pu, then one product
          for (int64_t r = 0; r < nb; ++r) {
            const T wd = uu * row_scale[r], wu = (T(1) - uu) * row_scale_u[r];
            if (fold) mix_row<T>(X.data() + r * N, bfac.data(), wd, wu, N);
            else axpby<T>(wd, X.data() + r * N, wu, E.data() + r * N, N);
            row_scale[r] = T(1);
          }
        }
        if (!branch) {
          gemm<T>(false, false, nb, dv, N, T(1), X.data(), N, vs, V.row, T(0), ob, O.row);
          for (int64_t r = 0; r < nb; ++r)
            for (int64_t f = 0; f < dv; ++f) ob[r * O.row + f] *= row_scale[r];
          continue;
        }
        // HNAS: [ed V | ed b V] (fold: one product of width 2 dv; else X V and E V), then
        // out = u Od + (1 - u) Ou with Od = ed V / ld, Ou = ed b V / lu, and Od is saved: the
        // backward's row sums Dd_i = g_i . Od_i need no product then.
        if (fold) {
          gemm<T>(false, false, nb, 2 * dv, N, T(1), X.data(), N, VV.data(), 2 * dv, T(0), OO.data(),
                  2 * dv);
        } else {
          gemm<T>(false, false, nb, dv, N, T(1), X.data(), N, vs, V.row, T(0), OO.data(), 2 * dv);
          gemm<T>(false, false, nb, dv, N, T(1), E.data(), N, vs, V.row, T(0), OO.data() + dv,
                  2 * dv);
        }
        T* odb = OD->at(b, h) + i0 * OD->row;
        for (int64_t r = 0; r < nb; ++r) {
          const T* oo = OO.data() + r * 2 * dv;
          const T sd = row_scale[r], su = (T(1) - uu) * row_scale_u[r];
          for (int64_t f = 0; f < dv; ++f) {
            const T odf = sd * oo[f];
            odb[r * OD->row + f] = odf;
            ob[r * O.row + f] = uu * odf + su * oo[dv + f];
          }
        }
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> qn_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& u, const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask, bool column, bool save_branch,
    double dropout_p, int64_t seed, const std::optional<at::Tensor>& keep_mask) {
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
  // HNAS with save_branch: the DNAS branch's output, for the backward (empty otherwise)
  at::Tensor od = u.has_value() && save_branch ? at::empty_like(out) : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "qn_forward", [&] {
    forward_impl<scalar_t>(q, k, v, u, key_padding_mask, query_padding_mask, column, save_branch,
                           drop, out, od, c, rd, ru);
  });
  return {out, od, c, rd, ru};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qn_backward(
    const at::Tensor& g_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out, const at::Tensor& od,
    const std::optional<at::Tensor>& u,
    const at::Tensor& c, const at::Tensor& rd, const at::Tensor& ru,
    const std::optional<at::Tensor>& key_padding_mask,
    const std::optional<at::Tensor>& query_padding_mask, bool column, double dropout_p,
    int64_t seed, const std::optional<at::Tensor>& keep_mask) {
  auto qkv = check_inputs(q_in, k_in, v_in);
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  const at::Tensor g = g_in.stride(-1) == 1 ? g_in : g_in.contiguous();
  TORCH_CHECK(out.stride(-1) == 1 && (!u.has_value() || od.stride(-1) == 1),
              "the backward needs the saved output (HNAS: and its DNAS branch)");
  const Dropout drop(dropout_p, seed, keep_mask, q.size(2), k.size(2));
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  at::Tensor du = u.has_value() ? at::zeros({q.size(0), q.size(1)}, q.options())
                                : at::empty({0}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "qn_backward", [&] {
    backward_impl<scalar_t>(g, q, k, v, out, od, u, c, rd, ru, key_padding_mask, column, drop, dq,
                            dk, dv, du);
  });
  return {dq, dk, dv, du};
}

}  // namespace

TORCH_LIBRARY(attnlab, m) {
  m.def("query_normalized_forward(Tensor q, Tensor k, Tensor v, Tensor? u, "
        "Tensor? key_padding_mask, Tensor? query_padding_mask, bool column, bool save_branch, "
        "float dropout_p, int seed, Tensor? keep_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("query_normalized_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor od, "
        "Tensor? u, Tensor c, Tensor rd, Tensor ru, Tensor? key_padding_mask, "
        "Tensor? query_padding_mask, bool column, float dropout_p, int seed, Tensor? keep_mask) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("query_normalized_forward", qn_forward);
  m.impl("query_normalized_backward", qn_backward);
}
