// Benchmark mask families: every name builds at edge and benchmark sizes with area > 0, the random
// ones are pinned by their seed, the docs/semantics.md §4 parameters show in the built masks, and
// bad names or parameters are errors that say what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "magi/error.h"
#include "magi/mask_families.h"
#include "error_of.h"
#include "seed.h"

namespace magi {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using magi::testing::error_of;

Mask build(std::string family, std::int64_t seqlen, std::uint64_t seed = 1) {
  FamilySpec spec;
  spec.family = std::move(family);
  spec.seqlen = seqlen;
  spec.seed = seed;
  return build_family(spec);
}

// Query rows of a document-packed mask, in order: they must tile [0, seqlen).
void expect_documents_tile(const Mask& mask, std::int64_t cap) {
  std::int64_t next = 0;
  for (const auto& s : mask.slices()) {
    EXPECT_EQ(s.q_range.start, next);
    EXPECT_LE(s.q_range.size(), cap);
    next = s.q_range.end;
  }
  EXPECT_EQ(next, mask.total_seqlen_q());
}

TEST(MaskFamilies, NamesInSpecOrder) {
  EXPECT_EQ(family_names(), (std::vector<std::string_view>{
                                "full", "causal", "varlen-full", "varlen-causal", "sliding-window",
                                "varlen-block-causal", "block-causal", "shared-prefix",
                                "shared-question", "prefix-lm", "block-sparse"}));
}

TEST(MaskFamilies, EveryFamilyBuildsAtEdgeAndBenchmarkSizes) {
  for (auto name : family_names()) {
    for (std::int64_t n : {1, 2, 127, 129, 2048, 5000, 16384}) {
      const Mask mask = build(std::string(name), n);
      EXPECT_EQ(mask.total_seqlen_q(), n) << name;
      EXPECT_EQ(mask.total_seqlen_k(), n) << name;
      EXPECT_GT(mask.area(), 0) << name << " at " << n;
      EXPECT_LE(mask.area(), n * n) << name << " at " << n;
    }
  }
}

TEST(MaskFamilies, DenseFamiliesHaveTheirClosedFormArea) {
  const std::int64_t n = 3000;
  EXPECT_EQ(build("full", n).area(), n * n);
  EXPECT_EQ(build("causal", n).area(), n * (n + 1) / 2);
  // prefix-lm with the default prefix n/4 = 750: the prefix square plus a causal tail.
  EXPECT_EQ(build("prefix-lm", n).area(), 750 * 750 + (n * (n + 1) / 2 - 750 * 751 / 2));
  // block-causal, block 2048: rows [0, 2048) see 2048 keys, rows [2048, 3000) see all 3000.
  EXPECT_EQ(build("block-causal", n).area(), 2048 * 2048 + 952 * 3000);
}

TEST(MaskFamilies, DocumentsAreCappedAtAQuarter) {
  for (auto name : {"varlen-full", "varlen-causal"}) {
    const Mask mask = build(name, 16384, 5);
    EXPECT_GT(mask.size(), 1u) << name;
    expect_documents_tile(mask, 4096);
  }
  FamilySpec spec;
  spec.family = "varlen-full";
  spec.seqlen = 16384;
  spec.max_doc_len = 100;
  expect_documents_tile(build_family(spec), 100);
  spec.max_doc_len = 0;
  spec.doc_lengths = DocLengthHistogram{{{512, 512, 1.0}}};
  const Mask fixed = build_family(spec);
  EXPECT_EQ(fixed.size(), 32u);
  EXPECT_EQ(fixed.area(), 32 * 512 * 512);
}

TEST(MaskFamilies, SlidingWindowSeesWindowPlusOneKeys) {
  FamilySpec spec;
  spec.family = "sliding-window";
  spec.seqlen = 8192;
  spec.window = 100;
  spec.doc_lengths = DocLengthHistogram{{{4096, 4096, 1.0}}};
  const Mask mask = build_family(spec);
  for (std::int64_t q : {0, 50, 100, 101, 4095, 4096, 4200, 8191}) {
    const std::int64_t in_doc = q % 4096;
    EXPECT_EQ(mask.area(Range{q, q + 1}), std::min<std::int64_t>(in_doc, 100) + 1) << "row " << q;
  }
}

TEST(MaskFamilies, BlockSparseHasTheRequestedDensityPerRow) {
  FamilySpec spec;
  spec.family = "block-sparse";
  spec.seqlen = 4096;  // 32 blocks of 128; 10% of 32 rounds to 3 per row
  const Mask mask = build_family(spec);
  for (std::int64_t row = 0; row < 32; ++row) {
    EXPECT_EQ(mask.area(Range{row * 128, row * 128 + 128}), 3 * 128 * 128) << "block row " << row;
  }
  spec.block = 256;
  spec.density = 0.5;
  EXPECT_EQ(build_family(spec).area(), 16 * 8 * 256 * 256);
}

TEST(MaskFamilies, VarlenBlockCausalUsesBlock2048) {
  FamilySpec spec;
  spec.family = "varlen-block-causal";
  spec.seqlen = 8192;
  spec.doc_lengths = DocLengthHistogram{{{8192, 8192, 1.0}}};
  spec.max_doc_len = 8192;
  EXPECT_EQ(build_family(spec).area(), 2048LL * (2048 + 4096 + 6144 + 8192));
}

TEST(MaskFamilies, SharedQuestionAnswersSeeTheQuestion) {
  FamilySpec spec;
  spec.family = "shared-question";
  spec.seqlen = 1000;
  spec.prefix_len = 400;
  spec.doc_lengths = DocLengthHistogram{{{200, 200, 1.0}}};
  const Mask mask = build_family(spec);
  // Question: causal 400; three answers of 200: each sees the question and itself causally.
  EXPECT_EQ(mask.area(), 400 * 401 / 2 + 3 * (200 * 400 + 200 * 201 / 2));
  EXPECT_EQ(build_family(spec), [&] {
    spec.family = "shared-prefix";
    return build_family(spec);
  }());
}

TEST(MaskFamilies, RandomFamiliesArePinnedBySeed) {
  const std::uint64_t seed = testing::test_seed();
  for (auto name : {"varlen-full", "varlen-causal", "sliding-window", "varlen-block-causal",
                    "shared-question", "block-sparse"}) {
    const Mask a = build(name, 16384, seed);
    EXPECT_EQ(a, build(name, 16384, seed)) << name << " " << testing::seed_note(seed);
    EXPECT_NE(a, build(name, 16384, seed + 1)) << name << " " << testing::seed_note(seed);
  }
}

TEST(MaskFamilies, RandomSweepStaysValid) {
  const std::uint64_t seed = testing::test_seed();
  const int iters = testing::full_level() ? 400 : 40;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t s = seed + std::uint64_t(it);
    const auto& names = family_names();
    FamilySpec spec;
    spec.family = std::string(names[s % names.size()]);
    spec.seqlen = std::int64_t(1 + s * 2654435761u % 20000);
    spec.seed = s;
    spec.window = std::int64_t(s % 3000);
    spec.block = std::int64_t(s % 5 == 0 ? 0 : 1 + s % 4000);
    spec.density = double(1 + s % 100) / 100;
    Mask mask;
    ASSERT_NO_THROW(mask = build_family(spec)) << spec.family << " " << testing::seed_note(s);
    ASSERT_GT(mask.area(), 0) << spec.family << " " << testing::seed_note(s);
  }
}

TEST(MaskFamilies, BadNamesAndParametersAreErrors) {
  EXPECT_THAT(error_of([] { build("nope", 128); }),
              AllOf(HasSubstr("unknown mask family 'nope'"), HasSubstr("varlen-causal"),
                    HasSubstr("block-sparse")));
  EXPECT_THAT(error_of([] { build("causal", 0); }), HasSubstr("seqlen 0 must be positive"));
  FamilySpec spec;
  spec.seqlen = 1024;
  spec.family = "block-sparse";
  spec.density = 0;
  EXPECT_THAT(error_of([&] { build_family(spec); }), HasSubstr("density 0 must be in (0, 1]"));
  spec.density = 1.5;
  EXPECT_THAT(error_of([&] { build_family(spec); }), HasSubstr("density 1.5"));
  spec.family = "block-causal";
  spec.block = -4;
  EXPECT_THAT(error_of([&] { build_family(spec); }), HasSubstr("block -4 is negative"));
  spec.family = "sliding-window";
  spec.window = -1;
  EXPECT_THAT(error_of([&] { build_family(spec); }), HasSubstr("window -1 is negative"));
  spec.family = "prefix-lm";
  spec.prefix_len = 2000;
  EXPECT_THAT(error_of([&] { build_family(spec); }),
              HasSubstr("prefix length 2000 exceeds seqlen 1024"));
}

}  // namespace
}  // namespace magi
