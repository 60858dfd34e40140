// Head-major packed copies of the inputs in the compute type, made once per call. Packing per
// task instead re-read every K/V row once per 64-row query tile, from rows 4 KiB apart (8
// heads x 128 x fp32) and through a transposing scatter: measured 60% of forward time at
// S = 2048. A packed tile is contiguous, so the micro-kernel streams it with prefetch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "io.h"
#include "simd.h"
#include "work.h"

namespace magi::kernels::cpu {

// Rows of x [n, heads, d] as [heads][n_pad][ld] (n_pad = n rounded up to kBlockK, ld = d
// rounded up to the vector width), times mult; padding rows and columns are zero.
template <typename T>
class RowPack {
 public:
  RowPack(const TensorView& x, T mult, int num_threads)
      : heads_(x.shape[1]),
        n_pad_(round_up(x.shape[0], kBlockK)),
        ld_(round_up(x.shape[2], Simd<T>::kWidth)),
        data_(std::size_t(heads_ * n_pad_ * ld_)) {
    const std::int64_t n = x.shape[0], d = x.shape[2];
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (std::int64_t h = 0; h < heads_; ++h)
      for (std::int64_t i = 0; i < n; ++i) load_row<T>(x, {i, h}, d, mult, row_ptr(h, i));
  }

  std::int64_t ld() const { return ld_; }
  const T* row(std::int64_t h, std::int64_t i) const { return row_ptr(h, i); }

 private:
  T* row_ptr(std::int64_t h, std::int64_t i) const { return data_.get() + (h * n_pad_ + i) * ld_; }

  std::int64_t heads_, n_pad_, ld_;
  Scratch<T> data_;
};

// x [n, heads, d] transposed per key tile: [heads][tile][d][kBlockK], column j of tile t is
// row t * kBlockK + j of x; columns past n are zero. The B operand of Q K^T and dO V^T.
template <typename T>
class TilePack {
 public:
  TilePack(const TensorView& x, int num_threads)
      : heads_(x.shape[1]),
        num_tiles_((x.shape[0] + kBlockK - 1) / kBlockK),
        d_(x.shape[2]),
        data_(std::size_t(heads_ * num_tiles_ * d_ * kBlockK)) {
    const std::int64_t n = x.shape[0];
#pragma omp parallel num_threads(num_threads)
    {
      std::vector<T> row(static_cast<std::size_t>(d_));
#pragma omp for collapse(2) schedule(static)
      for (std::int64_t h = 0; h < heads_; ++h)
        for (std::int64_t t = 0; t < num_tiles_; ++t) {
          T* dst = data_.get() + (h * num_tiles_ + t) * d_ * kBlockK;
          for (std::int64_t j = 0; j < kBlockK && t * kBlockK + j < n; ++j) {
            load_row<T>(x, {t * kBlockK + j, h}, d_, T(1), row.data());
            for (std::int64_t c = 0; c < d_; ++c) dst[c * kBlockK + j] = row[std::size_t(c)];
          }
        }
    }
  }

  const T* tile(std::int64_t h, std::int64_t t) const {
    return data_.get() + (h * num_tiles_ + t) * d_ * kBlockK;
  }

 private:
  std::int64_t heads_, num_tiles_, d_;
  Scratch<T> data_;
};

// The part of global key tile t that slice columns `cols` cover, widened to whole vectors:
// columns [c0, c1) of the packed tile. masked: the widening added columns outside cols.
struct TileCols {
  std::int64_t start = 0;  // first key of the tile
  std::int64_t c0 = 0, c1 = 0;
  bool widened = false;
  std::int64_t width() const { return c1 - c0; }
  std::int64_t base() const { return start + c0; }  // key of packed column c0
};

template <typename T>
inline TileCols tile_cols(std::int64_t t, Range cols) {
  constexpr std::int64_t kW = Simd<T>::kWidth;
  TileCols tc;
  tc.start = t * kBlockK;
  tc.c0 = (cols.start - tc.start) / kW * kW;
  tc.c1 = std::min(kBlockK, round_up(cols.end - tc.start, kW));
  tc.widened = tc.base() != cols.start || tc.start + tc.c1 != cols.end;
  return tc;
}

// Sets row[j] = -inf where key base + j is not seen by row q of s within cols (j < width).
template <typename T>
inline void mask_row(const Slice& s, std::int64_t q, Range cols, std::int64_t base,
                     std::int64_t width, T* row) {
  const Range vis = visible_keys(s, q).intersect(cols);
  const std::int64_t lo = vis.empty() ? 0 : vis.start - base;
  const std::int64_t hi = vis.empty() ? 0 : vis.end - base;
  std::fill(row, row + lo, kNegInf<T>);
  std::fill(row + hi, row + width, kNegInf<T>);
}

}  // namespace magi::kernels::cpu
