// The GPU kernels' work, as data (docs/semantics.md §2): the mask cut into tiles along one
// axis, each tile carrying the pieces of every slice that meet it. The forward cuts query tiles
// of block_m rows: one CTA owns a (tile, head) pair and runs one online softmax over all of the
// tile's pieces, so rows shared by several slices (overlapping q ranges) are merged exactly,
// without atomics or a second pass, and every output row is written by one CTA (deterministic;
// accumulate is race-free). The backward's view is the transpose (issue 15): key tiles of
// block_n keys, each with the pieces of the rows that see them, walked in query blocks of
// block_m, so one CTA owns a key tile's dK and dV.
//
// A piece is a slice clipped to the tile: cells with q in [q0, q1), k in [k0, k1) and
// lo <= k - q <= hi (every slice type is a band, mask.h). It is walked in blocks along the
// other axis: key blocks from k0 in steps of block_n (query tiles), query blocks from q0 in
// steps of block_m (key tiles). A block needs element masking only when one of its corners is
// outside the piece, which the kernel tests with a few scalar compares. Both ranges are
// trimmed to the cells the piece can see, so no block is loaded for nothing. Tiles are sorted
// heavy first for the persistent scheduler's dynamic counter.
#pragma once

#include <cstdint>
#include <vector>

#include "magi/mask.h"

namespace magi::kernels::sm90 {

struct Piece {
  std::int32_t q0, q1, k0, k1;  // global rows and keys
  std::int32_t lo, hi;          // band: lo <= k - q <= hi, clamped to +-kBandClamp
};

// The axis the tiles cut: query rows (the forward) or keys (the backward).
enum class TileAxis : std::uint8_t { kQuery, kKey };

struct Tile {
  std::int32_t start;                   // first row or key (a multiple of the tile size)
  std::int32_t piece_begin, piece_end;  // into WorkList::pieces
  std::int32_t num_blocks;              // blocks over all pieces, along the other axis (the
                                        // sort key)
};

struct WorkList {
  TileAxis axis = TileAxis::kQuery;
  std::int32_t block_m = 0, block_n = 0;  // query rows and keys per block (tile sizes too)
  std::vector<Tile> tiles;  // every tile of the axis, heavy first (those that meet nothing
                            // last: a query tile's rows still get out 0 and lse -inf)
  std::vector<Piece> pieces;
  std::int64_t total_blocks = 0;
};

inline constexpr std::int32_t kBandClamp = 1 << 30;

// The deterministic backward's dq tickets of a key-tile work list: entry i < pieces.size() is
// the index of piece i's first ticket; a piece has one per query block of block_m rows it meets
// (on the grid of block_m rows, from q0 / block_m), the number of earlier contributions to
// that block in the order the kernel's scheduler hands the work out (tiles in list order, then
// pieces in tile order). Empty for a query-tile list. Throws past the 32-bit index range.
std::vector<std::int32_t> dq_tickets(const WorkList& w, std::int64_t num_q);

// Throws when the sequence lengths do not fit the 32-bit indices the kernels use.
WorkList make_work_list(const Mask& mask, std::int32_t block_m, std::int32_t block_n,
                        TileAxis axis = TileAxis::kQuery);

}  // namespace magi::kernels::sm90
