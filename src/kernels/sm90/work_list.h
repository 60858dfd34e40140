// The GPU forward's work, as data (docs/semantics.md §2, issue 6): the mask cut into query tiles of
// block_m rows, each tile carrying the pieces of every slice that its rows see. One CTA owns a
// (tile, head) pair and runs one online softmax over all of the tile's pieces, so rows shared
// by several slices (overlapping q ranges) are merged exactly, without atomics or a second
// pass, and every output row is written by one CTA (deterministic; accumulate is race-free).
//
// A piece is a slice clipped to the tile: cells with q in [q0, q1), k in [k0, k1) and
// lo <= k - q <= hi (every slice type is a band, mask.h). Its key blocks run from k0 in steps
// of block_n; a block needs element masking only when one of its corners is outside the piece,
// which the kernel tests with a few scalar compares. [k0, k1) is trimmed to the keys the
// tile's rows see, so no key block is loaded for nothing. Tiles are sorted heavy first for the
// persistent scheduler's dynamic counter.
#pragma once

#include <cstdint>
#include <vector>

#include "magi/mask.h"

namespace magi::kernels::sm90 {

struct Piece {
  std::int32_t q0, q1, k0, k1;  // global rows and keys
  std::int32_t lo, hi;          // band: lo <= k - q <= hi, clamped to +-kBandClamp
};

struct Tile {
  std::int32_t q_start;               // first row (a multiple of block_m)
  std::int32_t piece_begin, piece_end;  // into WorkList::pieces
  std::int32_t num_blocks;            // key blocks over all pieces (the sort key)
};

struct WorkList {
  std::int32_t block_m = 0, block_n = 0;
  std::vector<Tile> tiles;  // every query tile, heavy first (those that see nothing last:
                            // their rows still get out 0 and lse -inf)
  std::vector<Piece> pieces;
  std::int64_t total_blocks = 0;
};

inline constexpr std::int32_t kBandClamp = 1 << 30;

// Throws when the sequence lengths do not fit the 32-bit indices the kernel uses.
WorkList make_work_list(const Mask& mask, std::int32_t block_m, std::int32_t block_n);

}  // namespace magi::kernels::sm90
