// O(slices + tiles touched): each slice visits the query tiles its q range spans.
#include "work_list.h"

#include <algorithm>
#include <numeric>

#include "magi/error.h"

namespace magi::kernels::sm90 {
namespace {

std::int32_t clamp_band(std::int64_t x) {
  return std::int32_t(std::clamp<std::int64_t>(x, -kBandClamp, kBandClamp));
}

}  // namespace

WorkList make_work_list(const Mask& mask, std::int32_t block_m, std::int32_t block_n) {
  MAGI_CHECK(block_m > 0 && block_n > 0, "work list: block sizes must be positive, got ",
             block_m, " x ", block_n);
  const std::int64_t nq = mask.total_seqlen_q(), nk = mask.total_seqlen_k();
  constexpr std::int64_t kMaxTokens = std::int64_t(1) << 30;
  MAGI_CHECK(nq < kMaxTokens && nk < kMaxTokens, "GPU forward: ", nq, " query / ", nk,
             " key tokens exceed the kernel's 32-bit index range (", kMaxTokens, ")");
  const std::int64_t num_tiles = (nq + block_m - 1) / block_m;
  std::vector<std::vector<Piece>> per_tile(static_cast<std::size_t>(num_tiles));
  for (const Slice& s : mask.slices()) {
    if (s.q_range.empty() || s.k_range.empty()) continue;
    const Band band = band_of(s);
    for (std::int64_t t = s.q_range.start / block_m; t * block_m < s.q_range.end; ++t) {
      const Range rows = Range{t * block_m, (t + 1) * block_m}.intersect(s.q_range);
      const Range keys = keys_seen_by(s, rows);
      if (keys.empty()) continue;
      per_tile[std::size_t(t)].push_back(Piece{std::int32_t(rows.start), std::int32_t(rows.end),
                                               std::int32_t(keys.start), std::int32_t(keys.end),
                                               clamp_band(band.lo), clamp_band(band.hi)});
    }
  }
  WorkList w;
  w.block_m = block_m;
  w.block_n = block_n;
  for (std::int64_t t = 0; t < num_tiles; ++t) {
    auto& ps = per_tile[std::size_t(t)];
    Tile tile{std::int32_t(t * block_m), std::int32_t(w.pieces.size()), 0, 0};
    for (const Piece& p : ps) {
      tile.num_blocks += (p.k1 - p.k0 + block_n - 1) / block_n;
      w.pieces.push_back(p);
    }
    tile.piece_end = std::int32_t(w.pieces.size());
    w.total_blocks += tile.num_blocks;
    w.tiles.push_back(tile);
  }
  std::stable_sort(w.tiles.begin(), w.tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.num_blocks > b.num_blocks; });
  return w;
}

}  // namespace magi::kernels::sm90
