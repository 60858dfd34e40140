// The Hopper (sm90) forward against the fp64 oracle, by docs/semantics.md §5's rule for GPU
// kernels: the kernel's error may be at most twice that of a naive implementation in the same
// precision. The shared helpers (device buffers, the naive reference, the comparison) and the
// error measures are in sm90_support.h; without a CUDA device every test skips with
// "sm90_forward_test: no CUDA device" (CTest: "Skipped"). MAGI_TEST_SEED replays the random
// sweep; MAGI_TEST_LEVEL=full makes it longer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn_case.h"
#include "magi/mask_builders.h"
#include "seed.h"
#include "sm90_support.h"

namespace magi {
namespace {

using namespace gputest;

// ---------------------------------------------------------------------------------------------
// Masks

TEST(Sm90Forward, FullWithLengthsNotMultipleOfTheTile) {
  REQUIRE_GPU();
  const Case c;
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{1000, 1000},
                        {77, 300},
                        {300, 77},
                        {129, 257},
                        {1, 1},
                        {128, 128}})
    check_dtypes(masks::full(sq, sk), c);
}

TEST(Sm90Forward, Causal) {
  REQUIRE_GPU();
  const Case c;
  // sq > sk: the first sq - sk rows see nothing (bottom-right aligned).
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{1000, 1000},
                        {77, 300},
                        {300, 77},
                        {513, 1025},
                        {256, 256}})
    check_dtypes(masks::causal(sq, sk), c);
}

TEST(Sm90Forward, VarlenCausalManySmallDocumentsAndOneLong) {
  REQUIRE_GPU();
  std::mt19937_64 rng(7);
  std::vector<std::int64_t> lens;
  for (int i = 0; i < 60; ++i)
    lens.push_back(std::uniform_int_distribution<std::int64_t>(1, 24)(rng));
  lens.insert(lens.begin() + 30, 1000);
  const auto cu = prefix_sums(lens);
  check_dtypes(masks::varlen_causal(cu), Case{});
  check_dtypes(masks::varlen_full(cu), Case{}, 2, "varlen full");
}

TEST(Sm90Forward, SlidingWindow) {
  REQUIRE_GPU();
  const Case c;
  check_dtypes(masks::sliding_window(1000, 1000, {100, 0}), c, 1, "causal window 100");
  check_dtypes(masks::sliding_window(700, 900, {64, 32}), c, 2, "window (64, 32)");
  const auto cu = prefix_sums({300, 37, 500, 200});
  check_dtypes(masks::varlen_sliding_window(cu, {50, 0}, 4), c, 3, "per document, 4 global");
}

TEST(Sm90Forward, VarlenBlockCausalWithGlobalLastBlock) {
  REQUIRE_GPU();
  const auto cu = prefix_sums({300, 500, 77, 400});
  check_dtypes(masks::varlen_block_causal(cu, 128, true), Case{}, 1, "block 128");
  check_dtypes(masks::varlen_block_causal(cu, 100, true), Case{}, 2, "block 100");
}

TEST(Sm90Forward, SharedQuestionAndPrefixLm) {
  REQUIRE_GPU();
  const std::vector<std::int64_t> answers{150, 300, 50, 400, 1};
  check_dtypes(masks::shared_question(200, answers), Case{}, 1, "shared question");
  check_dtypes(masks::prefix_lm(600, 200), Case{}, 2, "prefix-lm");
}

TEST(Sm90Forward, BlockSparse) {
  REQUIRE_GPU();
  std::mt19937_64 rng(11);
  std::bernoulli_distribution keep(0.3);
  for (auto [bq, bk] : {std::pair<std::int64_t, std::int64_t>{64, 64}, {128, 128}, {96, 160}}) {
    const std::int64_t sq = 1000, sk = 900;
    const std::int64_t nbq = (sq + bq - 1) / bq, nbk = (sk + bk - 1) / bk;
    std::vector<std::uint8_t> blocks(std::size_t(nbq * nbk));
    for (auto& b : blocks) b = keep(rng);
    check_dtypes(masks::block_sparse(blocks, sq, sk, bq, bk), Case{}, 1,
                 "blocks " + std::to_string(bq) + "x" + std::to_string(bk));
  }
  // Top-k indices, padded with -1.
  const std::int64_t n = 1024, block = 128, nb = n / block, topk = 3;
  std::vector<std::int64_t> idx;
  for (std::int64_t b = 0; b < nb; ++b) {
    std::vector<std::int64_t> ids(static_cast<std::size_t>(nb));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (std::int64_t t = 0; t < topk; ++t)
      idx.push_back(t == 2 && b % 2 ? -1 : ids[std::size_t(t)]);
  }
  check_dtypes(masks::block_sparse_topk(idx, topk, n, n, block, block), Case{}, 2, "top-3");
}

TEST(Sm90Forward, RandomMasks) {
  REQUIRE_GPU();
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  const int iterations = testing::full_level() ? 60 : 12;
  auto pick = [&](auto xs) {
    return xs[std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng)];
  };
  using V = std::vector<std::int64_t>;
  int ran = 0;
  for (int it = 0; it < iterations; ++it) {
    const std::int64_t nq = pick(V{1, 77, 300, 700, 1000}), nk = pick(V{1, 129, 257, 500, 1000});
    Case c;
    c.in = pick(std::vector<DType>{DType::kBF16, DType::kF16});
    c.d = pick(V{64, 128, 128, 192, 256});
    c.out = pick(std::vector<DType>{c.in, DType::kF32});
    c.hkv = pick(V{1, 2});
    c.hq = c.hkv * (c.d > 128 ? pick(V{1, 2}) : pick(V{1, 2, 4}));
    if (pick(V{0, 0, 0, 1})) c.opts.softcap = 5.0;
    c.sink_len = pick(V{0, 0, 1, 3});
    c.opts.sink_layout = pick(V{0, 1}) ? SinkLayout::kSSH : SinkLayout::kSH;
    const Mask mask = testing::random_mask(rng, nq, nk, int(pick(V{3, 8, 16})));
    const std::uint64_t case_seed = rng();
    if (!built(c.in, c.d)) {  // e.g. MAGI_CUDA_KERNELS=ci: fall back to bf16/D128
      c = with_dtype(c, DType::kBF16);
      c.d = 128;
    }
    ran += check(mask, c, case_seed, testing::seed_note(seed) + " iteration " + std::to_string(it));
    if (::testing::Test::HasFailure()) {
      std::cout << "mask of the failing iteration:\n" << mask.to_string() << "\n";
      break;
    }
  }
  EXPECT_EQ(ran, iterations);
}

// ---------------------------------------------------------------------------------------------
// Heads, head dims, options

TEST(Sm90Forward, GqaAndMqa) {
  REQUIRE_GPU();
  const Mask mask(
      600, 700,
      {Slice{{0, 600}, {100, 700}, MaskType::kCausal}, Slice{{0, 600}, {0, 16}, MaskType::kFull}});
  for (std::int64_t hkv : {8, 2, 1}) {
    Case c;
    c.hq = 8;
    c.hkv = hkv;
    check_dtypes(mask, c, 1, hkv == 8 ? "MHA" : hkv == 1 ? "MQA" : "GQA");
  }
}

TEST(Sm90Forward, HeadDims) {
  REQUIRE_GPU();
  const Mask mask(333, 517,
                  {Slice{{0, 333}, {0, 517}, MaskType::kCausal},
                   Slice{{100, 333}, {0, 40}, MaskType::kBiCausal}});
  int ran = 0;
  for (std::int64_t d : {64, 128, 192, 256}) {
    Case c;
    c.d = d;
    ran += check_dtypes(mask, c);
  }
  EXPECT_GT(ran, 0);
}

// Key blocks that every row of a tile sees whole run through a loop of their own at D 64, 192
// and 256 (fwd_kernel.cuh, block_cover.h): masks long enough for runs, ending on a whole key
// block (the tile's last block stays out of a run) and off one, a run that ends at a piece
// followed by another piece, and rows past the last whole tile.
TEST(Sm90Forward, UnmaskedRunsAtEveryHeadDim) {
  REQUIRE_GPU();
  const std::vector<std::pair<std::string, Mask>> cases = {
      {"full 1024", masks::full(1024, 1024)},
      {"full 700 x 1000", masks::full(700, 1000)},
      {"causal 1280", masks::causal(1280, 1280)},
      {"varlen causal 900, 600, 1024", masks::varlen_causal(prefix_sums({900, 600, 1024}))},
      {"full 512 keys then causal", Mask(640, 1152, {Slice{{0, 640}, {0, 512}, MaskType::kFull},
                                                    Slice{{0, 640}, {512, 1152}, MaskType::kCausal}})},
  };
  int ran = 0;
  for (std::int64_t d : {64, 128, 192, 256})
    for (const auto& [name, mask] : cases) {
      Case c;
      c.d = d;
      ran += check(mask, c, 7, name + ", D " + std::to_string(d));
    }
  EXPECT_GT(ran, 0);
}

TEST(Sm90Forward, Softcap) {
  REQUIRE_GPU();
  const Mask mask = masks::causal(600, 600);
  Case c;
  c.opts.softcap = 1.0;
  c.opts.softmax_scale = 0.6;  // logits of several units: tanh saturates
  check_dtypes(mask, c, 1, "saturating");
  c.opts.softcap = 30.0;
  c.opts.softmax_scale.reset();
  check_dtypes(mask, c, 2, "mild");
  c.d = 256;
  c.opts.softcap = 2.0;
  check_dtypes(mask, c, 3, "D256");
}

TEST(Sm90Forward, Sinks) {
  REQUIRE_GPU();
  // Small documents (rows with one or two keys, where the sink matters most), a long
  // document, and rows 880.. that see nothing (lse = lse_sink, out = 0).
  std::vector<Slice> slices;
  for (std::int64_t s = 0; s < 200; s += 5)
    slices.push_back(Slice{{s, s + 5}, {s, s + 5}, MaskType::kCausal});
  slices.push_back(Slice{{200, 880}, {200, 880}, MaskType::kCausal});
  const Mask mask(900, 880, slices);
  for (SinkLayout layout : {SinkLayout::kSH, SinkLayout::kSSH})
    for (int len : {1, 3, kMaxSinkLen}) {
      Case c;
      c.opts.sink_layout = layout;
      c.sink_len = len;
      check_dtypes(mask, c);
    }
  Case c;  // with fp32 out and softcap
  c.out = DType::kF32;
  c.sink_len = 2;
  c.opts.softcap = 10.0;
  check(mask, c, 5);
}

TEST(Sm90Forward, MaxLogitsArePreSoftcapMaxima) {
  REQUIRE_GPU();
  const Mask mask = masks::varlen_causal(prefix_sums({400, 3, 600}));
  Case c;
  c.hq = 8;
  c.opts.softmax_scale = 1.5;  // maxima around 15, far above the cap
  c.opts.softcap = 5.0;
  check_dtypes(mask, c);
  // The pre-softcap definition: every head's max must exceed the cap here.
  const Problem p = make_problem(mask, c, 1);
  const auto got = run_gpu(mask, p, c);
  for (std::int64_t h = 0; h < c.hq; ++h)
    EXPECT_GT(got.max_logits[std::size_t(h)], 5.0) << "head " << h;
  c.max_logits = false;  // not requested: still fine
  check(mask, c, 2, "no max_logits");
}

TEST(Sm90Forward, LogitScalesMoveTheRunningMaxOftenOrOnce) {
  REQUIRE_GPU();
  // A row's running max moves on many blocks with large logits (scale 2, a peaked softmax,
  // where the largest P must stay exactly 1) and on the first block only with tiny ones
  // (0.01); a negative scale takes the rewrite kernel.
  Case c;
  for (double scale : {2.0, 0.01, -1.5}) {
    c.opts.softmax_scale = scale;
    check_dtypes(masks::causal(1000, 1000), c);
    check(masks::full(300, 1500), c, 3);
  }
}

TEST(Sm90Forward, RowsThatSeeNothing) {
  REQUIRE_GPU();
  // Rows 0-9 in no slice, 10-19 the empty rows of a causal slice with sq > sk, 70-74 an empty
  // bi-causal slice (sq > sk); 200-299 in no slice (whole query tiles without work).
  const Mask mask(
      300, 150,
      {Slice{{10, 70}, {0, 50}, MaskType::kCausal}, Slice{{70, 75}, {0, 3}, MaskType::kBiCausal},
       Slice{{75, 200}, {20, 150}, MaskType::kFull}});
  check_dtypes(mask, Case{});
  Case c;
  c.sink_len = 2;
  check_dtypes(mask, c, 2, "sink");
  c.opts.sink_layout = SinkLayout::kSSH;
  check_dtypes(mask, c, 3, "sink ssh");
  // Nothing visible anywhere: max_logits -inf for every head too.
  check_dtypes(Mask(300, 200, {}), Case{}, 4, "empty mask");
  check_dtypes(Mask(200, 0, {}), Case{}, 5, "no keys");
  check_dtypes(Mask(0, 100, {}), Case{}, 6, "no queries");
  c.sink_len = 1;
  check_dtypes(Mask(130, 0, {}), c, 7, "no keys, sink");
}

TEST(Sm90Forward, OutDtypes) {
  REQUIRE_GPU();
  const Mask mask = masks::causal(700, 700);
  for (DType in : {DType::kBF16, DType::kF16})
    for (DType out : {DType::kBF16, DType::kF16, DType::kF32}) {
      Case c;
      c.in = in;
      c.out = out;
      check(mask, c);
    }
}

// ---------------------------------------------------------------------------------------------
// Accumulate

// (lse_a, out_a) <- merge with (lse_b, out_b) in double; safe for -inf on either side.
void merge_row(double& lse_a, double* out_a, double lse_b, const double* out_b, std::int64_t d) {
  if (lse_b == -kInf) return;
  const double lse = lse_a == -kInf
                         ? lse_b
                         : std::max(lse_a, lse_b) + std::log1p(std::exp(-std::abs(lse_a - lse_b)));
  const double wa = lse_a == -kInf ? 0.0 : std::exp(lse_a - lse), wb = std::exp(lse_b - lse);
  for (std::int64_t e = 0; e < d; ++e) out_a[e] = wa * out_a[e] + wb * out_b[e];
  lse_a = lse;
}

TEST(Sm90Forward, AccumulateTwoHalvesEqualsTheWholeMask) {
  REQUIRE_GPU();
  std::mt19937_64 rng(41);
  const Mask docs = testing::packed_documents(rng, 1200);  // global tokens share rows with docs
  const Mask random = testing::random_mask(rng, 600, 700, 16);
  for (const Mask* mask : {&docs, &random})
    for (std::int64_t sink_len : {0, 2})
      for (DType in : {DType::kBF16, DType::kF16}) {
        Case c;
        c.in = in;
        c.out = DType::kF32;  // accumulate merges into the compute type
        c.sink_len = sink_len;
        c.opts.sink_layout = sink_len ? SinkLayout::kSSH : SinkLayout::kSH;
        if (!built(c.in, c.d)) continue;
        const auto& all = mask->slices();
        const std::size_t half = all.size() / 2;
        const Mask first(mask->total_seqlen_q(), mask->total_seqlen_k(),
                         {all.begin(), all.begin() + std::ptrdiff_t(half)});
        const Mask second(mask->total_seqlen_q(), mask->total_seqlen_k(),
                          {all.begin() + std::ptrdiff_t(half), all.end()});
        const std::string what = describe(c, *mask) + " [accumulate: " + std::to_string(half) +
                                 " + " + std::to_string(all.size() - half) + " slices]";
        SCOPED_TRACE(what);
        const Problem p = make_problem(*mask, c, 3);
        GpuCall call(p, c);
        AttnOptions opts = c.opts;
        ASSERT_NO_THROW(attn_forward(first, call.args(/*with_sink=*/false), opts));
        opts.accumulate = true;  // the sink joins once, with the second half
        ASSERT_NO_THROW(attn_forward(second, call.args(), opts));
        compare(*mask, p, c, call.result(), what);
      }
}

// Many query tiles without keys in a row, last in the work list (heavy first), with and
// without accumulate: rows [0, 1024) of every head are in no slice. The forward used to load Q
// for such tiles and hand it back from one thread of each warpgroup right after its own wait,
// so two keyless tiles in a row could complete Q's barrier twice before a slower warp had
// waited once: a hang (cp-2 causal 8k, rank 0's remote stage under accumulate, 2026-12-02).
// sync() ends the process past its deadline rather than hang.
TEST(Sm90Forward, ManyKeylessTilesInARowDoNotHang) {
  REQUIRE_GPU();
  Case c;
  c.out = DType::kF32;
  c.hq = 8, c.hkv = 2;
  c.max_logits = false;
  if (!built(c.in, c.d)) return;
  const Mask mask(2048, 1024, {Slice{{1024, 2048}, {0, 1024}, MaskType::kFull}});
  const Problem p = make_problem(mask, c, 12);
  GpuCall call(p, c);
  for (bool acc : {false, true})
    for (int rep = 0; rep < 20; ++rep) {
      AttnOptions opts = c.opts;
      opts.accumulate = acc;
      if (rep % 2) opts.sm_margin = 1 << 20;  // one persistent CTA walks all the keyless items
      if (acc) {  // from nothing: out 0, lse -inf
        call.out.upload(std::vector<double>(std::size_t(2048 * c.hq * c.d), 0.0));
        call.lse.upload(std::vector<double>(std::size_t(2048 * c.hq), -kInf));
      }
      ASSERT_NO_THROW(attn_forward(mask, call.args(), opts));
      sync(std::string("keyless tiles, accumulate ") + (acc ? "on" : "off") + ", call " +
           std::to_string(rep));  // the default stream: sync's deadline sees it
    }
  compare(mask, p, c, call.result(), describe(c, mask) + " [keyless tiles, accumulate]");
}

TEST(Sm90Forward, AccumulateIntoAGivenPartialResult) {
  REQUIRE_GPU();
  // Rows 0-9 and 280-299 are in no slice: without a sink they must stay bitwise unchanged.
  const Mask mask(
      300, 400,
      {Slice{{10, 150}, {0, 400}, MaskType::kCausal}, Slice{{150, 280}, {0, 64}, MaskType::kFull},
       Slice{{150, 200}, {100, 200}, MaskType::kCausal},
       Slice{{200, 280}, {64, 300}, MaskType::kBiCausal}});
  Case c;
  c.out = DType::kF32;
  if (!built(c.in, c.d)) return;
  const std::int64_t hq = c.hq, d = c.d;
  const Problem p = make_problem(mask, c, 9);
  std::mt19937_64 rng(10);
  std::normal_distribution<double> normal;
  std::vector<double> out0(std::size_t(300 * hq * d)), lse0(std::size_t(300 * hq));
  for (std::size_t r = 0; r < lse0.size(); ++r) {
    const bool empty = r % 5 == 0;
    lse0[r] = empty ? -kInf : double(float(2 * normal(rng) + 3));
    for (std::int64_t e = 0; e < d; ++e)
      out0[r * std::size_t(d) + std::size_t(e)] = empty ? 0.0 : double(float(normal(rng)));
  }
  const std::vector<double> ml0{0.25, -kInf, 100.0, -3.0};
  GpuCall call(p, c);
  call.out.upload(out0);
  call.lse.upload(lse0);
  call.max_logits.upload(ml0);
  AttnOptions opts = c.opts;
  opts.accumulate = true;
  ASSERT_NO_THROW(attn_forward(mask, call.args(), opts));
  const FwdResult got = call.result();

  const FwdResult part = oracle::forward(mask, p), naive_part = naive_forward(mask, p, c.in, c.out);
  FwdResult want{out0, lse0, {}}, naive{out0, lse0, {}};
  for (std::size_t r = 0; r < lse0.size(); ++r) {
    merge_row(want.lse[r], &want.out[r * std::size_t(d)], part.lse[r],
              &part.out[r * std::size_t(d)], d);
    merge_row(naive.lse[r], &naive.out[r * std::size_t(d)], naive_part.lse[r],
              &naive_part.out[r * std::size_t(d)], d);
  }
  for (std::int64_t h = 0; h < hq; ++h)
    want.max_logits.push_back(std::max(ml0[std::size_t(h)], part.max_logits[std::size_t(h)]));
  expect_close(got, want, naive, d, true, describe(c, mask) + " [accumulate into given]");
  for (std::int64_t row : {0, 5, 9, 280, 290, 299})
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::size_t r = std::size_t(row * hq + h);
      EXPECT_EQ(got.lse[r], lse0[r]) << "untouched row " << row << " head " << h;
      for (std::int64_t e = 0; e < d; ++e)
        ASSERT_EQ(got.out[r * std::size_t(d) + std::size_t(e)],
                  out0[r * std::size_t(d) + std::size_t(e)])
            << "untouched row " << row << " head " << h << " element " << e;
    }
}

// ---------------------------------------------------------------------------------------------
// Layouts, determinism, scheduling, robustness

// q, k, v as views into one packed [N, Hq + 2 Hkv, D] buffer (row stride (Hq + 2 Hkv) D; for
// MHA this is [N, 3, H, D]), out and lse with padded rows (row strides Hq D + 8 and Hq + 3).
// Elements outside the out and lse views must stay NaN.
// o_pad: elements between out rows (odd: the kernel cannot store column pairs, it stores
// each element).
void check_packed_qkv(const Mask& mask, Case c, const std::string& note, std::int64_t o_pad = 8) {
  if (!built(c.in, c.d)) return;
  const std::string what = describe(c, mask) + " [" + note + "]";
  SCOPED_TRACE(what);
  const Problem p = make_problem(mask, c, 21);
  const std::int64_t n = p.num_q, hq = c.hq, hkv = c.hkv, d = c.d;
  const std::int64_t row = (hq + 2 * hkv) * d;
  std::vector<double> image(std::size_t(n * row));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t e = 0; e < hq * d; ++e)
      image[std::size_t(i * row + e)] = p.q[std::size_t(i * hq * d + e)];
    for (std::int64_t e = 0; e < hkv * d; ++e) {
      image[std::size_t(i * row + hq * d + e)] = p.k[std::size_t(i * hkv * d + e)];
      image[std::size_t(i * row + (hq + hkv) * d + e)] = p.v[std::size_t(i * hkv * d + e)];
    }
  }
  DeviceMem qkv(image.size() * std::size_t(dtype_size(c.in)));
  qkv.upload(encode(c.in, image));
  auto* base = static_cast<unsigned char*>(qkv.get());
  const auto at = [&](std::int64_t elems) { return base + elems * dtype_size(c.in); };
  const std::int64_t o_row = hq * d + o_pad, l_row = hq + 3;
  DeviceMem out(std::size_t(n * o_row * dtype_size(c.out))), lse(std::size_t(n * l_row * 4)),
      ml(std::size_t(hq * 4));
  out.fill_nan();
  lse.fill_nan();
  FwdArgs a;
  a.q = device_view(at(0), c.in, {n, hq, d}, {row, d, 1});
  a.k = device_view(at(hq * d), c.in, {n, hkv, d}, {row, d, 1});
  a.v = device_view(at((hq + hkv) * d), c.in, {n, hkv, d}, {row, d, 1});
  a.out = device_view(out.get(), c.out, {n, hq, d}, {o_row, d, 1});
  a.lse = device_view(lse.get(), DType::kF32, {n, hq}, {l_row, 1});
  a.max_logits = device_view(ml.get(), DType::kF32, {hq}, {1});
  ASSERT_NO_THROW(attn_forward(mask, a, c.opts));
  sync("packed qkv");
  const std::vector<double> out_all = decode(c.out, out.download()),
                            lse_all = decode(DType::kF32, lse.download());
  FwdResult got;
  got.max_logits = decode(DType::kF32, ml.download());
  std::int64_t gaps_written = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t e = 0; e < o_row; ++e) {
      const double x = out_all[std::size_t(i * o_row + e)];
      if (e < hq * d)
        got.out.push_back(x);
      else
        gaps_written += !std::isnan(x);
    }
    for (std::int64_t h = 0; h < l_row; ++h) {
      const double x = lse_all[std::size_t(i * l_row + h)];
      if (h < hq)
        got.lse.push_back(x);
      else
        gaps_written += !std::isnan(x);
    }
  }
  EXPECT_EQ(gaps_written, 0) << "the kernel wrote into the padding between out or lse rows";
  compare(mask, p, c, got, what);
}

TEST(Sm90Forward, StridedViewsIntoPackedQkv) {
  REQUIRE_GPU();
  std::mt19937_64 rng(23);
  const Mask docs = testing::packed_documents(rng, 700);
  for (DType in : {DType::kBF16, DType::kF16}) {
    Case c;
    c.in = c.out = in;
    c.hq = c.hkv = 4;
    check_packed_qkv(docs, c, "packed [N, 3, H, D]");
    c.hq = 8;
    c.hkv = 2;
    c.out = DType::kF32;
    check_packed_qkv(testing::random_mask(rng, 500, 500, 8), c, "packed GQA [N, 8 + 2 + 2, D]");
    c.out = in;
    check_packed_qkv(docs, c, "odd out row stride", 1);
  }
}

TEST(Sm90Forward, HeadMajorInputs) {
  REQUIRE_GPU();
  // q, k, v stored [H][N][D] (strides (D, N D, 1)): the head stride is the large one.
  const Mask mask = masks::causal(400, 500);
  Case c;
  if (!built(c.in, c.d)) return;
  const Problem p = make_problem(mask, c, 31);
  auto head_major = [&](const std::vector<double>& xs, std::int64_t n, std::int64_t h) {
    std::vector<double> img(xs.size());
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < h; ++j)
        for (std::int64_t e = 0; e < c.d; ++e)
          img[std::size_t((j * n + i) * c.d + e)] = xs[std::size_t((i * h + j) * c.d + e)];
    return img;
  };
  GpuCall call(p, c);  // reuse its out/lse/max_logits; q/k/v replaced below
  DeviceMem q(p.q.size() * 2), k(p.k.size() * 2), v(p.v.size() * 2);
  q.upload(encode(c.in, head_major(p.q, p.num_q, c.hq)));
  k.upload(encode(c.in, head_major(p.k, p.num_k, c.hkv)));
  v.upload(encode(c.in, head_major(p.v, p.num_k, c.hkv)));
  FwdArgs a = call.args();
  a.q = device_view(q.get(), c.in, {p.num_q, c.hq, c.d}, {c.d, p.num_q * c.d, 1});
  a.k = device_view(k.get(), c.in, {p.num_k, c.hkv, c.d}, {c.d, p.num_k * c.d, 1});
  a.v = device_view(v.get(), c.in, {p.num_k, c.hkv, c.d}, {c.d, p.num_k * c.d, 1});
  ASSERT_NO_THROW(attn_forward(mask, a, c.opts));
  compare(mask, p, c, call.result(), describe(c, mask) + " [head-major q/k/v]");
}

TEST(Sm90Forward, BitwiseDeterministic) {
  REQUIRE_GPU();
  std::mt19937_64 rng(31);
  const Mask mask = testing::random_mask(rng, 1000, 900, 16);
  Case c;
  c.hq = 8;
  c.sink_len = 2;
  c.out = DType::kF32;
  if (!built(c.in, c.d)) return;
  const Problem p = make_problem(mask, c, 32);
  for (bool deterministic : {false, true}) {
    AttnOptions opts = c.opts;
    opts.deterministic = deterministic;
    GpuCall x(p, c), y(p, c);
    ASSERT_NO_THROW(attn_forward(mask, x.args(), opts));
    ASSERT_NO_THROW(attn_forward(mask, y.args(), opts));
    sync("determinism");
    EXPECT_TRUE(x.out.mem.download() == y.out.mem.download())
        << "out differs between two runs (deterministic " << deterministic << ")";
    EXPECT_TRUE(x.lse.mem.download() == y.lse.mem.download())
        << "lse differs between two runs (deterministic " << deterministic << ")";
    EXPECT_TRUE(x.max_logits.mem.download() == y.max_logits.mem.download())
        << "max_logits differs between two runs (deterministic " << deterministic << ")";
    compare(mask, p, c, x.result(), describe(c, mask) + " [determinism]");
  }
}

TEST(Sm90Forward, OnePersistentCtaOnAUserStream) {
  REQUIRE_GPU();
  // sm_margin larger than the SM count leaves one CTA, which must loop over every
  // (tile, head) item, reusing its Q buffer and rings from item to item (the racecheck case of
  // scripts/gpu_test.sh: D 64 and D 128 run different warpgroup counts); the launch goes to a
  // user stream.
  const UserStream stream;
  std::mt19937_64 rng(51);
  const Mask mask = testing::packed_documents(rng, 900);
  for (std::int64_t d : {128, 64}) {
    Case c;
    c.d = d;
    c.sink_len = 1;
    stream.one_cta(c.opts);
    if (!built(c.in, c.d)) continue;
    const Problem p = make_problem(mask, c, 52);
    GpuCall call(p, c);
    ASSERT_NO_THROW(attn_forward(mask, call.args(), c.opts));
    cuda_ok(cudaStreamSynchronize(stream.get()), "stream synchronize");
    compare(mask, p, c, call.result(), describe(c, mask) + " [one CTA, user stream]");
  }
}

TEST(Sm90Forward, NanAndInfInUnseenRowsDoNotLeak) {
  REQUIRE_GPU();
  // Keys 60-69 and 290-299 are seen by no query, yet 60-69 share the first key block with
  // the visible keys 0-59 (and 70+), and 290-299 share the last block with 200-289. Query
  // rows 290-299 see nothing. NaN and inf planted there must not reach any output.
  const Mask mask(
      300, 300,
      {Slice{{0, 150}, {0, 60}, MaskType::kFull}, Slice{{150, 290}, {70, 290}, MaskType::kCausal}});
  int ran = 0;
  for (std::int64_t d : {128, 256, 64})
    for (DType in : {DType::kBF16, DType::kF16}) {
      Case c;
      c.in = c.out = in;
      c.d = d;
      if (!built(in, d)) continue;
      ++ran;
      Problem p = make_problem(mask, c, 61);
      const double nan = std::nan("");
      auto plant = [&](std::vector<double>& xs, std::int64_t row, std::int64_t heads, double x) {
        for (std::int64_t e = 0; e < heads * d; ++e) xs[std::size_t(row * heads * d + e)] = x;
      };
      for (std::int64_t j : {60, 63, 64, 69, 290, 299}) plant(p.v, j, c.hkv, nan);
      for (std::int64_t j : {61, 65, 291}) plant(p.v, j, c.hkv, kInf);
      for (std::int64_t j : {62, 66, 292}) plant(p.k, j, c.hkv, nan);
      for (std::int64_t j : {67, 293}) plant(p.k, j, c.hkv, -kInf);
      for (std::int64_t i : {290, 295}) plant(p.q, i, c.hq, nan);
      plant(p.q, 297, c.hq, kInf);
      const std::string what = describe(c, mask) + " [NaN/inf in unseen rows]";
      SCOPED_TRACE(what);
      FwdResult got;
      ASSERT_NO_THROW(got = run_gpu(mask, p, c));
      std::int64_t bad = 0;
      for (double x : got.out) bad += !std::isfinite(x);
      for (double x : got.lse) bad += std::isnan(x) || x == kInf;
      for (double x : got.max_logits) bad += !std::isfinite(x);
      EXPECT_EQ(bad, 0) << "non-finite outputs leaked from unseen rows";
      compare(mask, p, c, got, what);
    }
  EXPECT_GT(ran, 0);
}

// docs/numerics.md on the GPU: a NaN/inf that a row reads makes that row's out and lse NaN
// (the oracle says which rows), and every other row, out and lse, is bit-identical to the run
// on clean inputs, masked cells of the same key block included (the fixer zeroes non-finite V
// chunks, masked scores are -inf whatever K holds). max_logits: NaN for a head with a NaN row,
// else the clean value. Returns how many rows came out NaN. `shape` (optional) edits the clean
// inputs first, for both runs.
using Planter = std::function<void(Problem&)>;

std::int64_t expect_rule(const Mask& mask, const Case& c, const Planter& plant,
                         const std::string& note, const Planter& shape = nullptr) {
  const std::string what = describe(c, mask) + " [" + note + "]";
  SCOPED_TRACE(what);
  Problem clean = make_problem(mask, c, 13);
  if (shape) shape(clean);
  Problem dirty = clean;
  plant(dirty);
  FwdResult a, b;
  EXPECT_NO_THROW(a = run_gpu(mask, clean, c));
  EXPECT_NO_THROW(b = run_gpu(mask, dirty, c));
  const FwdResult want = oracle::forward(mask, dirty);
  const std::int64_t d = c.d, rows = std::int64_t(want.lse.size());
  std::int64_t nan_rows = 0, not_nan = 0, changed = 0, first_bad = -1;
  for (std::int64_t r = 0; r < rows; ++r) {
    const bool is_nan = std::isnan(want.lse[std::size_t(r)]);
    nan_rows += is_nan;
    bool ok = true;
    if (is_nan) {
      ok = std::isnan(b.lse[std::size_t(r)]);
      for (std::int64_t e = 0; e < d; ++e) ok = ok && std::isnan(b.out[std::size_t(r * d + e)]);
      not_nan += !ok;
    } else {
      ok = b.lse[std::size_t(r)] == a.lse[std::size_t(r)] ||
           (std::isinf(a.lse[std::size_t(r)]) && b.lse[std::size_t(r)] == a.lse[std::size_t(r)]);
      for (std::int64_t e = 0; e < d; ++e)
        ok = ok && b.out[std::size_t(r * d + e)] == a.out[std::size_t(r * d + e)];
      changed += !ok;
    }
    if (!ok && first_bad < 0) first_bad = r;
  }
  EXPECT_EQ(not_nan, 0) << "rows that read a NaN/inf but are not NaN (first: row "
                        << first_bad / c.hq << " head " << first_bad % c.hq << ")";
  EXPECT_EQ(changed, 0) << "rows that do not read the NaN/inf but changed (first: row "
                        << first_bad / c.hq << " head " << first_bad % c.hq << ")";
  for (std::int64_t h = 0; h < c.hq; ++h) {
    const double got = b.max_logits[std::size_t(h)];
    if (std::isnan(want.max_logits[std::size_t(h)]))
      EXPECT_TRUE(std::isnan(got)) << "max_logits head " << h;
    else
      EXPECT_EQ(got, a.max_logits[std::size_t(h)]) << "max_logits head " << h;
  }
  return nan_rows;
}

TEST(Sm90Forward, NanInASeenKeyRowMakesItsRowsNan) {
  REQUIRE_GPU();
  // The case: causal 512, NaN in key row 5 (kv head 0): rows 5..511 of heads 0 and 1
  // NaN, out and lse (lse was -inf); rows 0..4, which share the key block, untouched.
  // At D 64 and 256 the blocks of kv head 1, which holds no NaN, go through the loop of unmasked
  // runs (tile 384..511 at D 64 sees keys 128..383 whole); those of kv head 0 must not.
  const Mask mask = masks::causal(512, 512);
  for (std::int64_t d : {128, 64, 256})
    for (DType in : {DType::kBF16, DType::kF16}) {
      Case c = with_dtype(Case{}, in);
      c.d = d;
      if (!built(c.in, c.d)) continue;
      const auto n = expect_rule(mask, c, [&](Problem& p) {
        plant_row(p.k, 5, 0, c.hkv, c.d, std::nan(""));
      }, "NaN k row 5, D " + std::to_string(d));
      EXPECT_EQ(n, 507 * 2);
    }
}

TEST(Sm90Forward, InfInQWhoseLogitsAreAllMinusInfMakesItsRowNan) {
  REQUIRE_GPU();
  // Element 0 of every key negative and +inf in element 0 of a query row: every logit of that
  // row is -inf. No +inf or NaN logit poisons the row by itself: the kernel's test of a row
  // whose running max never left its start, after a block it sees whole, must. (Causal row 7
  // sees only the diagonal block, which is masked: docs/numerics.md's documented gap, not
  // planted.)
  const std::int64_t n = 300;
  int ran = 0;
  for (std::int64_t d : {64, 128, 192, 256}) {
    Case c;
    c.d = d;
    if (!built(c.in, d)) continue;
    ++ran;
    const Planter negative_k0 = [&](Problem& p) {
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t g = 0; g < c.hkv; ++g) {
          double& x = p.k[std::size_t((j * c.hkv + g) * d)];
          x = -std::fabs(x) - 0.5;
        }
    };
    const Planter row7 = [&](Problem& p) { plant_row(p.q, 7, 0, c.hq, d, kInf, 0); };
    const Planter row200 = [&](Problem& p) { plant_row(p.q, 200, 3, c.hq, d, kInf, 0); };
    const Planter both = [&](Problem& p) { row7(p), row200(p); };
    EXPECT_EQ(expect_rule(masks::full(n, n), c, both, "full", negative_k0), 2);
    EXPECT_EQ(expect_rule(masks::causal(n, n), c, row200, "causal", negative_k0), 1);
  }
  EXPECT_GT(ran, 0);
}

TEST(Sm90Forward, NanAndInfInPartiallyVisibleBlocks) {
  REQUIRE_GPU();
  // Keys seen by some rows of a tile and masked for others in the same key block: NaN and
  // +-inf in one element of k and v, in q, on causal, sliding-window and document masks, with
  // and without softcap (the per-element rewrite kernel), and a NaN / +inf sink.
  const std::int64_t n = 512;
  const Mask causal = masks::causal(n, n);
  const Mask sliding = masks::sliding_window(n, n, {100, 0});
  const Mask docs(n, n, {Slice{{0, 100}, {0, 100}, MaskType::kCausal},
                         Slice{{110, 300}, {110, 300}, MaskType::kCausal},
                         Slice{{310, 512}, {310, 512}, MaskType::kFull}});
  const double nan = std::nan("");
  int ran = 0;
  for (DType in : {DType::kBF16, DType::kF16})
    for (double cap : {0.0, 30.0}) {
      Case c = with_dtype(Case{}, in);
      c.opts.softcap = cap;
      if (!built(c.in, c.d)) continue;
      ++ran;
      const std::string tag = cap > 0 ? " softcap" : "";
      EXPECT_GT(expect_rule(causal, c, [&](Problem& p) {
        plant_row(p.v, 70, 0, c.hkv, c.d, nan, 3);        // rows 64..69 share its block
        plant_row(p.v, 300, 1, c.hkv, c.d, kInf, 7);
        plant_row(p.k, 200, 1, c.hkv, c.d, -kInf, 5);
        plant_row(p.k, 260, 0, c.hkv, c.d, kInf, 9);
        plant_row(p.q, 100, 2, c.hq, c.d, nan, 1);
        plant_row(p.q, 40, 3, c.hq, c.d, -kInf, 2);
      }, "causal k/v/q" + tag), 0);
      EXPECT_GT(expect_rule(sliding, c, [&](Problem& p) {
        plant_row(p.k, 250, 0, c.hkv, c.d, kInf, 0);
        plant_row(p.v, 130, 1, c.hkv, c.d, -kInf, 4);
      }, "sliding window" + tag), 0);
      EXPECT_GT(expect_rule(docs, c, [&](Problem& p) {
        plant_row(p.v, 150, 0, c.hkv, c.d, nan, 2);       // seen by 150..299, not 110..149
        plant_row(p.k, 120, 1, c.hkv, c.d, -kInf, 6);
        for (std::int64_t t : {100, 105, 109, 300, 309})  // the holes: no slice covers them
          for (std::int64_t g = 0; g < c.hkv; ++g) {
            plant_row(p.k, t, g, c.hkv, c.d, t % 2 ? nan : kInf);
            plant_row(p.v, t, g, c.hkv, c.d, t % 2 ? -kInf : nan);
          }
        for (std::int64_t h = 0; h < c.hq; ++h) plant_row(p.q, 104, h, c.hq, c.d, nan);
      }, "documents, holes" + tag), 0);
      // Garbage only in the holes: nothing changes at all.
      EXPECT_EQ(expect_rule(docs, c, [&](Problem& p) {
        for (std::int64_t t : {100, 101, 108, 300, 305})
          for (std::int64_t g = 0; g < c.hkv; ++g) {
            plant_row(p.k, t, g, c.hkv, c.d, nan);
            plant_row(p.v, t, g, c.hkv, c.d, t % 2 ? kInf : nan);
          }
      }, "holes only" + tag), 0);
    }
  for (double x : {std::nan(""), kInf}) {  // a sink logit: every row of its head ("sh")
    Case c;
    c.sink_len = 2;
    if (!built(c.in, c.d)) continue;
    EXPECT_EQ(expect_rule(docs, c, [&](Problem& p) { p.sink[1] = x; }, "sink"), n);
  }
  EXPECT_GT(ran, 0);
}

// ---------------------------------------------------------------------------------------------
// Validation: the public entry point rejects what the GPU kernel cannot run, naming the culprit

TEST(Sm90Forward, ValidationErrorsNameTheCulprit) {
  REQUIRE_GPU();
  const std::int64_t n = 64, h = 2, d = 128;
  const Mask mask = masks::causal(n, n);
  DevTensor q(DType::kBF16, {n, h, d}), k(DType::kBF16, {n, h, d}), v(DType::kBF16, {n, h, d}),
      out(DType::kBF16, {n, h, d}), lse(DType::kF32, {n, h}), out32(DType::kF32, {n, h, d});
  for (DevTensor* t : {&q, &k, &v}) t->upload(std::vector<double>(std::size_t(n * h * d), 0.5));
  const FwdArgs good{q.view, k.view, v.view, out.view, lse.view, std::nullopt, std::nullopt};
  ASSERT_NO_THROW(attn_forward(mask, good));
  sync("valid call");

  {  // fp32 inputs on the GPU
    DevTensor q32(DType::kF32, {n, h, d}), k32(DType::kF32, {n, h, d}), v32(DType::kF32, {n, h, d});
    const FwdArgs a{q32.view, k32.view, v32.view, out32.view, lse.view, std::nullopt, std::nullopt};
    expect_error([&] { attn_forward(mask, a); }, "q: dtype fp32 is not bf16 or fp16");
  }
  {  // head dim 96
    DevTensor q96(DType::kBF16, {n, h, 96}), k96(DType::kBF16, {n, h, 96}),
        v96(DType::kBF16, {n, h, 96}), o96(DType::kBF16, {n, h, 96});
    const FwdArgs a{q96.view, k96.view, v96.view, o96.view, lse.view, std::nullopt, std::nullopt};
    expect_error([&] { attn_forward(mask, a); }, "q: head dim 96 is not one of");
  }
  {  // misaligned data pointer (one element in) and a row stride that is not a multiple of 8
    DeviceMem raw(std::size_t(n * h * d + 16) * 2);
    FwdArgs a = good;
    a.q.data = static_cast<unsigned char*>(raw.get()) + 2;
    expect_error([&] { attn_forward(mask, a); }, "q: the GPU kernel needs 16-byte aligned");
    a = good;
    a.v.data = static_cast<unsigned char*>(raw.get()) + 8;
    expect_error([&] { attn_forward(mask, a); }, "v: the GPU kernel needs 16-byte aligned");
    DeviceMem wide(std::size_t(n * (h * d + 4)) * 2);
    a = good;
    a.k = a.v = device_view(wide.get(), DType::kBF16, {n, h, d}, {h * d + 4, d, 1});
    expect_error([&] { attn_forward(mask, a); }, "k: the GPU kernel needs 16-byte aligned");
  }
  {  // tensors on the wrong device
    std::vector<std::uint16_t> host_out(std::size_t(n * h * d)), host_k(std::size_t(n * h * d));
    std::vector<float> host_lse(std::size_t(n * h));
    FwdArgs a = good;
    a.out = make_view(host_out.data(), DType::kBF16, {n, h, d}, Device::kCPU);
    expect_error([&] { attn_forward(mask, a); }, "out: on cpu but q is on cuda:");
    a = good;
    a.lse = make_view(host_lse.data(), DType::kF32, {n, h}, Device::kCPU);
    expect_error([&] { attn_forward(mask, a); }, "lse: on cpu but q is on cuda:");
    a = good;
    a.k = make_view(host_k.data(), DType::kBF16, {n, h, d}, Device::kCPU);
    expect_error([&] { attn_forward(mask, a); }, "k: on cpu but q is on cuda:");
  }
  {  // out dtypes the kernel cannot store, and accumulate into a 16-bit out
    DevTensor o64(DType::kF64, {n, h, d});
    FwdArgs a = good;
    a.out = o64.view;
    expect_error([&] { attn_forward(mask, a); }, "out: dtype fp64");
    AttnOptions opts;
    opts.accumulate = true;
    expect_error([&] { attn_forward(mask, good, opts); }, "out: dtype bf16 is not fp32");
  }
  {  // an fp64 sink
    DevTensor sink(DType::kF64, {1, h});
    FwdArgs a = good;
    a.sink = sink.view;
    expect_error([&] { attn_forward(mask, a); }, "sink: ");
  }
  sync("after the rejected calls");
}

}  // namespace
}  // namespace magi
