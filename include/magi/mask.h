// The mask model (docs/semantics.md §1): ranges, slice types, slices and masks. This file is the
// one definition of "is (q, k) visible": every other module (oracle, CPU backend, planner, GPU tile
// lists) asks it. A slice is a rectangle cut by a diagonal band k - q in [lo, hi], which makes
// visible-cell counts over any sub-rectangle O(1) per slice.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace magi {

// Half-open [start, end); start <= end; empty ranges are legal.
struct Range {
  std::int64_t start = 0;
  std::int64_t end = 0;

  constexpr std::int64_t size() const { return end - start; }
  constexpr bool empty() const { return end <= start; }
  constexpr bool contains(std::int64_t x) const { return start <= x && x < end; }
  constexpr Range intersect(Range o) const {
    Range r{start > o.start ? start : o.start, end < o.end ? end : o.end};
    if (r.end < r.start) r.end = r.start;
    return r;
  }
  constexpr bool overlaps(Range o) const { return !intersect(o).empty(); }
  friend constexpr bool operator==(Range a, Range b) = default;
};

std::string to_string(Range r);  // "[3, 7)"

enum class MaskType : std::uint8_t { kFull = 0, kCausal = 1, kInvCausal = 2, kBiCausal = 3 };

std::string_view mask_type_name(MaskType t);  // "full", "causal", "inv_causal", "bi_causal"
// Accepts 0..3 only; anything else throws naming `what` (e.g. "slice 3").
MaskType mask_type_from_int(std::int64_t v, std::string_view what = "mask type");
// Accepts the names above (case-insensitive) and "0".."3".
MaskType mask_type_from_name(std::string_view name, std::string_view what = "mask type");

struct Slice {
  Range q_range;
  Range k_range;
  MaskType type = MaskType::kFull;

  friend bool operator==(const Slice&, const Slice&) = default;
};

std::string to_string(const Slice& s);  // "q [0, 8) k [0, 8) causal"

// Global (q, k) cells of a slice: q in q_range, k in k_range and lo <= k - q <= hi.
struct Band {
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max() / 4;
  std::int64_t lo = -kNone;
  std::int64_t hi = kNone;
};
Band band_of(const Slice& s);

// Visible keys of global query row q in slice s, as a (possibly empty) global key range.
Range visible_keys(const Slice& s, std::int64_t q);
bool visible(const Slice& s, std::int64_t q, std::int64_t k);

// Union of the visible keys of the given rows of s (both edges of a row's interval grow with
// q, so the union is one range), and the rows of s that see at least one key in `keys`.
Range keys_seen_by(const Slice& s, Range rows);
Range rows_seeing(const Slice& s, Range keys);

// The cells {q in rows, k in cols, band.lo <= k - q <= band.hi} as at most 3 non-overlapping
// slices (rows where the left edge is clamped or stepping, times the right edge likewise).
// Any piece of a slice cut by a sub-rectangle has this shape, which is how the planner
// localises slices; translate the result to move it into another coordinate system.
std::vector<Slice> band_to_slices(Range rows, Range cols, Band band);

// Exact visible-cell counts, O(1).
std::int64_t area(const Slice& s);
std::int64_t area(const Slice& s, Range q_rows);
std::int64_t area(const Slice& s, Range q_rows, Range k_cols);

enum class TileClass : std::uint8_t { kEmpty = 0, kPartial = 1, kFull = 2 };

// How slice s covers the tile q_rows x k_cols: empty (no visible cell), full (every cell of
// the tile visible) or partial (needs element masking).
TileClass classify(const Slice& s, Range q_rows, Range k_cols);

struct TileGrid {
  std::int64_t block_q = 0, block_k = 0, num_q_tiles = 0, num_k_tiles = 0;
  std::vector<TileClass> tiles;  // row-major [num_q_tiles, num_k_tiles]
  TileClass at(std::int64_t qi, std::int64_t ki) const { return tiles[qi * num_k_tiles + ki]; }
};

// The most cells a mask may have: areas are exact int64 counts, and their closed forms take
// products up to twice the area (2^62 cells: 2^31 tokens each way).
inline constexpr std::int64_t kMaxMaskCells = std::int64_t(1) << 62;

// A validated list of non-overlapping slices over a (total_seqlen_q x total_seqlen_k) matrix.
class Mask {
 public:
  Mask() = default;
  // Validates (throws magi::Error naming the culprit): reversed ranges, ranges beyond the
  // sequence, more than kMaxMaskCells cells, a cell covered by two slices.
  Mask(std::int64_t total_seqlen_q, std::int64_t total_seqlen_k, std::vector<Slice> slices);

  std::int64_t total_seqlen_q() const { return total_q_; }
  std::int64_t total_seqlen_k() const { return total_k_; }
  const std::vector<Slice>& slices() const { return slices_; }
  std::size_t size() const { return slices_.size(); }
  const Slice& operator[](std::size_t i) const { return slices_[i]; }

  std::int64_t area() const;
  std::int64_t area(Range q_rows) const;
  std::int64_t area(Range q_rows, Range k_cols) const;
  double sparsity() const;  // 1 - area / (total_q * total_k)

  // O(number of slices); for tests and the oracle, not for hot loops.
  bool visible(std::int64_t q, std::int64_t k) const;
  TileGrid classify_tiles(std::int64_t block_q, std::int64_t block_k) const;

  std::string to_string() const;  // one line per slice

  friend bool operator==(const Mask&, const Mask&) = default;

 private:
  std::int64_t total_q_ = 0;
  std::int64_t total_k_ = 0;
  std::vector<Slice> slices_;
};

// The checks the Mask constructor runs, usable on raw slice lists.
void validate_slices(std::int64_t total_seqlen_q, std::int64_t total_seqlen_k,
                     const std::vector<Slice>& slices);

}  // namespace magi
