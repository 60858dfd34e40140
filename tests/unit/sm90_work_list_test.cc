// The GPU kernels' work lists (src/kernels/sm90/work_list.h) reproduce the mask exactly, along
// either axis: every visible cell is covered by exactly one piece of its row's query tile (the
// forward) or of its key's key tile (the backward's transposed view), and no piece covers a
// hidden cell, so a kernel's per-piece predicate computes the same attention as the slice list.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <vector>

#include "attn_case.h"
#include "kernels/sm90/block_cover.h"
#include "kernels/sm90/work_list.h"
#include "magi/error.h"
#include "magi/mask_builders.h"
#include "magi/mask_families.h"
#include "seed.h"

namespace magi::kernels::sm90 {
namespace {

bool covers(const Piece& p, std::int64_t q, std::int64_t k) {
  return p.q0 <= q && q < p.q1 && p.k0 <= k && k < p.k1 && p.lo <= k - q && k - q <= p.hi;
}

void expect_exact_along(const Mask& mask, std::int32_t bm, std::int32_t bn, TileAxis axis,
                        const std::string& what) {
  const bool by_key = axis == TileAxis::kKey;
  SCOPED_TRACE(what + " blocks " + std::to_string(bm) + "x" + std::to_string(bn) +
               (by_key ? ", key tiles" : ", query tiles"));
  const WorkList w = make_work_list(mask, bm, bn, axis);
  EXPECT_EQ(w.axis, axis);
  const std::int64_t nq = mask.total_seqlen_q(), nk = mask.total_seqlen_k();
  const std::int64_t size = by_key ? bn : bm, extent = by_key ? nk : nq;
  const std::vector<std::uint8_t> dense = masks::to_dense(mask);
  std::vector<int> hits(dense.size(), 0);
  std::int64_t blocks = 0;
  EXPECT_EQ(std::int64_t(w.tiles.size()), (extent + size - 1) / size);
  for (std::size_t t = 0; t < w.tiles.size(); ++t) {
    const Tile& tile = w.tiles[t];
    ASSERT_EQ(tile.start % size, 0);
    if (t > 0) {
      EXPECT_GE(w.tiles[t - 1].num_blocks, tile.num_blocks) << "not heavy first";
    }
    ASSERT_LE(tile.piece_begin, tile.piece_end);
    std::int32_t tile_blocks = 0;
    for (std::int32_t i = tile.piece_begin; i < tile.piece_end; ++i) {
      const Piece& p = w.pieces[std::size_t(i)];
      // Inside the tile along its axis, inside the sequence along the other.
      const std::int32_t lo = by_key ? p.k0 : p.q0, hi = by_key ? p.k1 : p.q1;
      ASSERT_GE(lo, tile.start);
      ASSERT_LE(hi, std::min<std::int64_t>(tile.start + size, extent));
      ASSERT_LT(p.q0, p.q1);
      ASSERT_LT(p.k0, p.k1);
      ASSERT_LE(p.q1, nq);
      ASSERT_LE(p.k1, nk);
      // The kernel visits blocks k0, k0 + bn, ... (or q0, q0 + bm, ...) and masks by the
      // predicate.
      tile_blocks += by_key ? (p.q1 - p.q0 + bm - 1) / bm : (p.k1 - p.k0 + bn - 1) / bn;
      for (std::int64_t q = p.q0; q < p.q1; ++q)
        for (std::int64_t k = p.k0; k < p.k1; ++k)
          if (covers(p, q, k)) ++hits[std::size_t(q * nk + k)];
    }
    EXPECT_EQ(tile.num_blocks, tile_blocks);
    blocks += tile_blocks;
  }
  EXPECT_EQ(w.total_blocks, blocks);
  for (std::int64_t c = 0; c < nq * nk; ++c)
    ASSERT_EQ(hits[std::size_t(c)], int(dense[std::size_t(c)]))
        << "cell (" << c / nk << ", " << c % nk << ")";
}

void expect_exact(const Mask& mask, std::int32_t bm, std::int32_t bn, const std::string& what) {
  expect_exact_along(mask, bm, bn, TileAxis::kQuery, what);
  expect_exact_along(mask, bm, bn, TileAxis::kKey, what);
}

TEST(Sm90WorkList, BuildersAreCoveredExactly) {
  const std::vector<std::int64_t> cu{0, 5, 70, 71, 200};
  expect_exact(masks::full(200, 130), 64, 32, "full");
  expect_exact(masks::causal(200, 200), 64, 64, "causal");
  expect_exact(masks::causal(90, 200), 16, 64, "causal sq < sk");
  expect_exact(masks::varlen_causal(cu), 64, 128, "varlen causal");
  expect_exact(masks::varlen_sliding_window(cu, {7, 3}, 2), 32, 16, "varlen sliding window");
  expect_exact(masks::varlen_block_causal(cu, 16, true), 64, 32, "varlen block causal");
  const std::vector<std::int64_t> answers{30, 50};
  expect_exact(masks::shared_question(40, answers), 16, 16, "shared question (overlapping q)");
}

TEST(Sm90WorkList, RandomMasksAreCoveredExactly) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x90);
  for (int c = 0; c < 40; ++c) {
    const std::int64_t nq = 1 + std::int64_t(rng() % 150), nk = 1 + std::int64_t(rng() % 150);
    const Mask mask = testing::random_mask(rng, nq, nk, 8);
    const std::int32_t bm = std::int32_t(8) << (rng() % 4), bn = std::int32_t(8) << (rng() % 4);
    expect_exact(mask, bm, bn, testing::seed_note(seed) + " case " + std::to_string(c));
  }
}

TEST(Sm90WorkList, PiecesThatAreOnePieceAreJoined) {
  // Documents of 50, 30 and 90 rows after a 100-row question they all see: query tile 128..256
  // meets the rows of all three, which see the same question keys (joined into one piece: 1
  // block of 128 keys instead of 3) and each their own causal keys (different bands: not
  // joined). The union is still covered exactly (the coverage tests above).
  const Mask mask = masks::shared_question(100, std::vector<std::int64_t>{50, 30, 90});
  const WorkList w = make_work_list(mask, 128, 128);
  const Tile& tile = *std::find_if(w.tiles.begin(), w.tiles.end(),
                                   [](const Tile& t) { return t.start == 128; });
  std::vector<std::array<std::int32_t, 4>> got;
  for (std::int32_t pi = tile.piece_begin; pi < tile.piece_end; ++pi) {
    const Piece& p = w.pieces[std::size_t(pi)];
    got.push_back({p.q0, p.q1, p.k0, p.k1});
  }
  // In slice order (the first member's place): the question piece of rows 128..256, then the
  // first document's own keys (its rows 128..150), the second's, the third's (rows 180..256).
  EXPECT_EQ(got, (std::vector<std::array<std::int32_t, 4>>{
                     {128, 256, 0, 100}, {128, 150, 100, 150}, {150, 180, 150, 180},
                     {180, 256, 180, 256}}));
  EXPECT_EQ(tile.num_blocks, 4);
  // Same rows over adjacent keys (two full slices side by side) become one piece too; pieces
  // that only touch at a corner, or differ in band, stay apart.
  const Mask side(64, 256, {Slice{{0, 64}, {0, 100}, MaskType::kFull},
                            Slice{{0, 64}, {100, 256}, MaskType::kFull}});
  const WorkList s = make_work_list(side, 64, 128);
  ASSERT_EQ(s.pieces.size(), 1u);
  EXPECT_EQ(s.pieces[0].k0, 0);
  EXPECT_EQ(s.pieces[0].k1, 256);
  EXPECT_EQ(s.total_blocks, 2);
  const Mask corner(64, 128, {Slice{{0, 32}, {0, 64}, MaskType::kFull},
                              Slice{{32, 64}, {64, 128}, MaskType::kFull}});
  EXPECT_EQ(make_work_list(corner, 64, 128).pieces.size(), 2u);
  const Mask bands(128, 128, {Slice{{0, 64}, {0, 64}, MaskType::kCausal},
                              Slice{{64, 128}, {0, 64}, MaskType::kFull}});
  EXPECT_EQ(make_work_list(bands, 128, 128).pieces.size(), 2u);
  // The benchmark's shared-prefix mask at 16k (docs/benchmarks.md, seventh session): 4809
  // blocks a head before the join, the prefix walked once per document in a straddling tile.
  FamilySpec spec;
  spec.family = "shared-prefix";
  spec.seqlen = 16384;
  EXPECT_EQ(make_work_list(build_family(spec), 128, 128).total_blocks, 4265);
}

TEST(Sm90WorkList, TilesThatSeeNothingComeLast) {
  const Mask mask(300, 256, {Slice{{0, 10}, {0, 256}, MaskType::kFull}});
  const WorkList w = make_work_list(mask, 128, 128);
  ASSERT_EQ(w.tiles.size(), 3u) << "every query tile is listed, so every row is written";
  EXPECT_EQ(w.tiles[0].start, 0);
  EXPECT_EQ(w.tiles[0].num_blocks, 2);
  EXPECT_EQ(w.tiles[1].piece_begin, w.tiles[1].piece_end);
  EXPECT_EQ(w.tiles[2].num_blocks, 0);
  EXPECT_EQ(w.total_blocks, 2);
}

TEST(Sm90WorkList, KeyTilesCarryTheRowsThatSeeThem) {
  // Causal 256 x 256 in key tiles of 128, walked in query blocks of 64: the first key tile is
  // seen by every row (4 query blocks), the second only by rows 128.. (2 blocks), so it sorts
  // second; keys no row sees (a hole) still get their tile, with no pieces (dK, dV zero).
  const Mask causal = masks::causal(256, 256);
  const WorkList w = make_work_list(causal, 64, 128, TileAxis::kKey);
  ASSERT_EQ(w.tiles.size(), 2u);
  EXPECT_EQ(w.tiles[0].start, 0);
  EXPECT_EQ(w.tiles[0].num_blocks, 4);
  EXPECT_EQ(w.tiles[1].start, 128);
  EXPECT_EQ(w.tiles[1].num_blocks, 2);
  const Piece& p = w.pieces[std::size_t(w.tiles[1].piece_begin)];
  EXPECT_EQ(p.q0, 128);
  EXPECT_EQ(p.q1, 256);
  const Mask hole(64, 384, {Slice{{0, 64}, {0, 128}, MaskType::kFull},
                            Slice{{0, 64}, {256, 384}, MaskType::kFull}});
  const WorkList h = make_work_list(hole, 64, 128, TileAxis::kKey);
  ASSERT_EQ(h.tiles.size(), 3u);
  EXPECT_EQ(h.tiles[2].start, 128);
  EXPECT_EQ(h.tiles[2].piece_begin, h.tiles[2].piece_end);
}

// The deterministic backward's tickets against a replay of the scheduler's order: each (piece,
// query block) gets the number of contributions to its block visited before it, so every
// block's tickets are 0, 1, ... in that order and the dq sums run in one order.
void expect_tickets(const Mask& mask, std::int32_t bm, std::int32_t bn, const std::string& what) {
  SCOPED_TRACE(what);
  const WorkList w = make_work_list(mask, bm, bn, TileAxis::kKey);
  const std::vector<std::int32_t> t = dq_tickets(w, mask.total_seqlen_q());
  ASSERT_GE(t.size(), w.pieces.size());
  std::vector<std::int32_t> seen(std::size_t((mask.total_seqlen_q() + bm - 1) / bm), 0);
  std::size_t next = w.pieces.size();  // tickets are laid out in the scheduler's order too
  for (const Tile& tile : w.tiles)
    for (std::int32_t pi = tile.piece_begin; pi < tile.piece_end; ++pi) {
      const Piece& pc = w.pieces[std::size_t(pi)];
      ASSERT_EQ(std::size_t(t[std::size_t(pi)]), next) << "piece " << pi;
      for (std::int32_t b = pc.q0 / bm; b * bm < pc.q1; ++b, ++next) {
        ASSERT_LT(next, t.size());
        EXPECT_EQ(t[next], seen[std::size_t(b)]++) << "piece " << pi << ", block " << b;
      }
    }
  EXPECT_EQ(next, t.size());
  EXPECT_TRUE(dq_tickets(make_work_list(mask, bm, bn, TileAxis::kQuery), 0).empty());
}

TEST(Sm90WorkList, KeyTilePiecesRunFromTheLastRowsUp) {
  // Three answers see one shared prefix tile (one piece: their rows 100..290 see the same
  // keys, joined) and the first answer its own keys 100..128 in it (a second piece of its
  // rows): the pieces come last rows first, so every key tile's walk (each piece's blocks
  // from its last down) visits rows descending.
  const Mask mask = masks::shared_question(100, std::vector<std::int64_t>{70, 30, 90});
  const WorkList w = make_work_list(mask, 64, 128, TileAxis::kKey);
  const Tile& prefix = *std::find_if(w.tiles.begin(), w.tiles.end(),
                                     [](const Tile& t) { return t.start == 0; });
  std::vector<std::int32_t> q1s;
  for (std::int32_t pi = prefix.piece_begin; pi < prefix.piece_end; ++pi)
    q1s.push_back(w.pieces[std::size_t(pi)].q1);
  EXPECT_EQ(q1s, (std::vector<std::int32_t>{290, 170, 100}));
  const Mask fwd(128, 128, {Slice{{0, 100}, {0, 64}, MaskType::kFull},
                            Slice{{50, 128}, {64, 128}, MaskType::kFull}});
  const WorkList q = make_work_list(fwd, 64, 128, TileAxis::kQuery);
  EXPECT_EQ(q.pieces[std::size_t(q.tiles[0].piece_begin)].q0, 0) << "query tiles keep their order";
}

TEST(Sm90WorkList, DeterministicTicketsFollowTheSchedulersOrder) {
  // Overlapping q ranges (several pieces of one tile meet a block), pieces off the block grid.
  const Mask overlap(300, 300, {Slice{{0, 300}, {0, 100}, MaskType::kFull},
                                Slice{{50, 250}, {100, 300}, MaskType::kCausal},
                                Slice{{250, 300}, {100, 300}, MaskType::kInvCausal}});
  expect_tickets(overlap, 64, 128, "overlapping q ranges");
  expect_tickets(masks::causal(1000, 1000), 64, 128, "causal");
  const std::vector<std::int64_t> cu{0, 5, 70, 71, 200};
  expect_tickets(masks::varlen_causal(cu), 64, 128, "varlen causal");
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed ^ 0x71c);
  for (int c = 0; c < 20; ++c) {
    const std::int64_t nq = 1 + std::int64_t(rng() % 400), nk = 1 + std::int64_t(rng() % 400);
    expect_tickets(testing::random_mask(rng, nq, nk, 8), 64, 128,
                   testing::seed_note(seed) + " case " + std::to_string(c));
  }
  // One full 200 x 300 slice: three key tiles (equal weights keep their order), each meeting
  // the four query blocks: the second tile's tickets are all 1.
  const WorkList w = make_work_list(masks::full(200, 300), 64, 128, TileAxis::kKey);
  const std::vector<std::int32_t> t = dq_tickets(w, 200);
  ASSERT_EQ(w.pieces.size(), 3u);
  EXPECT_EQ(t.size(), 3u + 4u * 3u);
  EXPECT_EQ(t[std::size_t(t[std::size_t(w.tiles[1].piece_begin)])], 1);
}

TEST(Sm90WorkList, RejectsBadBlocksAndHugeSequences) {
  const Mask mask = masks::causal(8, 8);
  EXPECT_THROW(make_work_list(mask, 0, 64), magi::Error);
  const Mask huge(std::int64_t(1) << 31, 8, {Slice{{0, 8}, {0, 8}, MaskType::kFull}});
  try {
    make_work_list(huge, 128, 128);
    ADD_FAILURE() << "no error";
  } catch (const magi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("32-bit"), std::string::npos) << e.what();
  }
}

// The kernels' block predicate (block_cover.h) against the cells: a block is covered for a run
// of rows exactly when the piece sees every cell of it.
TEST(Sm90BlockCover, CoversIsEveryCellVisible) {
  std::mt19937_64 rng(testing::test_seed() ^ 0xc0);
  for (int c = 0; c < 3000; ++c) {
    auto r = [&](int n) { return int(rng() % unsigned(n)); };
    const int q0 = r(40), q1 = q0 + 1 + r(60), k0 = r(40), k1 = k0 + 1 + r(60);
    const int lo = r(2) ? -kBandClamp : r(80) - 40;
    const int hi = r(2) ? kBandClamp : r(80) - 40;
    const Piece pc{q0, q1, k0, k1, lo, hi};
    const int r0 = r(90), rows = 1 + r(24), kb = r(90), bn = 1 + r(24);
    bool all = true;
    for (int q = r0; q < r0 + rows; ++q)
      for (int k = kb; k < kb + bn; ++k) all = all && covers(pc, q, k);
    ASSERT_EQ(sm90::covers(pc, r0, rows, kb, bn), all)
        << "case " << c << ": rows " << r0 << "+" << rows << ", keys " << kb << "+" << bn;
  }
}

// unmasked_run: the blocks after kb (in steps of block_n, inside the piece) that the tile's rows
// see whole, stopping at the first that is not, and never the tile's last block (the kernel's
// consumers leave their loop only on a block whose info they read).
int walked_run(const Piece& pc, int r0, int rows, int kb, int bn, bool last_piece) {
  int n = 0;
  for (std::int64_t b = std::int64_t(kb) + bn; b < pc.k1; b += bn, ++n) {
    const bool last = last_piece && b + bn >= pc.k1;
    if (last || !sm90::covers(pc, r0, rows, int(b), bn)) break;
  }
  return n;
}

TEST(Sm90BlockCover, UnmaskedRunIsTheWalkedRun) {
  std::mt19937_64 rng(testing::test_seed() ^ 0xc1);
  for (int c = 0; c < 4000; ++c) {
    auto r = [&](int n) { return int(rng() % unsigned(n)); };
    const int bn = 16 << r(3), rows = 64 * (2 + r(2));
    // Half the pieces hold every row of the tile, half end on a whole block (the tile's last
    // block must then stay out of a run).
    const int r0 = 64 * r(16), last = r(2);
    const int q0 = r(2) ? r(600) : 0, q1 = r(2) ? q0 + 1 + r(900) : 2000;
    const int k0 = r(600), k1 = k0 + bn * (1 + r(24)) - (r(2) ? r(bn) : 0);
    const int lo = r(3) == 0 ? -kBandClamp : r(1200) - 600;
    const int hi = r(3) == 0 ? kBandClamp : r(1200) - 600;
    const Piece pc{q0, q1, k0, k1, lo, hi};
    for (int kb = pc.k0; kb < pc.k1; kb += bn)
      ASSERT_EQ(unmasked_run(pc, r0, rows, kb, bn, last), walked_run(pc, r0, rows, kb, bn, last))
          << "case " << c << ": piece q " << pc.q0 << ".." << pc.q1 << " k " << pc.k0 << ".."
          << pc.k1 << " band " << pc.lo << ".." << pc.hi << ", rows " << r0 << "+" << rows
          << ", block " << kb << "+" << bn << (last ? ", last piece" : "");
  }
  // A full piece of 4 whole blocks: after block 0, blocks 1 and 2, and 3 too unless it is the
  // tile's last; a causal band (hi = 0) ending at the tile's rows: the blocks below its diagonal.
  const Piece full{0, 192, 0, 512, -kBandClamp, kBandClamp};
  EXPECT_EQ(unmasked_run(full, 0, 192, 0, 128, true), 2);
  EXPECT_EQ(unmasked_run(full, 0, 192, 0, 128, false), 3);
  EXPECT_EQ(unmasked_run(full, 0, 192, 384, 128, false), 0);
  const Piece causal{512, 704, 0, 704, -kBandClamp, 0};
  EXPECT_EQ(unmasked_run(causal, 512, 192, 0, 128, true), 3);  // keys 128..511: k <= q for every row
  // Near the int range's end: no overflow (keys up to 2^31 - 1, the band clamp), and the cap.
  const int top = 0x7fffffff;
  const Piece wide{0, 192, top - 1000, top, -kBandClamp, kBandClamp};
  for (int kb = wide.k0; kb < wide.k1 - 128; kb += 128)
    EXPECT_EQ(unmasked_run(wide, 0, 192, kb, 128, true), walked_run(wide, 0, 192, kb, 128, true));
  const Piece huge{0, 192, 0, top, -kBandClamp, kBandClamp};
  EXPECT_EQ(unmasked_run(huge, 0, 192, 0, 128, false), kMaxUnmaskedRun);
}

}  // namespace
}  // namespace magi::kernels::sm90
