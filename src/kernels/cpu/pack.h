// The inputs as the kernels read them: per head, rows contiguous in the compute type. Rows
// 4 KiB apart (8 heads x 128 x fp32, read in place from a [N, H, D] tensor) measured 15-30%
// slower in the micro-kernel than contiguous ones (likely L1 set conflicts), so rows are
// packed once per call unless the caller's layout already is [H, N, D] in the compute type.
// K^T (and V^T for the backward) is packed into 64-key tiles, once per call, not per task.
// A packed row holding a NaN or inf is stored as zeros and flagged (NonFinite): no
// non-finite value reaches the tile loops, where a masked cell's 0 * NaN would leak it into
// rows that never see it; the kernels poison the rows that do see it from the flags instead.
#pragma once

#include "isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "io.h"
#include "simd.h"
#include "work.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {

template <typename T>
constexpr DType dtype_of() {
  return sizeof(T) == 8 ? DType::kF64 : DType::kF32;
}

// Per (head, row) of one input: the poison bits of rows that held a NaN or inf (docs/numerics.md).
// Bits, so that K and V rows share one array and a row's poison says what it came from.
enum Poison : std::uint8_t {
  kPoisonQK = 1,  // k: the logits of the rows that see it
  kPoisonV = 2,   // v: out only
  kPoisonQ = 4,   // q of a row, which counts only if the row sees a key
  kPoisonDout = 8,
};

class NonFinite {
 public:
  NonFinite(std::int64_t heads, std::int64_t n) : n_(n), flag_(std::size_t(heads * n), 0) {}
  // Rows of distinct (h, i) may be marked from different threads.
  void mark(std::int64_t h, std::int64_t i, std::uint8_t bits) { flag_[std::size_t(h * n_ + i)] |= bits; }
  std::uint8_t at(std::int64_t h, std::int64_t i) const { return flag_[std::size_t(h * n_ + i)]; }
  bool any() const {
    return std::any_of(flag_.begin(), flag_.end(), [](std::uint8_t f) { return f != 0; });
  }
  // Per (head, block of rows): the OR of its rows' bits, [heads][ceil(n / block)].
  std::vector<std::uint8_t> per_block(std::int64_t block) const {
    const std::int64_t blocks = (n_ + block - 1) / block;
    const std::int64_t heads = n_ > 0 ? std::int64_t(flag_.size()) / n_ : 0;
    std::vector<std::uint8_t> out(std::size_t(heads * blocks), 0);
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < n_; ++i) out[std::size_t(h * blocks + i / block)] |= at(h, i);
    return out;
  }

 private:
  std::int64_t n_;
  std::vector<std::uint8_t> flag_;
};

// Zeroes row[0, n) and returns true when it holds a NaN or inf; once per packed row. An
// element is non-finite iff its exponent bits are all set: an unsigned min over the lanes,
// which vectorises (a loop of std::isfinite did not: 5% of sliding-window forward time).
template <typename T>
inline bool all_finite(const T* row, std::int64_t n) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr U kExp = sizeof(T) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
  U low = kExp;
  for (std::int64_t i = 0; i < n; ++i) {
    U bits;
    std::memcpy(&bits, row + i, sizeof(U));
    low = std::min<U>(low, (bits & kExp) ^ kExp);  // 0: all exponent bits set
  }
  return low != 0;
}

template <typename T>
inline bool zero_if_non_finite(T* row, std::int64_t n) {
  if (all_finite(row, n)) return false;
  std::fill_n(row, n, T(0));
  return true;
}

// Rows of x [n, heads, d] times mult: at(h, i) is row i of head h, rows of one head
// `stride()` apart, each `width()` = d rounded up to the vector width long (zero padded).
// With `bad`, rows holding a NaN or inf are packed as zeros and marked with `bits` (a
// layout that could be read in place is then packed too).
template <typename T>
class Rows {
 public:
  Rows(const TensorView& x, T mult, int num_threads, NonFinite* bad = nullptr,
       std::uint8_t bits = 0)
      : width_(round_up(x.shape[2], Simd<T>::kWidth)),
        read_in_place_(in_place(x, mult) && (bad == nullptr || all_finite(x, num_threads))),
        pack_(read_in_place_ ? 0 : std::size_t(x.shape[1] * x.shape[0] * width_), false) {
    if (read_in_place_) {
      base_ = static_cast<const T*>(x.data);
      row_stride_ = x.stride[0];
      head_stride_ = x.stride[1];
      return;
    }
    const std::int64_t n = x.shape[0], heads = x.shape[1], d = x.shape[2];
    T* dst = pack_.get();
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t h = 0; h < heads; ++h) {
        T* row = dst + (h * n + i) * width_;
        load_row<T>(x, {i, h}, d, mult, row);
        if (bad != nullptr && zero_if_non_finite(row, d)) bad->mark(h, i, bits);
        std::fill(row + d, row + width_, T(0));
      }
    base_ = dst;
    row_stride_ = width_;
    head_stride_ = n * width_;
  }

  const T* at(std::int64_t h, std::int64_t i) const {
    return base_ + h * head_stride_ + i * row_stride_;
  }
  std::int64_t stride() const { return row_stride_; }
  std::int64_t width() const { return width_; }

 private:
  // Already head-major [H, N, D] with whole vectors in the compute type: nothing to do.
  static bool in_place(const TensorView& x, T mult) {
    return x.dtype == dtype_of<T>() && mult == T(1) && x.shape[2] % Simd<T>::kWidth == 0 &&
           (x.shape[0] <= 1 || x.stride[0] == x.shape[2]);
  }
  // One read of a tensor that in_place() accepts: per head, N x D contiguous elements.
  static bool all_finite(const TensorView& x, int num_threads) {
    const std::int64_t heads = x.shape[1], per_head = x.shape[0] * x.shape[2];
    bool finite = true;
#pragma omp parallel for reduction(&& : finite) schedule(static) num_threads(num_threads)
    for (std::int64_t h = 0; h < heads; ++h) {
      const T* p = static_cast<const T*>(x.data) + h * x.stride[1];
      bool head_finite = true;
      for (std::int64_t i = 0; i < per_head; ++i) head_finite &= std::isfinite(p[i]);
      finite = finite && head_finite;
    }
    return finite;
  }

  std::int64_t width_;
  bool read_in_place_;
  Scratch<T> pack_;  // empty when rows are read in place
  const T* base_ = nullptr;
  std::int64_t row_stride_ = 0, head_stride_ = 0;
};

// x [n, heads, d] transposed per key tile: [heads][tile][d][kBlockK], column j of tile t is
// row t * kBlockK + j of x; columns past n are zero. The B operand of Q K^T and dO V^T.
// With `bad`, rows holding a NaN or inf are packed as zeros and marked with `bits`.
template <typename T>
class TilePack {
 public:
  TilePack(const TensorView& x, int num_threads, NonFinite* bad = nullptr, std::uint8_t bits = 0)
      : heads_(x.shape[1]),
        num_tiles_((x.shape[0] + kBlockK - 1) / kBlockK),
        d_(x.shape[2]),
        data_(std::size_t(heads_ * num_tiles_ * d_ * kBlockK), false) {
    const std::int64_t n = x.shape[0];
#pragma omp parallel num_threads(num_threads)
    {
      std::vector<T> rows(static_cast<std::size_t>(kBlockK * d_));
      // Tile-major, so that the rows of all heads of a tile are read once, in memory order.
#pragma omp for collapse(2) schedule(static)
      for (std::int64_t t = 0; t < num_tiles_; ++t)
        for (std::int64_t h = 0; h < heads_; ++h) {
          const std::int64_t nk = std::min(kBlockK, n - t * kBlockK);
          for (std::int64_t j = 0; j < nk; ++j) {
            T* row = rows.data() + j * d_;
            load_row<T>(x, {t * kBlockK + j, h}, d_, T(1), row);
            if (bad != nullptr && zero_if_non_finite(row, d_)) bad->mark(h, t * kBlockK + j, bits);
          }
          std::fill(rows.begin() + nk * d_, rows.end(), T(0));
          transpose(rows.data(), data_.get() + (h * num_tiles_ + t) * d_ * kBlockK);
        }
    }
  }

  const T* tile(std::int64_t h, std::int64_t t) const {
    return data_.get() + (h * num_tiles_ + t) * d_ * kBlockK;
  }

 private:
  // dst[c][j] = src[j][c] in 8 x 16 blocks (d is a multiple of 8): measured 0.29 ns per
  // element against 0.45 for a plain row-by-row scatter.
  void transpose(const T* src, T* dst) const {
    for (std::int64_t c0 = 0; c0 < d_; c0 += 8)
      for (std::int64_t j0 = 0; j0 < kBlockK; j0 += 16)
        for (std::int64_t c = c0; c < c0 + 8; ++c)
#pragma GCC unroll 16
          for (std::int64_t j = j0; j < j0 + 16; ++j) dst[c * kBlockK + j] = src[j * d_ + c];
  }

  std::int64_t heads_, num_tiles_, d_;
  Scratch<T> data_;
};

// The part of global key tile t that slice columns `cols` cover, widened to whole vectors:
// columns [c0, c1) of the packed tile. widened: the widening added columns outside cols.
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

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
