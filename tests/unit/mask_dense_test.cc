// from_dense / to_dense: exact round trips for any boolean matrix (structured masks from the
// builders, unions of random slices, and plain noise), plus slice counts that show the causal
// step detection works: a causal, banded or block mask must come back as a handful of slices.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "magi/error.h"
#include "magi/mask_builders.h"
#include "seed.h"

namespace magi {
namespace {

using ::testing::HasSubstr;
using Dense = std::vector<std::uint8_t>;
using T = MaskType;

// The test's own materialisation: every cell asked through Mask::visible.
Dense cells_of(const Mask& m) {
  Dense d(std::size_t(m.total_seqlen_q() * m.total_seqlen_k()));
  for (std::int64_t q = 0; q < m.total_seqlen_q(); ++q)
    for (std::int64_t k = 0; k < m.total_seqlen_k(); ++k)
      d[std::size_t(q * m.total_seqlen_k() + k)] = m.visible(q, k);
  return d;
}

std::string show(const Dense& d, std::int64_t sq, std::int64_t sk) {
  std::string s;
  for (std::int64_t q = 0; q < sq; ++q) {
    for (std::int64_t k = 0; k < sk; ++k) s += d[std::size_t(q * sk + k)] ? '#' : '.';
    s += '\n';
  }
  return s;
}

// Round trip; returns the mask so callers can bound its slice count.
Mask round_trip(const Dense& d, std::int64_t sq, std::int64_t sk, const std::string& note) {
  const Mask m = masks::from_dense(d, sq, sk);
  EXPECT_EQ(cells_of(m), d) << note << "\n" << show(d, sq, sk) << m.to_string();
  EXPECT_EQ(masks::to_dense(m), d) << note;
  return m;
}

TEST(MaskDense, ToDenseMatchesVisible) {
  const Mask m(5, 7,
               {{{0, 3}, {0, 4}, T::kCausal},
                {{1, 4}, {4, 7}, T::kInvCausal},
                {{4, 5}, {0, 7}, T::kFull},
                {{0, 1}, {5, 7}, T::kBiCausal}});
  EXPECT_EQ(masks::to_dense(m), cells_of(m));
  EXPECT_EQ(masks::to_dense(masks::causal(3, 3)), (Dense{1, 0, 0, 1, 1, 0, 1, 1, 1}));
  EXPECT_TRUE(masks::to_dense(masks::full(0, 5)).empty());
  EXPECT_EQ(masks::to_dense(Mask(2, 3, {})), Dense(6, 0));
}

TEST(MaskDense, DetectsEachSliceType) {
  // One slice of each type over sq < sk, sq == sk and sq > sk comes back as itself (after
  // trimming rows that see nothing).
  const Dense causal_8 = masks::to_dense(masks::causal(8, 8));
  EXPECT_EQ(masks::from_dense(causal_8, 8, 8).slices(),
            (std::vector<Slice>{{{0, 8}, {0, 8}, T::kCausal}}));
  EXPECT_EQ(masks::from_dense(masks::to_dense(masks::causal(4, 7)), 4, 7).slices(),
            (std::vector<Slice>{{{0, 4}, {0, 7}, T::kCausal}}));
  EXPECT_EQ(masks::from_dense(masks::to_dense(masks::causal(7, 4)), 7, 4).slices(),
            (std::vector<Slice>{{{3, 7}, {0, 4}, T::kCausal}}));
  const Mask inv(6, 9, {{{1, 5}, {2, 9}, T::kInvCausal}});
  EXPECT_EQ(masks::from_dense(masks::to_dense(inv), 6, 9), inv);
  const Mask bi(6, 9, {{{1, 5}, {2, 9}, T::kBiCausal}});
  EXPECT_EQ(masks::from_dense(masks::to_dense(bi), 6, 9), bi);
  const Mask diag(5, 5, {{{0, 5}, {0, 5}, T::kBiCausal}});
  EXPECT_EQ(masks::from_dense(masks::to_dense(diag), 5, 5), diag);
  // Identical rows are one FULL slice; a lone row is FULL whatever made it.
  const Mask rect(6, 9, {{{1, 5}, {3, 8}, T::kFull}});
  EXPECT_EQ(masks::from_dense(masks::to_dense(rect), 6, 9), rect);
  EXPECT_EQ(masks::from_dense(Dense{0, 1, 1, 0}, 1, 4).slices(),
            (std::vector<Slice>{{{0, 1}, {1, 3}, T::kFull}}));
}

TEST(MaskDense, EmptyAndDegenerate) {
  EXPECT_EQ(masks::from_dense({}, 0, 0).size(), 0u);
  EXPECT_EQ(masks::from_dense({}, 0, 4).total_seqlen_k(), 4);
  EXPECT_EQ(masks::from_dense({}, 3, 0).total_seqlen_q(), 3);
  EXPECT_EQ(masks::from_dense(Dense(12, 0), 3, 4).size(), 0u);
  EXPECT_EQ(masks::from_dense(Dense(12, 1), 3, 4).size(), 1u);
  EXPECT_EQ(masks::from_dense(Dense{1}, 1, 1).slices(),
            (std::vector<Slice>{{{0, 1}, {0, 1}, T::kFull}}));
  // Any nonzero byte is visible.
  EXPECT_EQ(masks::from_dense(Dense{0, 7, 255, 0}, 2, 2).area(), 2);
}

TEST(MaskDense, StructuredMasksGiveFewSlices) {
  const std::vector<std::int64_t> cu = {0, 5, 5, 17, 18, 30};
  struct Case {
    std::string name;
    Mask mask;
    std::size_t max_slices;
  };
  const std::vector<Case> cases = {
      {"causal", masks::causal(30, 30), 1},
      {"causal 20x30", masks::causal(20, 30), 1},
      {"varlen causal", masks::varlen_causal(cu), 4},
      {"varlen full", masks::varlen_full(cu), 4},
      {"sliding window", masks::sliding_window(30, 30, {4, 0}), 2},
      {"band", masks::sliding_window(30, 30, {3, 5}), 3},
      {"band 25x30", masks::sliding_window(25, 30, {3, 5}), 3},
      {"prefix lm", masks::prefix_lm(30, 9), 2},
      {"block causal", masks::block_causal(30, 7), 5},
      {"varlen window + globals", masks::varlen_sliding_window(cu, {3, 0}, 2), 5 * 4},
      {"shared question", masks::shared_question(6, std::vector<std::int64_t>{5, 9, 10}), 7},
  };
  for (const Case& c : cases) {
    const Mask m = round_trip(masks::to_dense(c.mask), c.mask.total_seqlen_q(),
                              c.mask.total_seqlen_k(), c.name);
    EXPECT_LE(m.size(), c.max_slices) << c.name << "\n" << m.to_string();
  }
}

TEST(MaskDense, ArgumentErrors) {
  auto expect_error = [](auto f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no magi::Error; expected one containing: " << needle;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(needle));
    }
  };
  expect_error([] { masks::from_dense(Dense(6), 2, 4); },
               "dense mask has 6 entries but seqlen_q x seqlen_k is 2 x 4");
  expect_error([] { masks::from_dense(Dense(6), 2, 0); }, "dense mask has 6 entries");
  expect_error([] { masks::from_dense(Dense(7), 2, 3); }, "dense mask has 7 entries");
  expect_error([] { masks::from_dense({}, -1, 0); }, "seqlen_q is negative");
  expect_error([] { masks::from_dense({}, 0, -3); }, "seqlen_k is negative");
}

TEST(MaskDense, RandomRoundTrips) {
  const std::uint64_t seed = testing::test_seed();
  const std::string note = testing::seed_note(seed);
  std::mt19937_64 rng(seed);
  const int iters = testing::full_level() ? 20000 : 2000;
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + std::int64_t(rng() % std::uint64_t(hi - lo + 1));
  };
  for (int it = 0; it < iters; ++it) {
    const std::int64_t sq = pick(0, 40), sk = pick(0, 40);
    Dense d(std::size_t(sq * sk), 0);
    const int kind = it % 3;
    if (kind == 0) {  // noise of random density
      const std::uint64_t density = rng() % 9;
      for (auto& x : d) x = rng() % 8 < density;
    } else {  // union of random slices (overlaps allowed in the dense picture)
      const int n = int(pick(1, kind == 1 ? 3 : 12));
      for (int s = 0; s < n && sq > 0 && sk > 0; ++s) {
        std::int64_t q0 = pick(0, sq), q1 = pick(0, sq), k0 = pick(0, sk), k1 = pick(0, sk);
        if (q0 > q1) std::swap(q0, q1);
        if (k0 > k1) std::swap(k0, k1);
        const Slice slice{{q0, q1}, {k0, k1}, MaskType(pick(0, 3))};
        for (std::int64_t q = q0; q < q1; ++q) {
          const Range keys = visible_keys(slice, q);
          for (std::int64_t k = keys.start; k < keys.end; ++k) d[std::size_t(q * sk + k)] = 1;
        }
      }
    }
    round_trip(d, sq, sk, "iteration " + std::to_string(it) + ", " + note);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace magi
