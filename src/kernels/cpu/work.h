// Work decomposition and scratch for the CPU kernels. A task owns one tile of rows (query
// rows forward and for dq, key rows for dk/dv) and one head, and walks every slice that
// touches its tile in slice order: rows shared by several slices merge inside the task, so
// no two threads ever write one row and results do not depend on the thread count.
#pragma once

#include "isa.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "magi/mask.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {

// 256 query rows x 64 keys. Every task streams all K/V tiles its rows see (4 MiB per head at
// S = 4096, D = 128, fp32: more than the 2 MiB L2), so taller query tiles buy reuse: 64 ->
// 128 -> 256 rows measured 93 -> 105 -> 113 GFLOP/s forward on one core (512: 116, but
// fewer tasks to balance). At D = 128 fp32 a task holds Q and O (128 KiB each) and S
// (64 KiB) in L2, while the micro-kernel's B block (128 x 32 floats = 16 KiB) sits in L1.
// 128-key tiles measured no faster.
inline constexpr std::int64_t kBlockQ = 256;
inline constexpr std::int64_t kBlockK = 64;

// Rows of a tile and the slices (indices into the mask, ascending) with a visible cell there.
struct TileWork {
  Range rows;
  std::vector<std::int32_t> slices;
  double cost = 0;  // visible cells plus a per-slice overhead, for heavy-first ordering
};

// Query tiles [i * block, (i + 1) * block) over total_seqlen_q; a slice is listed in a tile
// when it has a visible cell in the tile's rows. Every tile is present, even an empty one,
// so that its rows get written.
std::vector<TileWork> query_tiles(const Mask& mask, std::int64_t block);
// The same over key columns.
std::vector<TileWork> key_tiles(const Mask& mask, std::int64_t block);

struct Task {
  std::int32_t tile_idx = 0;
  std::int32_t head_idx = 0;
};
// Every (tile, head), heaviest first (ties by tile then head, so the order is fixed).
std::vector<Task> heavy_first(const std::vector<TileWork>& tiles, std::int64_t num_heads);

// Calls fn(t, tile_rows, cols, cls) for every kBlockK-aligned key tile t that rows of s see:
// cols are the visible keys of the tile, tile_rows the rows reaching them, cls never kEmpty.
template <typename Fn>
void for_each_key_tile(const Slice& s, Range rows, Fn&& fn) {
  const Range keys = keys_seen_by(s, rows);
  for (std::int64_t t = keys.start / kBlockK; t * kBlockK < keys.end; ++t) {
    const Range cols = keys.intersect(Range{t * kBlockK, (t + 1) * kBlockK});
    const Range tile_rows = rows.intersect(rows_seeing(s, cols));
    if (tile_rows.empty()) continue;
    const TileClass cls = classify(s, tile_rows, cols);
    if (cls != TileClass::kEmpty) fn(t, tile_rows, cols, cls);
  }
}

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// A 64-byte aligned array, zero-initialised unless the owner writes every element itself
// (a 16 MiB pack zeroed first costs a second pass over memory).
template <typename T>
class Scratch {
 public:
  explicit Scratch(std::size_t n, bool zero = true)
      : data_(static_cast<T*>(::operator new[](n * sizeof(T) + 64, std::align_val_t(64)))) {
    if (zero) std::fill_n(data_.get(), n, T(0));
  }
  T* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<T, Free> data_;
};

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
