// Mask semantics against the docs/semantics.md §1 table written out cell by cell, then exact areas,
// tile classes and validation errors. The naive definition below is the test's own; the library's
// band arithmetic must agree with it everywhere.
#include "magi/mask.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "magi/error.h"
#include "seed.h"

namespace magi {
namespace {

using ::testing::HasSubstr;

// docs/semantics.md §1, local coordinates.
bool naive_visible(const Slice& s, std::int64_t q, std::int64_t k) {
  if (!s.q_range.contains(q) || !s.k_range.contains(k)) return false;
  const std::int64_t i = q - s.q_range.start, j = k - s.k_range.start;
  const std::int64_t sq = s.q_range.size(), sk = s.k_range.size();
  switch (s.type) {
    case MaskType::kFull: return true;
    case MaskType::kCausal: return j <= i + (sk - sq);
    case MaskType::kInvCausal: return j >= i;
    case MaskType::kBiCausal: return i <= j && j <= i + (sk - sq);
  }
  return false;
}

// A random range inside [0, n], both ends uniform.
Range rand_range(std::mt19937_64& rng, std::int64_t n) {
  const std::int64_t a = std::int64_t(rng() % std::uint64_t(n + 1));
  const std::int64_t b = std::int64_t(rng() % std::uint64_t(n + 1));
  return a <= b ? Range{a, b} : Range{b, a};
}

std::int64_t naive_area(const Slice& s, Range rows, Range cols) {
  std::int64_t n = 0;
  for (std::int64_t q = rows.start; q < rows.end; ++q)
    for (std::int64_t k = cols.start; k < cols.end; ++k) n += naive_visible(s, q, k);
  return n;
}

std::string what(const Slice& s, Range rows, Range cols) {
  return to_string(s) + " rows " + to_string(rows) + " cols " + to_string(cols);
}

void check_slice_everywhere(const Slice& s, std::int64_t total_q, std::int64_t total_k,
                            const std::string& note) {
  const Range all_q{0, total_q}, all_k{0, total_k};
  ASSERT_EQ(area(s), naive_area(s, all_q, all_k)) << to_string(s) << " " << note;
  for (std::int64_t q = 0; q < total_q; ++q) {
    const Range keys = visible_keys(s, q);
    for (std::int64_t k = 0; k < total_k; ++k)
      ASSERT_EQ(visible(s, q, k), naive_visible(s, q, k))
          << to_string(s) << " at (" << q << ", " << k << ") " << note;
    ASSERT_EQ(keys.size(), naive_area(s, Range{q, q + 1}, all_k)) << to_string(s) << " row " << q;
  }
}

TEST(Mask, TypeTableOnSquareAndRectangles) {
  // sq = sk, sq < sk, sq > sk for every type, offset from the origin.
  for (int t = 0; t < 4; ++t)
    for (auto [sq, sk] : {std::pair{5, 5}, {3, 7}, {7, 3}, {1, 1}, {1, 4}, {4, 1}, {0, 3}, {3, 0}})
      check_slice_everywhere(Slice{{2, 2 + sq}, {1, 1 + sk}, MaskType(t)}, 12, 12, "");
}

// Areas are exact int64 counts: a mask with more than 2^62 cells is refused before any area
// is computed (a 10^12-token file overflowed inside the overlap check: UBSan), 2^31 square is
// the largest accepted.
TEST(Mask, RefusesMoreCellsThanAnAreaCounts) {
  const std::int64_t big = std::int64_t(1) << 31;
  const Mask ok(big, big, {Slice{{0, big}, {0, big}, MaskType::kCausal}});
  EXPECT_EQ(ok.area(), big * (big + 1) / 2);
  try {
    Mask(big + 1, big, {Slice{{0, big + 1}, {0, big}, MaskType::kFull}});
    ADD_FAILURE() << "no error for 2^62 + 2^31 cells";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("total_seqlen_q x total_seqlen_k = 2147483649 x 2147483648 "
                                    "cells: more than the 2^62"));
  }
  EXPECT_THROW(Mask(1000000000000, 1000000000000, {}), Error);
  EXPECT_NO_THROW(Mask(std::int64_t(1) << 62, 0, {}));
}

TEST(Mask, DocumentedConsequences) {
  // sq == sk: BI_CAUSAL is the diagonal; sq > sk: BI_CAUSAL is empty and CAUSAL hides rows.
  EXPECT_EQ(area(Slice{{0, 6}, {0, 6}, MaskType::kBiCausal}), 6);
  EXPECT_EQ(area(Slice{{0, 6}, {0, 4}, MaskType::kBiCausal}), 0);
  EXPECT_EQ(area(Slice{{0, 6}, {0, 4}, MaskType::kCausal}, Range{0, 2}), 0);
  EXPECT_EQ(area(Slice{{0, 4}, {0, 6}, MaskType::kBiCausal}), 4 * 3);  // width sk - sq + 1
  EXPECT_EQ(area(Slice{{0, 4}, {0, 4}, MaskType::kCausal}), 10);
  EXPECT_EQ(visible_keys(Slice{{0, 4}, {0, 6}, MaskType::kCausal}, 0), (Range{0, 3}));
  EXPECT_EQ(visible_keys(Slice{{0, 4}, {0, 6}, MaskType::kInvCausal}, 3), (Range{3, 6}));
}

TEST(Mask, AreaOverSubRectanglesRandom) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  const int iters = testing::full_level() ? 20000 : 3000;
  auto pick = [&](std::int64_t n) { return std::int64_t(rng() % std::uint64_t(n + 1)); };
  for (int it = 0; it < iters; ++it) {
    const std::int64_t n = 1 + pick(40);
    std::int64_t a = pick(n), b = pick(n), c = pick(n), d = pick(n);
    if (a > b) std::swap(a, b);
    if (c > d) std::swap(c, d);
    const Slice s{{a, b}, {c, d}, MaskType(rng() % 4)};
    std::int64_t r0 = pick(n), r1 = pick(n), c0 = pick(n), c1 = pick(n);
    if (r0 > r1) std::swap(r0, r1);
    if (c0 > c1) std::swap(c0, c1);
    const Range rows{r0, r1}, cols{c0, c1};
    ASSERT_EQ(area(s, rows, cols), naive_area(s, rows, cols))
        << what(s, rows, cols) << " " << testing::seed_note(seed);
    ASSERT_EQ(area(s, rows), naive_area(s, rows, Range{0, n})) << testing::seed_note(seed);
    const std::int64_t cells = naive_area(s, rows, cols);
    const TileClass expect = cells == 0                          ? TileClass::kEmpty
                             : cells == rows.size() * cols.size() ? TileClass::kFull
                                                                  : TileClass::kPartial;
    ASSERT_EQ(classify(s, rows, cols), expect) << what(s, rows, cols) << testing::seed_note(seed);
  }
}

TEST(Mask, KeysSeenByAndRowsSeeingAreExactUnions) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 3000; ++it) {
    const Slice s{rand_range(rng, 24), rand_range(rng, 24), MaskType(rng() % 4)};
    const Range rows = rand_range(rng, 24), keys = rand_range(rng, 24);
    std::int64_t k_lo = 1 << 20, k_hi = -1, q_lo = 1 << 20, q_hi = -1;
    for (std::int64_t q = rows.start; q < rows.end; ++q)
      for (std::int64_t k = 0; k < 24; ++k)
        if (naive_visible(s, q, k)) k_lo = std::min(k_lo, k), k_hi = std::max(k_hi, k);
    for (std::int64_t k = keys.start; k < keys.end; ++k)
      for (std::int64_t q = 0; q < 24; ++q)
        if (naive_visible(s, q, k)) q_lo = std::min(q_lo, q), q_hi = std::max(q_hi, q);
    const Range seen = keys_seen_by(s, rows), seeing = rows_seeing(s, keys);
    ASSERT_EQ(seen.size(), k_hi < 0 ? 0 : k_hi - k_lo + 1) << what(s, rows, keys) << testing::seed_note(seed);
    if (k_hi >= 0) {
      ASSERT_EQ(seen, (Range{k_lo, k_hi + 1})) << what(s, rows, keys);
    }
    ASSERT_EQ(seeing.size(), q_hi < 0 ? 0 : q_hi - q_lo + 1) << what(s, rows, keys) << testing::seed_note(seed);
    if (q_hi >= 0) {
      ASSERT_EQ(seeing, (Range{q_lo, q_hi + 1})) << what(s, rows, keys);
    }
  }
}

TEST(Mask, BandToSlicesIsExactAndSmall) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 3000; ++it) {
    const Slice s{rand_range(rng, 20), rand_range(rng, 20), MaskType(rng() % 4)};
    const Range rows = rand_range(rng, 20), cols = rand_range(rng, 20);
    const Band band = band_of(s);
    const std::vector<Slice> pieces =
        band_to_slices(rows.intersect(s.q_range), cols.intersect(s.k_range), band);
    ASSERT_LE(pieces.size(), 3u);
    const std::string note = what(s, rows, cols) + " " + testing::seed_note(seed);
    ASSERT_NO_THROW(Mask(20, 20, pieces)) << note;  // valid and non-overlapping
    for (std::int64_t q = 0; q < 20; ++q)
      for (std::int64_t k = 0; k < 20; ++k) {
        const bool want = rows.contains(q) && cols.contains(k) && naive_visible(s, q, k);
        int covered = 0;
        for (const Slice& p : pieces) covered += naive_visible(p, q, k);
        ASSERT_EQ(covered, want ? 1 : 0) << "cell (" << q << ", " << k << ") of " << note;
      }
  }
}

TEST(Mask, LargeAreasAreExact) {
  const std::int64_t n = 4 << 20;  // 4M tokens: areas ~ 8.8e12 cells
  EXPECT_EQ(area(Slice{{0, n}, {0, n}, MaskType::kCausal}), n * (n + 1) / 2);
  EXPECT_EQ(area(Slice{{0, n}, {0, n}, MaskType::kFull}), n * n);
  EXPECT_EQ(area(Slice{{0, n}, {0, n}, MaskType::kBiCausal}), n);
  const Mask m(n, n, {Slice{{0, n}, {0, n}, MaskType::kCausal}});
  EXPECT_EQ(m.area(Range{n - 1, n}), n);
}

TEST(Mask, TileGridMatchesCellCounts) {
  const std::uint64_t seed = testing::test_seed();
  const Mask m(50, 61,
               {Slice{{0, 20}, {0, 20}, MaskType::kCausal}, Slice{{20, 50}, {0, 10}, MaskType::kFull},
                Slice{{20, 50}, {10, 61}, MaskType::kInvCausal},
                Slice{{5, 15}, {30, 45}, MaskType::kBiCausal}});
  for (std::int64_t bq : {1, 3, 8, 16, 64})
    for (std::int64_t bk : {1, 5, 8, 64}) {
      const TileGrid g = m.classify_tiles(bq, bk);
      for (std::int64_t qi = 0; qi < g.num_q_tiles; ++qi)
        for (std::int64_t ki = 0; ki < g.num_k_tiles; ++ki) {
          const Range rows{qi * bq, std::min<std::int64_t>((qi + 1) * bq, 50)};
          const Range cols{ki * bk, std::min<std::int64_t>((ki + 1) * bk, 61)};
          std::int64_t cells = 0;
          for (std::int64_t q = rows.start; q < rows.end; ++q)
            for (std::int64_t k = cols.start; k < cols.end; ++k) cells += m.visible(q, k);
          const TileClass expect = cells == 0 ? TileClass::kEmpty
                                   : cells == rows.size() * cols.size() ? TileClass::kFull
                                                                        : TileClass::kPartial;
          ASSERT_EQ(g.at(qi, ki), expect) << "tile " << qi << "," << ki << " of " << bq << "x"
                                          << bk << " " << testing::seed_note(seed);
          ASSERT_EQ(m.area(rows, cols), cells);
        }
    }
  EXPECT_THROW(m.classify_tiles(0, 8), Error);
}

std::string error_of(std::int64_t tq, std::int64_t tk, std::vector<Slice> slices) {
  try {
    Mask m(tq, tk, std::move(slices));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MaskValidation, ReversedRange) {
  EXPECT_THAT(error_of(10, 10, {Slice{{0, 5}, {0, 5}}, Slice{{0, 5}, {8, 6}}}),
              HasSubstr("slice 1: k_range [8, 6) is reversed"));
  EXPECT_THAT(error_of(10, 10, {Slice{{4, 3}, {0, 5}}}), HasSubstr("slice 0: q_range [4, 3) is reversed"));
}

TEST(MaskValidation, NegativeStartAndBeyondSequence) {
  EXPECT_THAT(error_of(10, 10, {Slice{{-1, 3}, {0, 5}}}), HasSubstr("starts before 0"));
  EXPECT_THAT(error_of(10, 10, {Slice{{0, 11}, {0, 5}}}),
              HasSubstr("slice 0: q_range [0, 11) lies beyond total_seqlen_q 10"));
  EXPECT_THAT(error_of(10, 8, {Slice{{0, 1}, {0, 9}}}),
              HasSubstr("k_range [0, 9) lies beyond total_seqlen_k 8"));
  EXPECT_THAT(error_of(-1, 8, {}), HasSubstr("total_seqlen_q -1 is negative"));
  EXPECT_THAT(error_of(1, -8, {}), HasSubstr("total_seqlen_k -8 is negative"));
}

TEST(MaskValidation, UnknownType) {
  EXPECT_THAT(error_of(4, 4, {Slice{{0, 4}, {0, 4}, static_cast<MaskType>(7)}}),
              HasSubstr("slice 0: unknown mask type 7"));
  EXPECT_THAT([] {
    try {
      mask_type_from_int(9, "slice 4");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), HasSubstr("slice 4: unknown mask type 9"));
  EXPECT_EQ(mask_type_from_name("INV_CAUSAL"), MaskType::kInvCausal);
  EXPECT_EQ(mask_type_from_name("3"), MaskType::kBiCausal);
  EXPECT_THROW(mask_type_from_name("diagonal"), Error);
}

TEST(MaskValidation, OverlapNamesBothSlicesAndACell) {
  // Two causal triangles meeting only where one's band reaches the other.
  const std::string msg = error_of(
      20, 20, {Slice{{0, 10}, {0, 10}, MaskType::kCausal}, Slice{{10, 20}, {0, 20}},
               Slice{{5, 10}, {3, 10}, MaskType::kInvCausal}});
  EXPECT_THAT(msg, HasSubstr("slices 0 ("));
  EXPECT_THAT(msg, HasSubstr(") and 2 ("));
  EXPECT_THAT(msg, HasSubstr("both cover cell (q 5, k 3)"));
  // Bands that share rectangles but not cells are fine: causal + inv_causal tail pieces.
  EXPECT_EQ(error_of(8, 8, {Slice{{0, 8}, {0, 8}, MaskType::kCausal},
                            Slice{{0, 7}, {1, 8}, MaskType::kInvCausal}}),
            "");
  // Empty slices never overlap anything.
  EXPECT_EQ(error_of(8, 8, {Slice{{0, 8}, {0, 8}}, Slice{{3, 3}, {0, 8}}, Slice{{0, 8}, {4, 4}}}),
            "");
}

TEST(MaskValidation, OverlapWitnessIsAlwaysASharedCell) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  int overlaps = 0;
  for (int it = 0; it < 2000; ++it) {
    const Slice s{rand_range(rng, 16), rand_range(rng, 16), MaskType(rng() % 4)};
    const Slice t{rand_range(rng, 16), rand_range(rng, 16), MaskType(rng() % 4)};
    const std::string msg = error_of(16, 16, {s, t});
    std::int64_t shared = 0, q0 = -1, k0 = -1;
    for (std::int64_t q = 0; q < 16; ++q)
      for (std::int64_t k = 0; k < 16; ++k)
        if (naive_visible(s, q, k) && naive_visible(t, q, k)) {
          if (shared++ == 0) q0 = q, k0 = k;
        }
    ASSERT_EQ(msg.empty(), shared == 0) << to_string(s) << " / " << to_string(t) << " "
                                        << testing::seed_note(seed);
    if (shared) {
      ++overlaps;
      ASSERT_THAT(msg, HasSubstr("cell (q " + std::to_string(q0) + ", k " + std::to_string(k0)))
          << to_string(s) << " / " << to_string(t) << " " << testing::seed_note(seed);
    }
  }
  EXPECT_GT(overlaps, 100);
}

TEST(Mask, SparsityAndToString) {
  const Mask m(4, 4, {Slice{{0, 4}, {0, 4}, MaskType::kCausal}});
  EXPECT_DOUBLE_EQ(m.sparsity(), 1.0 - 10.0 / 16.0);
  EXPECT_THAT(m.to_string(), HasSubstr("0: q [0, 4) k [0, 4) causal"));
  EXPECT_EQ(Mask().sparsity(), 0.0);
}

}  // namespace
}  // namespace magi
