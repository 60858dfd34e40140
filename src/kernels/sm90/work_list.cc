// O(slices + tiles touched): each slice visits the tiles its range on the axis spans.
#include "work_list.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "magi/error.h"

namespace magi::kernels::sm90 {
namespace {

std::int32_t clamp_band(std::int64_t x) {
  return std::int32_t(std::clamp<std::int64_t>(x, -kBandClamp, kBandClamp));
}

// One pass of join_pieces along rows (same band and keys, adjacent rows) or along keys (same
// band and rows, adjacent keys); true when it joined any. `order` is scratch.
bool join_pass(std::vector<Piece>& ps, bool along_rows, std::vector<std::uint32_t>& order) {
  // Sorted by band, then the range joinable pieces share, then where the other one starts, a
  // run of joinable pieces is consecutive.
  auto key = [&](const Piece& p) {
    return along_rows ? std::array{p.lo, p.hi, p.k0, p.k1, p.q0}
                      : std::array{p.lo, p.hi, p.q0, p.q1, p.k0};
  };
  order.resize(ps.size());
  std::iota(order.begin(), order.end(), 0u);
  auto before = [&](std::uint32_t a, std::uint32_t b) { return key(ps[a]) < key(ps[b]); };
  if (!std::is_sorted(order.begin(), order.end(), before))  // often so already: slice order
    std::sort(order.begin(), order.end(), before);
  bool joined = false;
  std::uint32_t run = order[0];  // the piece the current run is joined into
  for (std::size_t i = 1; i < order.size(); ++i) {
    Piece& into = ps[run];
    const Piece& p = ps[order[i]];
    const bool same = along_rows ? (into.k0 == p.k0 && into.k1 == p.k1)
                                 : (into.q0 == p.q0 && into.q1 == p.q1);
    const bool next = along_rows ? into.q1 == p.q0 : into.k1 == p.k0;
    if (!(into.lo == p.lo && into.hi == p.hi && same && next)) {
      run = order[i];
      continue;
    }
    (along_rows ? into.q1 : into.k1) = along_rows ? p.q1 : p.k1;
    std::uint32_t j = order[i];  // the joined piece takes the earlier place of the two
    if (j < run) std::swap(ps[j], ps[run]), std::swap(j, run);
    ps[j].q0 = ps[j].q1 = 0;  // gone (an empty piece)
    joined = true;
  }
  if (joined)
    ps.erase(std::remove_if(ps.begin(), ps.end(), [](const Piece& p) { return p.q0 == p.q1; }),
             ps.end());
  return joined;
}

// Joins a tile's pieces that are one piece: the same band and the same keys over adjacent rows
// (or the same rows over adjacent keys). Their cells are disjoint and their union is the joined
// piece's, so the walk covers the same cells once, in fewer blocks: documents that share a
// prefix meet one query tile as one prefix piece instead of one per document (shared-prefix
// 64k, 128 x 128 blocks: 69288 -> 63400 blocks a head), and the joined rows need no row mask.
// The survivors keep their first member's place in the list. A pass along one axis joins all
// it can (its runs are chained), so the passes alternate until one joins nothing.
void join_pieces(std::vector<Piece>& ps, std::vector<std::uint32_t>& order) {
  bool along_rows = true;
  for (int pass = 0; ps.size() > 1; ++pass, along_rows = !along_rows)
    if (!join_pass(ps, along_rows, order) && pass > 0) break;
}

}  // namespace

WorkList make_work_list(const Mask& mask, std::int32_t block_m, std::int32_t block_n,
                        TileAxis axis) {
  MAGI_CHECK(block_m > 0 && block_n > 0, "work list: block sizes must be positive, got ",
             block_m, " x ", block_n);
  const std::int64_t nq = mask.total_seqlen_q(), nk = mask.total_seqlen_k();
  constexpr std::int64_t kMaxTokens = std::int64_t(1) << 30;
  MAGI_CHECK(nq < kMaxTokens && nk < kMaxTokens, "GPU kernels: ", nq, " query / ", nk,
             " key tokens exceed the kernels' 32-bit index range (", kMaxTokens, ")");
  const bool by_key = axis == TileAxis::kKey;
  const std::int64_t size = by_key ? block_n : block_m;  // of a tile, along the axis
  const std::int64_t step = by_key ? block_m : block_n;  // of a block, along the other
  const std::int64_t num_tiles = ((by_key ? nk : nq) + size - 1) / size;
  std::vector<std::vector<Piece>> per_tile(static_cast<std::size_t>(num_tiles));
  for (const Slice& s : mask.slices()) {
    if (s.q_range.empty() || s.k_range.empty()) continue;
    const Band band = band_of(s);
    const Range span = by_key ? s.k_range : s.q_range;
    for (std::int64_t t = span.start / size; t * size < span.end; ++t) {
      const Range part = Range{t * size, (t + 1) * size}.intersect(span);
      // The rows (keys) of the part, and the keys (rows) they see; for key tiles, also the
      // part's keys trimmed to those rows' view.
      const Range rows = by_key ? rows_seeing(s, part) : part;
      const Range keys = by_key ? keys_seen_by(s, rows).intersect(part) : keys_seen_by(s, rows);
      if (rows.empty() || keys.empty()) continue;
      per_tile[std::size_t(t)].push_back(Piece{std::int32_t(rows.start), std::int32_t(rows.end),
                                               std::int32_t(keys.start), std::int32_t(keys.end),
                                               clamp_band(band.lo), clamp_band(band.hi)});
    }
  }
  WorkList w;
  w.axis = axis;
  w.block_m = block_m;
  w.block_n = block_n;
  std::vector<std::uint32_t> order;  // join_pieces' scratch
  for (std::int64_t t = 0; t < num_tiles; ++t) {
    auto& ps = per_tile[std::size_t(t)];
    join_pieces(ps, order);
    // A key tile's pieces from the last rows up (the kernel walks each piece's query blocks
    // from its last down): every key tile then visits rows in one descending order, so in
    // deterministic mode the CTAs of a wave meet each block in its tickets' order instead of
    // queueing behind one another (a model of the scheduler, 16k shared-prefix: 2.7x ->
    // 1.7x the time without turns; docs/benchmarks.md).
    if (by_key)
      std::stable_sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) {
        return a.q1 != b.q1 ? a.q1 > b.q1 : a.q0 > b.q0;
      });
    Tile tile{std::int32_t(t * size), std::int32_t(w.pieces.size()), 0, 0};
    for (const Piece& p : ps) {
      const std::int64_t extent = by_key ? p.q1 - p.q0 : p.k1 - p.k0;
      tile.num_blocks += std::int32_t((extent + step - 1) / step);
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

std::vector<std::int32_t> dq_tickets(const WorkList& w, std::int64_t num_q) {
  if (w.axis != TileAxis::kKey) return {};
  std::vector<std::int32_t> tickets(w.pieces.size());
  std::vector<std::int32_t> before(std::size_t((num_q + w.block_m - 1) / w.block_m));
  for (const Tile& t : w.tiles)
    for (std::int32_t pi = t.piece_begin; pi < t.piece_end; ++pi) {
      const Piece& pc = w.pieces[std::size_t(pi)];
      MAGI_CHECK(tickets.size() < (std::size_t(1) << 31), "GPU work list: more than 2^31 "
                 "deterministic tickets");
      tickets[std::size_t(pi)] = std::int32_t(tickets.size());
      for (std::int32_t b = pc.q0 / w.block_m; b * w.block_m < pc.q1; ++b)
        tickets.push_back(before[std::size_t(b)]++);
    }
  MAGI_CHECK(tickets.size() < (std::size_t(1) << 31), "GPU work list: more than 2^31 "
             "deterministic tickets");
  return tickets;
}

}  // namespace magi::kernels::sm90
