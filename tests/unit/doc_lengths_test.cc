// Document-length sampling: sums are exact, caps hold, draws are pinned per seed (portable
// mapping, golden values), the built-in table is the published histogram, and CSV errors
// name the file, the line and the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>

#include "magi/doc_lengths.h"
#include "magi/error.h"
#include "error_of.h"
#include "seed.h"

namespace magi {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "magi_doc_lengths_" + name;
  std::ofstream(path) << text;
  return path;
}

using magi::testing::error_of;

std::int64_t sum(const std::vector<std::int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::int64_t{0});
}

TEST(DocLengths, BuiltinIsThePublishedHistogram) {
  const auto bins = DocLengthHistogram::builtin().bins;
  ASSERT_EQ(bins.size(), 14u);
  EXPECT_EQ(bins.front().lo, 0);
  EXPECT_EQ(bins.back().hi, 196608);
  double total = 0;
  for (std::size_t i = 0; i < bins.size(); ++i) {
    if (i > 0) {
      EXPECT_EQ(bins[i].lo, bins[i - 1].hi + 1) << "bins must tile the lengths, bin " << i;
    }
    EXPECT_GT(bins[i].weight, 0) << "bin " << i;
    total += bins[i].weight;
  }
  // 14 figures each rounded to 0.01 can miss 100 by at most 14 * 0.005.
  EXPECT_NEAR(total, 100.0, 0.07);
  EXPECT_DOUBLE_EQ(bins[4].weight, 28.19);  // [201, 500], the mode
}

// The published file is not part of the repository; point MAGI_DOC_LENGTHS_CSV at it to
// check the built-in figures against it.
TEST(DocLengths, BuiltinMatchesPublishedCsv) {
  const char* path = std::getenv("MAGI_DOC_LENGTHS_CSV");
  if (!path || !*path) GTEST_SKIP() << "set MAGI_DOC_LENGTHS_CSV to the published csv";
  const auto published = DocLengthHistogram::from_csv(path).bins;
  const auto builtin = DocLengthHistogram::builtin().bins;
  ASSERT_EQ(published.size(), builtin.size());
  for (std::size_t i = 0; i < builtin.size(); ++i) {
    EXPECT_EQ(builtin[i].lo, published[i].lo) << "bin " << i;
    EXPECT_EQ(builtin[i].hi, published[i].hi) << "bin " << i;
    EXPECT_NEAR(builtin[i].weight, published[i].weight, 0.005) << "bin " << i;
  }
}

TEST(DocLengths, CsvInThePublishedFormRoundTrips) {
  std::string text = "range,number,percentage(%),cumulative-percentage(%)\r\n";
  const auto builtin = DocLengthHistogram::builtin().bins;
  double cumulative = 0;
  for (const auto& b : builtin) {
    cumulative += b.weight;
    text += "\"[" + std::to_string(b.lo) + ", " + std::to_string(b.hi) + "]\",1000," +
            std::to_string(b.weight) + "," + std::to_string(cumulative) + "\r\n";
  }
  const auto parsed = DocLengthHistogram::from_csv(write_file("roundtrip.csv", text + "\n")).bins;
  ASSERT_EQ(parsed.size(), builtin.size());
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    EXPECT_EQ(parsed[i].lo, builtin[i].lo);
    EXPECT_EQ(parsed[i].hi, builtin[i].hi);
    EXPECT_NEAR(parsed[i].weight, builtin[i].weight, 1e-6);
  }
}

TEST(DocLengths, CsvColumnsAreFoundByName) {
  const auto path = write_file("reordered.csv", "Percentage,Range\n3,\"[1, 2]\"\n1, \"[5,5]\" \n");
  const auto bins = DocLengthHistogram::from_csv(path).bins;
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_EQ(bins[1].lo, 5);
  EXPECT_EQ(bins[1].hi, 5);
  EXPECT_DOUBLE_EQ(bins[0].weight, 3.0);
}

TEST(DocLengths, CsvErrorsNameFileLineAndField) {
  const std::string header = "range,percentage(%)\n";
  EXPECT_THAT(error_of([] { DocLengthHistogram::from_csv("/nonexistent/lengths.csv"); }),
              HasSubstr("'/nonexistent/lengths.csv' cannot be opened"));
  EXPECT_THAT(error_of([&] { DocLengthHistogram::from_csv(write_file("empty.csv", "")); }),
              HasSubstr("is empty"));
  EXPECT_THAT(
      error_of([&] { DocLengthHistogram::from_csv(write_file("nohead.csv", "range,number\n")); }),
      AllOf(HasSubstr("line 1"), HasSubstr("'percentage'")));
  const auto reversed = write_file("reversed.csv", header + "\"[0, 10]\",1\n\"[9, 2]\",1\n");
  EXPECT_THAT(error_of([&] { DocLengthHistogram::from_csv(reversed); }),
              AllOf(HasSubstr("line 3"), HasSubstr("'[9, 2]'"), HasSubstr("lo <= hi")));
  const auto unbracketed = write_file("unbracketed.csv", header + "10-20,1\n");
  EXPECT_THAT(error_of([&] { DocLengthHistogram::from_csv(unbracketed); }),
              AllOf(HasSubstr("line 2"), HasSubstr("'10-20'")));
  const auto words = write_file("words.csv", header + "\"[a, 3]\",1\n");
  EXPECT_THAT(error_of([&] { DocLengthHistogram::from_csv(words); }),
              AllOf(HasSubstr("line 2"), HasSubstr("two integers")));
  const auto weight = write_file("weight.csv", header + "\"[1, 3]\",1\n\n\"[4, 5]\",-2\n");
  EXPECT_THAT(error_of([&] { DocLengthHistogram::from_csv(weight); }),
              AllOf(HasSubstr("line 4"), HasSubstr("percentage '-2'")));
  const auto columns = write_file("columns.csv", header + "\"[1, 3]\"\n");
  EXPECT_THAT(error_of([&] { DocLengthHistogram::from_csv(columns); }),
              AllOf(HasSubstr("line 2"), HasSubstr("got 1")));
  const auto zero = write_file("zero.csv", header + "\"[1, 3]\",0\n");
  EXPECT_THAT(error_of([&] { DocLengthHistogram::from_csv(zero); }),
              HasSubstr("no bin with a positive percentage"));
}

TEST(DocLengths, EdgeTotals) {
  const auto hist = DocLengthHistogram::builtin();
  EXPECT_TRUE(sample_doc_lengths(hist, 0, 0, 1).empty());
  EXPECT_EQ(sample_doc_lengths(hist, 1, 0, 1), std::vector<std::int64_t>{1});
  EXPECT_EQ(sample_doc_lengths(hist, 3, 0, 1), (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_THAT(error_of([&] { sample_doc_lengths(hist, -1, 0, 1); }), HasSubstr("negative"));
  EXPECT_THAT(error_of([] { sample_doc_lengths({}, 10, 0, 1); }),
              HasSubstr("no bin has a positive weight"));
  EXPECT_THAT(error_of([] {
                sample_doc_lengths({{{5, 2, 1.0}}}, 10, 0, 1);
              }),
              HasSubstr("doc length bin 0"));
}

TEST(DocLengths, LastDocumentIsCutAndZeroLengthsBecomeOne) {
  const DocLengthHistogram fixed{{{1000, 1000, 1.0}}};
  EXPECT_EQ(sample_doc_lengths(fixed, 2500, 5000, 7), (std::vector<std::int64_t>{1000, 1000, 500}));
  EXPECT_EQ(sample_doc_lengths(fixed, 2500, 0, 7), (std::vector<std::int64_t>(4, 625)));
  const DocLengthHistogram zeros{{{0, 0, 1.0}}};
  EXPECT_EQ(sample_doc_lengths(zeros, 5, 0, 7), (std::vector<std::int64_t>(5, 1)));
}

TEST(DocLengths, ZeroWeightBinsAreNeverDrawn) {
  const DocLengthHistogram hist{{{1, 9, 0.0}, {10, 20, 2.0}, {21, 99, 0.0}}};
  const auto lengths = sample_doc_lengths(hist, 100000, 1000, 3);
  for (std::size_t d = 0; d + 1 < lengths.size(); ++d) {  // the last one is cut
    ASSERT_TRUE(lengths[d] >= 10 && lengths[d] <= 20) << lengths[d];
  }
}

TEST(DocLengths, GoldenDrawsArePortable) {
  // Pinned: these numbers must not change with the standard library or the platform.
  const auto lengths = sample_doc_lengths(DocLengthHistogram::builtin(), 4096, 0, 42);
  EXPECT_EQ(lengths, (std::vector<std::int64_t>{1024, 1024, 1024, 549, 358, 33, 84}));
}

TEST(DocLengths, RandomSweepSumsCapsAndDeterminism) {
  const std::uint64_t seed = testing::test_seed();
  const auto hist = DocLengthHistogram::builtin();
  const int iters = testing::full_level() ? 2000 : 200;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t s = seed + std::uint64_t(it);
    const std::int64_t total = std::int64_t(s * 2654435761u % 70000);
    const std::int64_t cap = it % 3 == 0 ? 0 : std::int64_t(1 + s % 5000);
    const std::int64_t expect_cap = cap > 0 ? cap : std::max<std::int64_t>(1, total / 4);
    const auto lengths = sample_doc_lengths(hist, total, cap, s);
    ASSERT_EQ(sum(lengths), total) << testing::seed_note(s);
    for (auto len : lengths) ASSERT_TRUE(len >= 1 && len <= expect_cap) << testing::seed_note(s);
    ASSERT_EQ(lengths, sample_doc_lengths(hist, total, cap, s)) << testing::seed_note(s);
  }
  EXPECT_NE(sample_doc_lengths(hist, 16384, 0, seed), sample_doc_lengths(hist, 16384, 0, seed + 1));
}

TEST(DocLengths, DrawsFollowTheWeights) {
  const auto hist = DocLengthHistogram::builtin();
  const auto lengths = sample_doc_lengths(hist, 200'000'000, 1'000'000, testing::test_seed());
  std::vector<double> freq(hist.bins.size(), 0);
  for (std::size_t d = 0; d + 1 < lengths.size(); ++d) {  // the last one is cut
    for (std::size_t b = 0; b < hist.bins.size(); ++b) {
      if (lengths[d] >= std::max<std::int64_t>(1, hist.bins[b].lo) && lengths[d] <= hist.bins[b].hi)
        freq[b] += 1;
    }
  }
  const double total_weight = 100.02;
  for (std::size_t b = 0; b < hist.bins.size(); ++b) {
    // ~110k documents: a frequency's standard error is below 0.0015.
    EXPECT_NEAR(freq[b] / double(lengths.size() - 1), hist.bins[b].weight / total_weight, 0.01)
        << "bin " << b << " " << testing::seed_note(testing::test_seed());
  }
}

TEST(DocLengths, CuSeqlens) {
  EXPECT_EQ(cu_seqlens_from_lengths({}), std::vector<std::int64_t>{0});
  EXPECT_EQ(cu_seqlens_from_lengths({3, 0, 5}), (std::vector<std::int64_t>{0, 3, 3, 8}));
  EXPECT_THAT(error_of([] {
                cu_seqlens_from_lengths({2, -1});
              }),
              HasSubstr("document 1: length -1"));
}

}  // namespace
}  // namespace magi
