// JSON mask files: round trips (compact, pretty, through a file), type names, and every error
// path with the field and index it must name.
#include "magi/mask_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "magi/error.h"
#include "magi/mask_builders.h"
#include "seed.h"

namespace magi {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using T = MaskType;

void expect_error(const std::string& text, const std::string& needle) {
  try {
    mask_from_json(text);
    ADD_FAILURE() << "no magi::Error for " << text << "; expected: " << needle;
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(needle)) << text;
  }
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

// A valid file with one field's value replaced.
std::string with(const std::string& field, const std::string& value) {
  std::string q = R"([[0, 2], [2, 4]])", k = R"([[0, 2], [0, 4]])", t = "[0, 1]", tq = "4",
              tk = "4";
  if (field == "q_ranges") q = value;
  if (field == "k_ranges") k = value;
  if (field == "attn_type_map") t = value;
  if (field == "total_seqlen_q") tq = value;
  if (field == "total_seqlen_k") tk = value;
  return R"({"total_seqlen_q": )" + tq + R"(, "total_seqlen_k": )" + tk + R"(, "q_ranges": )" + q +
         R"(, "k_ranges": )" + k + R"(, "attn_type_map": )" + t + "}";
}

TEST(MaskJson, ParsesTheSpecFormat) {
  const Mask m = mask_from_json(with("", ""));
  EXPECT_EQ(m, Mask(4, 4, {{{0, 2}, {0, 2}, T::kFull}, {{2, 4}, {0, 4}, T::kCausal}}));
  // Names (any case) and "0".."3" strings are accepted; unknown extra fields are ignored.
  const Mask named = mask_from_json(
      R"({"total_seqlen_q": 6, "total_seqlen_k": 8, "comment": "x",
          "q_ranges": [[0, 2], [2, 3], [3, 5], [5, 6]],
          "k_ranges": [[0, 2], [0, 3], [0, 4], [0, 8]],
          "attn_type_map": ["full", "CAUSAL", "inv_causal", "3"]})");
  EXPECT_EQ(named.slices(), (std::vector<Slice>{{{0, 2}, {0, 2}, T::kFull},
                                                {{2, 3}, {0, 3}, T::kCausal},
                                                {{3, 5}, {0, 4}, T::kInvCausal},
                                                {{5, 6}, {0, 8}, T::kBiCausal}}));
  const Mask empty = mask_from_json(
      R"({"total_seqlen_q": 0, "total_seqlen_k": 3, "q_ranges": [], "k_ranges": [],
          "attn_type_map": []})");
  EXPECT_EQ(empty, Mask(0, 3, {}));
}

TEST(MaskJson, RoundTrips) {
  const std::vector<std::int64_t> cu = {0, 5, 5, 17, 30};
  for (const Mask& m : {Mask(), masks::full(3, 0), masks::causal(30, 20),
                        masks::varlen_sliding_window(cu, {3, 1}, 2),
                        masks::shared_question(4, std::vector<std::int64_t>{3, 3})}) {
    EXPECT_EQ(mask_from_json(mask_to_json(m)), m) << m.to_string();
    EXPECT_EQ(mask_from_json(mask_to_json(m, 0)), m) << m.to_string();
    EXPECT_EQ(mask_from_json(mask_to_json(m, 4)), m) << m.to_string();
  }
  // Pretty output: one field per line, arrays inline, types as integers.
  const std::string pretty = mask_to_json(masks::sliding_window(8, 8, {2, 2}), 2);
  EXPECT_EQ(pretty,
            "{\n"
            "  \"total_seqlen_q\": 8,\n"
            "  \"total_seqlen_k\": 8,\n"
            "  \"q_ranges\": [[0,2],[2,6],[6,8]],\n"
            "  \"k_ranges\": [[0,4],[0,8],[4,8]],\n"
            "  \"attn_type_map\": [1,3,2]\n"
            "}\n");
}

TEST(MaskJson, RandomRoundTrips) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 100; ++it) {
    std::vector<std::int64_t> cu = {0};
    for (int d = 0; d < 1 + int(rng() % 5); ++d) cu.push_back(cu.back() + std::int64_t(rng() % 20));
    const masks::Window w{std::int64_t(rng() % 8) - 1, std::int64_t(rng() % 8) - 1};
    const Mask m = masks::varlen_sliding_window(cu, w, std::int64_t(rng() % 4));
    ASSERT_EQ(mask_from_json(mask_to_json(m, int(rng() % 3) - 1)), m)
        << "iteration " << it << ", " << testing::seed_note(seed);
  }
}

TEST(MaskJson, StructureErrorsNameTheField) {
  expect_error("{\"total_seqlen_q\": ", "not valid JSON");
  expect_error("[1, 2]", "expected an object at the top level, got array");
  for (const char* f :
       {"total_seqlen_q", "total_seqlen_k", "q_ranges", "k_ranges", "attn_type_map"}) {
    std::string text = with("", "");
    const std::string key = std::string("\"") + f + "\"";
    text.replace(text.find(key), key.size(), "\"renamed\"");
    expect_error(text, std::string("missing field \"") + f + "\"");
  }
  expect_error(with("total_seqlen_q", "4.5"), "total_seqlen_q: expected an integer, got 4.5");
  expect_error(with("total_seqlen_k", "\"4\""), "total_seqlen_k: expected an integer");
  expect_error(with("total_seqlen_q", "18446744073709551615"),
               "total_seqlen_q: 18446744073709551615 does not fit in int64");
  expect_error(with("q_ranges", "{}"), "q_ranges: expected an array, got object");
  expect_error(with("k_ranges", "3"), "k_ranges: expected an array, got number");
  expect_error(with("attn_type_map", "\"causal\""), "attn_type_map: expected an array, got string");
  expect_error(with("q_ranges", "[[0, 2], [2]]"), "q_ranges[1]: expected [start, end], got [2]");
  expect_error(with("k_ranges", "[[0, 2], [0, 1, 2]]"), "k_ranges[1]: expected [start, end]");
  expect_error(with("q_ranges", "[\"0-2\", [2, 4]]"), "q_ranges[0]: expected [start, end]");
  expect_error(with("k_ranges", "[[0, 2], [0, 1.5]]"), "k_ranges[1][1]: expected an integer");
  expect_error(with("q_ranges", "[[0, 2], [null, 4]]"), "q_ranges[1][0]: expected an integer");
}

TEST(MaskJson, LengthAndTypeErrors) {
  expect_error(with("k_ranges", "[[0, 2]]"), "q_ranges has 2 entries but k_ranges has 1");
  expect_error(with("attn_type_map", "[0, 1, 1]"),
               "attn_type_map has 3 entries but q_ranges has 2");
  expect_error(with("attn_type_map", "[0, 4]"), "attn_type_map[1]: unknown mask type 4");
  expect_error(with("attn_type_map", "[-1, 0]"), "attn_type_map[0]: unknown mask type -1");
  expect_error(with("attn_type_map", "[0, \"diagonal\"]"),
               "attn_type_map[1]: unknown mask type 'diagonal'");
  expect_error(with("attn_type_map", "[true, 0]"), "attn_type_map[0]: expected 0..3 or");
  expect_error(with("attn_type_map", "[0, 1.0]"), "attn_type_map[1]: expected 0..3 or");
}

TEST(MaskJson, RangeErrorsComeFromMaskValidation) {
  // Slice i is entry i of every array.
  expect_error(with("q_ranges", "[[0, 2], [4, 2]]"), "slice 1: q_range [4, 2) is reversed");
  expect_error(with("k_ranges", "[[0, 2], [0, 5]]"), "slice 1: k_range [0, 5) lies beyond");
  expect_error(with("total_seqlen_q", "-1"), "total_seqlen_q -1 is negative");
  expect_error(with("q_ranges", "[[0, 3], [2, 4]]"), "slices 0");
}

TEST(MaskJson, Files) {
  const Mask m = masks::varlen_causal(std::vector<std::int64_t>{0, 3, 9});
  const std::string path = temp_path("magi_mask_json_test.json");
  save_mask(m, path);
  EXPECT_EQ(load_mask(path), m);
  std::filesystem::remove(path);

  try {
    load_mask(path);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open mask file '" + path + "'"));
  }
  try {
    save_mask(m, temp_path("no_such_dir/x/mask.json"));
    ADD_FAILURE() << "no error for an unwritable path";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot write mask file"));
  }
  // Content errors carry the path in front.
  const std::string bad = temp_path("magi_mask_json_bad.json");
  std::ofstream(bad) << with("k_ranges", "[[0, 2]]");
  try {
    load_mask(bad);
    ADD_FAILURE() << "no error for a bad file";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(bad + ": q_ranges has 2 entries but k_ranges has 1"));
    // message() (what the CLI prints) ends where the check's location would begin.
    EXPECT_THAT(e.message(), HasSubstr(bad + ": q_ranges has 2 entries but k_ranges has 1"));
    EXPECT_THAT(e.message(), Not(HasSubstr("failed at")));
    EXPECT_THAT(e.what(), HasSubstr("failed at"));
  }
  std::filesystem::remove(bad);
}

}  // namespace
}  // namespace magi
