// Attention dropout of the fused CPU kernel (query_normalized.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

#include <ATen/ATen.h>

namespace {

// One keep mask on the mixed weights, scaled by 1/(1-p), as reference.py drops them. The mask is
// counter-based, never stored: element (i, j) of head (b, h), with row = (b H + h) S_q + i, is
// kept iff  mix(mix(mix(row ^ seed_lo) + seed_hi) + j * 0x9E3779B9) / 2 >= floor(p * 2^31),
// mix = the "lowbias32" integer hash, seed_lo / seed_hi = the low / high 31 bits of a 62-bit
// seed. The backward regenerates it from the saved seed. The same function is in
// kernels/dropout.py (torch, for tests) and in the Triton kernel.

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

struct Dropout {
  double p;
  uint32_t threshold = 0, seed_lo = 0, seed_hi = 0;
  const bool* keep = nullptr;  // test hook: an explicit (B, H, S_q, S_k) keep mask
  int64_t M, N;

  Dropout(double p_, int64_t seed, const std::optional<at::Tensor>& keep_mask, int64_t M_, int64_t N_)
      : p(p_), M(M_), N(N_) {
    TORCH_CHECK(p >= 0 && p < 1, "dropout_p must be in [0, 1)");
    threshold = static_cast<uint32_t>(std::floor(p * 2147483648.0));
    seed_lo = static_cast<uint32_t>(seed & 0x7FFFFFFF);
    seed_hi = static_cast<uint32_t>((seed >> 31) & 0x7FFFFFFF);
    if (keep_mask.has_value() && p > 0) {
      TORCH_CHECK(keep_mask->scalar_type() == at::kBool && keep_mask->is_contiguous() &&
                      keep_mask->numel() == keep_mask->size(0) * keep_mask->size(1) * M * N,
                  "keep_mask must be a contiguous bool (B, H, S_q, S_k) tensor");
      keep = keep_mask->data_ptr<bool>();
    }
  }
  bool active() const { return p > 0; }

  // scale[t] = 1/(1-p) where element (i, j0 + t) of head bh is kept, else 0, for t < n (the
  // row's keys j0 .. j0 + n - 1: the backward works on blocks of keys).
  template <typename T>
  void row(int64_t bh, int64_t i, T* scale, int64_t j0, int64_t n) const {
    const T inv = T(1) / T(1 - p);
    if (keep) {
      const bool* m = keep + (bh * M + i) * N + j0;
      for (int64_t t = 0; t < n; ++t) scale[t] = m[t] ? inv : T(0);
      return;
    }
    const uint32_t key = mix32(mix32(static_cast<uint32_t>(bh * M + i) ^ seed_lo) + seed_hi);
    for (int64_t t = 0; t < n; ++t) {
      const uint32_t j = static_cast<uint32_t>(j0 + t);
      scale[t] = (mix32(key + j * 0x9E3779B9U) >> 1) >= threshold ? inv : T(0);
    }
  }
};

}  // namespace
