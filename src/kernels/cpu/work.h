// Work decomposition and scratch for the CPU kernels. A task owns one tile of rows (query
// rows forward and for dq, key rows for dk/dv) and one head, and walks every slice that
// touches its tile in slice order: rows shared by several slices merge inside the task, so
// no two threads ever write one row and results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "magi/mask.h"

namespace magi::kernels::cpu {

// 64 x 64 tiles: at D = 128 fp32 the Q tile, the K^T and V tiles and the O accumulator are
// 32 KiB each, so a task's working set (~160 KiB) sits in the 2 MiB L2 and the micro-kernel's
// B block (128 x 32 floats = 16 KiB) in the 48 KiB L1. Larger tiles measured no faster.
inline constexpr std::int64_t kBlockQ = 64;
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

// Union of the visible key ranges of the given rows of s (rows inside s.q_range).
Range keys_seen_by(const Slice& s, Range rows);
// Rows of s with at least one visible key in keys.
Range rows_seeing(const Slice& s, Range keys);

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

}  // namespace magi::kernels::cpu
