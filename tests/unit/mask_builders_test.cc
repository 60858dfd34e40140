// Every builder against its dense definition, written here straight from the header's words
// and compared cell by cell with Mask::visible: hand-picked edges first (empty documents,
// length 1, sq != sk, windows wider than a document, blocks not dividing lengths), then a
// seeded random sweep. Slice counts are bounded too, since few slices is part of the contract.
#include "magi/mask_builders.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "magi/error.h"
#include "seed.h"

namespace magi {
namespace {

using ::testing::HasSubstr;
using Visible = std::function<bool(std::int64_t, std::int64_t)>;
using Cu = std::vector<std::int64_t>;

void expect_cells(const Mask& m, std::int64_t sq, std::int64_t sk, const Visible& want,
                  const std::string& note) {
  ASSERT_EQ(m.total_seqlen_q(), sq) << note;
  ASSERT_EQ(m.total_seqlen_k(), sk) << note;
  std::int64_t count = 0;
  for (std::int64_t q = 0; q < sq; ++q) {
    for (std::int64_t k = 0; k < sk; ++k) {
      const bool w = want(q, k);
      count += w;
      ASSERT_EQ(m.visible(q, k), w) << "cell (" << q << ", " << k << ") " << note << "\n"
                                    << m.to_string();
    }
  }
  EXPECT_EQ(m.area(), count) << note;  // also catches cells counted twice
}

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no magi::Error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

// Document of position x under cu (-1 if none); empty documents never own a position.
std::int64_t doc_of(const Cu& cu, std::int64_t x) {
  for (std::size_t d = 0; d + 1 < cu.size(); ++d)
    if (cu[d] <= x && x < cu[d + 1]) return std::int64_t(d);
  return -1;
}

// The header's window: local query i sits at p = i + (sk - sq), sees p - left <= j <= p + right;
// a row with p < 0 sees nothing.
bool in_window(std::int64_t i, std::int64_t j, std::int64_t sq, std::int64_t sk, masks::Window w) {
  const std::int64_t p = i + (sk - sq);
  return p >= 0 && (w.left < 0 || j >= p - w.left) && (w.right < 0 || j <= p + w.right);
}

// No two slices of a mask share a (q, k) rectangle cell, let alone a visible one.
void expect_disjoint_rectangles(const Mask& m, const std::string& note) {
  const std::vector<Slice>& s = m.slices();
  for (std::size_t a = 0; a < s.size(); ++a) {
    for (std::size_t b = a + 1; b < s.size(); ++b) {
      const bool rows = s[a].q_range.start < s[b].q_range.end &&
                        s[b].q_range.start < s[a].q_range.end;
      const bool cols = s[a].k_range.start < s[b].k_range.end &&
                        s[b].k_range.start < s[a].k_range.end;
      EXPECT_FALSE(rows && cols) << note << ": " << to_string(s[a]) << " and " << to_string(s[b])
                                 << " overlap as rectangles";
    }
  }
}

Visible varlen_window_def(Cu cu_q, Cu cu_k, masks::Window w, std::int64_t g) {
  return [=](std::int64_t q, std::int64_t k) {
    const std::int64_t d = doc_of(cu_q, q);
    if (d < 0 || doc_of(cu_k, k) != d) return false;
    const std::int64_t i = q - cu_q[d], j = k - cu_k[d];
    const std::int64_t sq = cu_q[d + 1] - cu_q[d], sk = cu_k[d + 1] - cu_k[d];
    const bool global = i + (sk - sq) >= 0 && j < g && (w.right < 0 || j <= i + (sk - sq) + w.right);
    return in_window(i, j, sq, sk, w) || global;
  };
}

std::size_t num_docs(const Cu& cu) { return cu.size() - 1; }

// ---------------------------------------------------------------- full, causal, varlen

TEST(MaskBuilders, FullAndCausal) {
  for (auto [sq, sk] : {std::pair{0, 0}, {0, 3}, {3, 0}, {1, 1}, {5, 5}, {3, 7}, {7, 3}}) {
    const std::string note = std::to_string(sq) + "x" + std::to_string(sk);
    const Mask f = masks::full(sq, sk);
    const auto all = [](std::int64_t, std::int64_t) { return true; };
    expect_cells(f, sq, sk, all, "full " + note);
    EXPECT_LE(f.size(), 1u);
    const Mask c = masks::causal(sq, sk);
    const auto want = [sq, sk](std::int64_t q, std::int64_t k) { return k <= q + (sk - sq); };
    expect_cells(c, sq, sk, want, "causal " + note);
    EXPECT_LE(c.size(), 1u);
  }
}

TEST(MaskBuilders, Varlen) {
  const std::vector<std::pair<Cu, Cu>> cases = {
      {{0}, {0}},
      {{0, 0, 0}, {0, 0, 0}},
      {{0, 3, 3, 8}, {0, 3, 3, 8}},
      {{0, 1}, {0, 1}},
      {{0, 2, 7, 9}, {0, 5, 5, 12}},  // sq != sk per document; one document has no keys
      {{0, 4, 4}, {0, 1, 6}},         // a document with keys but no queries
  };
  for (const auto& [cq, ck] : cases) {
    const std::int64_t sq = cq.back(), sk = ck.back();
    const Mask f = masks::varlen_full(cq, ck);
    const auto same_doc = [&](std::int64_t q, std::int64_t k) {
      return doc_of(cq, q) >= 0 && doc_of(cq, q) == doc_of(ck, k);
    };
    expect_cells(f, sq, sk, same_doc, "varlen_full");
    EXPECT_LE(f.size(), num_docs(cq));
    const Mask c = masks::varlen_causal(cq, ck);
    const auto doc_causal = [&](std::int64_t q, std::int64_t k) {
      const std::int64_t d = doc_of(cq, q);
      if (d < 0 || doc_of(ck, k) != d) return false;
      return k - ck[d] <= (q - cq[d]) + (ck[d + 1] - ck[d]) - (cq[d + 1] - cq[d]);
    };
    expect_cells(c, sq, sk, doc_causal, "varlen_causal");
    EXPECT_LE(c.size(), num_docs(cq));
  }
  const Cu cu = {0, 3, 3, 8};
  EXPECT_EQ(masks::varlen_full(cu), masks::varlen_full(cu, cu));
  EXPECT_EQ(masks::varlen_causal(cu), masks::varlen_causal(cu, cu));
}

TEST(MaskBuilders, ArgumentErrors) {
  expect_error([] { masks::full(-1, 3); }, "seqlen_q is negative");
  expect_error([] { masks::full(3, -2); }, "seqlen_k is negative");
  expect_error([] { masks::causal(-1, 3); }, "seqlen_q is negative");
  expect_error([] { masks::causal(3, -1); }, "seqlen_k is negative");
  expect_error([] { masks::varlen_full(Cu{}); }, "cu_seqlens_q is empty");
  expect_error([] { masks::varlen_full(Cu{1, 4}); }, "cu_seqlens_q[0] must be 0");
  expect_error([] { masks::varlen_causal(Cu{0, 4, 2}); }, "cu_seqlens_q decreases at index 2");
  expect_error(
      [] {
        masks::varlen_full(Cu{0, 4}, Cu{0, 5, 3});
      },
      "cu_seqlens_k decreases at index 2");
  expect_error(
      [] {
        masks::varlen_causal(Cu{0, 4}, Cu{0, 2, 4});
      },
      "cu_seqlens_q has 2 entries but cu_seqlens_k has 3");
  expect_error([] { masks::window_slices({3, 1}, {0, 4}, {}); }, "q_range [3, 1) is reversed");
  expect_error([] { masks::window_slices({0, 1}, {-2, 4}, {}); }, "k_range [-2, 4) starts below 0");
  expect_error([] { masks::sliding_window(-1, 4, {}); }, "seqlen_q is negative");
  expect_error([] { masks::sliding_window(4, -1, {}); }, "seqlen_k is negative");
  expect_error(
      [] {
        masks::varlen_sliding_window(Cu{0, 4}, {2, 0}, -1);
      },
      "num_global is negative");
  expect_error(
      [] {
        masks::varlen_sliding_window(Cu{0, 4}, Cu{0}, {2, 0});
      },
      "cu_seqlens_q has 2 entries but cu_seqlens_k has 1");
  expect_error([] { masks::block_causal(-1, 4); }, "seqlen is negative");
  expect_error([] { masks::block_causal(8, 0); }, "block must be positive (got 0)");
  expect_error([] { masks::varlen_block_causal(Cu{0, 4}, -3); }, "block must be positive");
  expect_error([] { masks::varlen_block_causal(Cu{2, 4}, 2); }, "cu_seqlens[0] must be 0");
  expect_error([] { masks::prefix_lm(-1, 0); }, "seqlen is negative");
  expect_error([] { masks::prefix_lm(8, -1); }, "prefix_len is negative");
  expect_error([] { masks::prefix_lm(8, 9); }, "prefix_len 9 exceeds seqlen 8");
  expect_error([] { masks::shared_question(-1, Cu{2}); }, "question_len is negative");
  expect_error([] { masks::shared_question(3, Cu{2, -1}); }, "answer_lens[1] is negative (-1)");
}

// ---------------------------------------------------------------- sliding window

TEST(MaskBuilders, WindowSlicesMatchReferenceLayout) {
  // the reference layout for window (2, 2) on 8 x 8 and causal window (2, 0).
  using T = MaskType;
  const std::vector<Slice> w22 = masks::window_slices({0, 8}, {0, 8}, {2, 2});
  EXPECT_EQ(w22, (std::vector<Slice>{{{0, 2}, {0, 4}, T::kCausal},
                                     {{2, 6}, {0, 8}, T::kBiCausal},
                                     {{6, 8}, {4, 8}, T::kInvCausal}}));
  const std::vector<Slice> w20 = masks::window_slices({0, 8}, {0, 8}, {2, 0});
  EXPECT_EQ(w20,
            (std::vector<Slice>{{{0, 2}, {0, 2}, T::kCausal}, {{2, 8}, {0, 8}, T::kBiCausal}}));
  // Offsets carry through; unbounded sides give one plain slice.
  EXPECT_EQ(masks::window_slices({10, 14}, {20, 26}, {-1, 0}),
            (std::vector<Slice>{{{10, 14}, {20, 26}, T::kCausal}}));
  EXPECT_EQ(masks::window_slices({10, 14}, {20, 26}, {-1, -1}),
            (std::vector<Slice>{{{10, 14}, {20, 26}, T::kFull}}));
  // A window covering the whole block is one FULL slice, not three.
  EXPECT_EQ(masks::window_slices({0, 4}, {0, 4}, {3, 3}),
            (std::vector<Slice>{{{0, 4}, {0, 4}, T::kFull}}));
  EXPECT_TRUE(masks::window_slices({3, 3}, {0, 4}, {1, 1}).empty());
  EXPECT_TRUE(masks::window_slices({0, 4}, {2, 2}, {1, 1}).empty());
}

TEST(MaskBuilders, SlidingWindowEdgeCases) {
  const std::vector<masks::Window> windows = {{-1, -1}, {-1, 0}, {0, 0},  {0, -1}, {2, 0},
                                              {0, 2},   {1, 3},  {3, 1},  {50, 0}, {0, 50},
                                              {50, 50}, {6, 6},  {2, -1}, {-1, 2}};
  for (auto [sq, sk] : {std::pair{0, 0}, {1, 1}, {1, 5}, {5, 1}, {8, 8}, {4, 9}, {9, 4}, {3, 0}}) {
    for (masks::Window w : windows) {
      const std::string note = std::to_string(sq) + "x" + std::to_string(sk) + " window (" +
                               std::to_string(w.left) + ", " + std::to_string(w.right) + ")";
      const Mask m = masks::sliding_window(sq, sk, w);
      const auto want = [&](std::int64_t q, std::int64_t k) { return in_window(q, k, sq, sk, w); };
      expect_cells(m, sq, sk, want, note);
      expect_disjoint_rectangles(m, note);
      EXPECT_LE(m.size(), 3u) << note;
      for (const Slice& s : m.slices()) EXPECT_GT(area(s), 0) << note << " " << to_string(s);
    }
  }
  // (left, 0) with left unbounded is causal; (-1, -1) is full; huge bounds act as unbounded.
  constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(masks::sliding_window(6, 9, {-1, 0}), masks::causal(6, 9));
  EXPECT_EQ(masks::sliding_window(6, 9, {kHuge, 0}), masks::causal(6, 9));
  EXPECT_EQ(masks::sliding_window(6, 9, {-1, -1}), masks::full(6, 9));
  EXPECT_EQ(masks::sliding_window(6, 9, {kHuge, kHuge}), masks::full(6, 9));
  EXPECT_EQ(masks::varlen_sliding_window(Cu{0, 9}, {kHuge, kHuge}, 3), masks::full(9, 9));
  // More queries than keys: only the last sk rows attend (MagiAttention's rule), one slice.
  using T = MaskType;
  EXPECT_EQ(masks::window_slices({0, 10}, {0, 4}, {-1, -1}),
            (std::vector<Slice>{{{6, 10}, {0, 4}, T::kFull}}));
  EXPECT_EQ(masks::window_slices({0, 10}, {0, 4}, {1, 5}),
            (std::vector<Slice>{{{6, 7}, {0, 4}, T::kFull}, {{7, 10}, {0, 4}, T::kInvCausal}}));
}

TEST(MaskBuilders, VarlenSlidingWindowWithGlobals) {
  const Cu cu_q = {0, 0, 1, 6, 16, 19}, cu_k = {0, 2, 3, 9, 19, 19};
  for (masks::Window w : {masks::Window{2, 0}, {0, 0}, {3, 2}, {-1, 0}, {1, -1}, {20, 20}}) {
    for (std::int64_t g : {0, 1, 3, 4, 30}) {
      const std::string note = "window (" + std::to_string(w.left) + ", " +
                               std::to_string(w.right) + ") globals " + std::to_string(g);
      const Mask m = masks::varlen_sliding_window(cu_q, cu_k, w, g);
      expect_cells(m, cu_q.back(), cu_k.back(), varlen_window_def(cu_q, cu_k, w, g), note);
      expect_disjoint_rectangles(m, note);
      EXPECT_LE(m.size(), 5 * num_docs(cu_q)) << note;
    }
  }
  // Self-attention shorthand; globals on a 10-token document with window (2, 0): rows 0..2
  // are inside the plain window, rows 3..5 see a growing prefix, rows 6.. see all 3 globals.
  const Cu cu = {0, 10};
  const Mask m = masks::varlen_sliding_window(cu, {2, 0}, 3);
  EXPECT_EQ(m, masks::varlen_sliding_window(cu, cu, {2, 0}, 3));
  expect_cells(m, 10, 10, varlen_window_def(cu, cu, {2, 0}, 3), "shorthand");
  EXPECT_EQ(m.size(), 4u) << m.to_string();
  // Globals [0, 3) first, then the window over keys [3, 10): no rectangle shares a cell.
  using T = MaskType;
  EXPECT_EQ(masks::varlen_sliding_window(cu, {2, 0}, 3).slices(),
            (std::vector<Slice>{{{0, 2}, {0, 2}, T::kCausal},
                                {{2, 10}, {0, 3}, T::kFull},
                                {{3, 5}, {3, 5}, T::kCausal},
                                {{5, 10}, {3, 10}, T::kBiCausal}}));
}

// ---------------------------------------------------------------- block causal

Visible varlen_block_causal_def(Cu cu, std::int64_t block, bool last_global) {
  return [=](std::int64_t q, std::int64_t k) {
    const std::int64_t d = doc_of(cu, q);
    const std::int64_t start = cu[d], end = cu[d + 1];
    const std::int64_t block_end = std::min(end, start + ((q - start) / block + 1) * block);
    if (last_global && block_end == end) return true;
    return start <= k && k < block_end;
  };
}

TEST(MaskBuilders, BlockCausal) {
  for (std::int64_t n : {0, 1, 7, 8, 9, 16}) {
    for (std::int64_t b : {1, 3, 4, 8, 20}) {
      const Mask m = masks::block_causal(n, b);
      const auto want = [&](std::int64_t q, std::int64_t k) {
        return k < std::min(n, (q / b + 1) * b);
      };
      expect_cells(m, n, n, want, "n " + std::to_string(n) + " block " + std::to_string(b));
      EXPECT_EQ(std::int64_t(m.size()), (n + b - 1) / b);
    }
  }
}

TEST(MaskBuilders, VarlenBlockCausal) {
  for (const Cu& cu : {Cu{0}, Cu{0, 0}, Cu{0, 5, 5, 12, 13}, Cu{0, 4, 8}, Cu{0, 1, 2, 11}}) {
    for (std::int64_t b : {1, 2, 4, 5, 30}) {
      for (bool last_global : {false, true}) {
        const std::string note = "block " + std::to_string(b) + (last_global ? " global" : "");
        const Mask m = masks::varlen_block_causal(cu, b, last_global);
        expect_cells(m, cu.back(), cu.back(), varlen_block_causal_def(cu, b, last_global), note);
      }
    }
  }
}

// ---------------------------------------------------------------- prefix-LM, shared question

TEST(MaskBuilders, PrefixLm) {
  for (std::int64_t n : {0, 1, 2, 9}) {
    for (std::int64_t p = 0; p <= n; ++p) {
      const Mask m = masks::prefix_lm(n, p);
      const auto want = [&](std::int64_t q, std::int64_t k) { return q < p ? k < p : k <= q; };
      expect_cells(m, n, n, want, "n " + std::to_string(n) + " prefix " + std::to_string(p));
      EXPECT_LE(m.size(), 2u);
    }
  }
}

Visible shared_question_def(std::int64_t question, Cu answers) {
  return [=](std::int64_t q, std::int64_t k) {
    if (q < question) return k <= q;
    std::int64_t start = question;
    for (std::int64_t len : answers) {
      if (q < start + len) return k < question || (start <= k && k <= q);
      start += len;
    }
    return false;
  };
}

TEST(MaskBuilders, SharedQuestion) {
  const std::vector<std::pair<std::int64_t, Cu>> cases = {
      {0, {}}, {4, {}}, {0, {3, 2}}, {4, {3, 0, 1, 5}}, {1, {1, 1}}};
  for (const auto& [question, answers] : cases) {
    std::int64_t total = question;
    for (std::int64_t a : answers) total += a;
    const Mask m = masks::shared_question(question, answers);
    expect_cells(m, total, total, shared_question_def(question, answers),
                 "question " + std::to_string(question));
    EXPECT_LE(m.size(), 1 + 2 * answers.size());
  }
}

// ---------------------------------------------------------------- block sparse

struct BlockGrid {
  std::int64_t sq, sk, bq, bk;
  std::int64_t nq() const { return (sq + bq - 1) / bq; }
  std::int64_t nk() const { return (sk + bk - 1) / bk; }
};

std::size_t num_runs(const std::vector<std::uint8_t>& bm, const BlockGrid& g) {
  std::size_t runs = 0;
  for (std::int64_t r = 0; r < g.nq(); ++r)
    for (std::int64_t c = 0; c < g.nk(); ++c)
      runs += bm[r * g.nk() + c] && (c == 0 || !bm[r * g.nk() + c - 1]);
  return runs;
}

TEST(MaskBuilders, BlockSparse) {
  // Neither block size divides its length; row 1 has the same runs as row 0, so they fuse.
  const BlockGrid g{10, 13, 4, 3};
  const std::vector<std::uint8_t> bm = {1, 1, 0, 1, 1,  //
                                        1, 1, 0, 1, 1,  //
                                        0, 0, 2, 0, 1};
  const Mask m = masks::block_sparse(bm, g.sq, g.sk, g.bq, g.bk);
  const auto want = [&](std::int64_t q, std::int64_t k) {
    return bm[(q / g.bq) * g.nk() + k / g.bk] != 0;
  };
  expect_cells(m, g.sq, g.sk, want, "hand-picked");
  EXPECT_EQ(m.size(), 4u) << m.to_string();
  EXPECT_EQ(m[0], (Slice{{0, 8}, {0, 6}, MaskType::kFull}));
  EXPECT_EQ(m[3], (Slice{{8, 10}, {12, 13}, MaskType::kFull}));

  EXPECT_EQ(masks::block_sparse(std::vector<std::uint8_t>(9, 1), 5, 7, 2, 3).size(), 1u);
  EXPECT_EQ(masks::block_sparse(std::vector<std::uint8_t>(9, 0), 5, 7, 2, 3).size(), 0u);
  EXPECT_EQ(masks::block_sparse({}, 0, 7, 2, 3).size(), 0u);
  EXPECT_EQ(masks::block_sparse({}, 5, 0, 2, 3).size(), 0u);

  expect_error([&] { masks::block_sparse(bm, g.sq, g.sk, 0, 3); }, "block_q must be positive");
  expect_error([&] { masks::block_sparse(bm, g.sq, g.sk, 4, -1); }, "block_k must be positive");
  expect_error([&] { masks::block_sparse(bm, -1, g.sk, 4, 3); }, "seqlen_q is negative");
  expect_error([&] { masks::block_sparse(bm, g.sq, -1, 4, 3); }, "seqlen_k is negative");
  expect_error([&] { masks::block_sparse(bm, g.sq, g.sk, 4, 4); },
               "block_mask has 15 entries but needs 3 x 4");
  expect_error([&] { masks::block_sparse(bm, g.sq, 0, 4, 3); },
               "block_mask has 15 entries but needs 3 x 0");
}

TEST(MaskBuilders, BlockSparseTopk) {
  const BlockGrid g{9, 10, 4, 3};                  // 3 q blocks x 4 k blocks
  const Cu idx = {3, 0, -1, -1, -1, -1, 1, 2, 3};  // top-3 rows {3, 0}, {}, {1, 2, 3}
  const Mask m = masks::block_sparse_topk(idx, 3, g.sq, g.sk, g.bq, g.bk);
  const auto want = [&](std::int64_t q, std::int64_t k) {
    const std::int64_t* row = idx.data() + (q / g.bq) * 3;
    return std::find(row, row + 3, k / g.bk) != row + 3;
  };
  expect_cells(m, g.sq, g.sk, want, "hand-picked");
  EXPECT_EQ(m.size(), 3u) << m.to_string();
  EXPECT_EQ(masks::block_sparse_topk({}, 0, g.sq, g.sk, g.bq, g.bk).size(), 0u);

  expect_error(
      [&] {
        masks::block_sparse_topk(Cu{0, 4, -1, -1, -1, -1}, 2, 9, 10, 4, 3);
      },
      "indices[0, 1] = 4 is out of range [0, 4)");
  expect_error(
      [&] {
        masks::block_sparse_topk(Cu{0, -2, -1, -1, -1, -1}, 2, 9, 10, 4, 3);
      },
      "indices[0, 1] = -2 is out of range");
  expect_error(
      [&] {
        masks::block_sparse_topk(Cu{0, 1, -1, -1, 2, 2}, 2, 9, 10, 4, 3);
      },
      "indices[2, 1] = 2 repeats a k-block of q-block 2");
  expect_error(
      [&] {
        masks::block_sparse_topk(Cu{0, 1, 2}, 2, 9, 10, 4, 3);
      },
      "indices has 3 entries but needs 3 x 2");
  expect_error([&] { masks::block_sparse_topk(Cu{0}, 0, 9, 10, 4, 3); },
               "indices has 1 entries but needs 3 x 0");
  expect_error([&] { masks::block_sparse_topk(idx, -1, 9, 10, 4, 3); }, "topk is negative");
  expect_error([&] { masks::block_sparse_topk(idx, 3, 9, 10, 0, 3); }, "block_q must be positive");
  expect_error([&] { masks::block_sparse_topk(idx, 3, 9, 10, 4, 0); }, "block_k must be positive");
  expect_error([&] { masks::block_sparse_topk(idx, 3, -9, 10, 4, 3); }, "seqlen_q is negative");
  expect_error([&] { masks::block_sparse_topk(idx, 3, 9, -1, 4, 3); }, "seqlen_k is negative");
}

// ---------------------------------------------------------------- random sweep

Cu random_cu(std::mt19937_64& rng, int max_docs, int max_len) {
  Cu cu = {0};
  const int docs = int(rng() % std::uint64_t(max_docs + 1));
  for (int d = 0; d < docs; ++d) {
    const bool empty = rng() % 6 == 0;
    cu.push_back(cu.back() + (empty ? 0 : std::int64_t(rng() % std::uint64_t(max_len + 1))));
  }
  return cu;
}

TEST(MaskBuilders, RandomSweep) {
  const std::uint64_t seed = testing::test_seed();
  const std::string note = testing::seed_note(seed);
  std::mt19937_64 rng(seed);
  const int iters = testing::full_level() ? 10000 : 1000;
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + std::int64_t(rng() % std::uint64_t(hi - lo + 1));
  };
  for (int it = 0; it < iters; ++it) {
    const std::string at = "iteration " + std::to_string(it) + ", " + note;
    Cu cu_q = random_cu(rng, 4, 12), cu_k = cu_q;
    if (rng() % 2) {
      for (std::size_t d = 1; d < cu_k.size(); ++d)
        cu_k[d] = cu_k[d - 1] + pick(0, 12);  // documents pair up, lengths differ
    }
    const masks::Window w{pick(-1, 14), pick(-1, 14)};
    const std::int64_t g = pick(0, 5);
    const Mask sw = masks::varlen_sliding_window(cu_q, cu_k, w, g);
    expect_cells(sw, cu_q.back(), cu_k.back(), varlen_window_def(cu_q, cu_k, w, g),
                 "varlen_sliding_window " + at);
    EXPECT_LE(sw.size(), 5 * num_docs(cu_q)) << at;
    if (::testing::Test::HasFatalFailure()) return;

    const std::int64_t b = pick(1, 7);
    const bool last_global = rng() % 2;
    expect_cells(masks::varlen_block_causal(cu_q, b, last_global), cu_q.back(), cu_q.back(),
                 varlen_block_causal_def(cu_q, b, last_global), "varlen_block_causal " + at);

    const BlockGrid grid{pick(0, 30), pick(0, 30), pick(1, 6), pick(1, 6)};
    std::vector<std::uint8_t> bm(std::size_t(grid.nq() * grid.nk()));
    const std::uint64_t density = 1 + rng() % 4;
    for (auto& x : bm) x = rng() % 4 < density;
    const Mask bs = masks::block_sparse(bm, grid.sq, grid.sk, grid.bq, grid.bk);
    const auto in_block = [&](std::int64_t q, std::int64_t k) {
      return bm[(q / grid.bq) * grid.nk() + k / grid.bk] != 0;
    };
    expect_cells(bs, grid.sq, grid.sk, in_block, "block_sparse " + at);
    EXPECT_LE(bs.size(), num_runs(bm, grid)) << at;

    // The same block mask as top-k lists, shuffled and padded with -1.
    const std::int64_t topk = grid.nk() + pick(0, 2);
    Cu idx;
    for (std::int64_t r = 0; r < grid.nq(); ++r) {
      Cu row;
      for (std::int64_t c = 0; c < grid.nk(); ++c)
        if (bm[r * grid.nk() + c]) row.push_back(c);
      row.resize(std::size_t(topk), -1);
      std::shuffle(row.begin(), row.end(), rng);
      idx.insert(idx.end(), row.begin(), row.end());
    }
    EXPECT_EQ(masks::block_sparse_topk(idx, topk, grid.sq, grid.sk, grid.bq, grid.bk), bs) << at;
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace magi
