// CPU forward vs the fp64 oracle (docs/semantics.md §5): forward-only cases (softcap, sinks, views,
// narrow outputs, accumulate, determinism) and a seeded random sweep; the edge cases both
// directions share are in cpu_edge_cases_test.cc, the checks and tolerances in
// tests/support/cpu_checks.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "attn_case.h"
#include "magi/build_info.h"
#include "cpu_checks.h"
#include "seed.h"

namespace magi {
namespace {

using oracle::Problem;
using testing::Config;
using testing::Layout;
using testing::check_forward;
using testing::describe;
using testing::one_slice;
constexpr double kInf = std::numeric_limits<double>::infinity();

void check_both(const Mask& mask, std::int64_t hq, std::int64_t hkv, std::int64_t d,
                Config cfg = {}, std::int64_t sink_len = 0, std::uint64_t seed = 1) {
  testing::check_both(testing::Direction::kForward, mask, hq, hkv, d, cfg, sink_len, seed);
}

TEST(CpuForward, Softcap) {
  const Mask mask(90, 90, {Slice{{0, 90}, {0, 90}, MaskType::kCausal}});
  Config cfg;
  cfg.opts.softcap = 1.0;
  cfg.opts.softmax_scale = 0.6;  // logits of several units: tanh saturates
  check_both(mask, 2, 1, 64, cfg);
  cfg.opts.softcap = 30.0;
  cfg.opts.softmax_scale.reset();
  check_both(mask, 2, 1, 64, cfg);
}

TEST(CpuForward, Sinks) {
  const Mask mask(70, 66, {Slice{{5, 70}, {0, 66}, MaskType::kCausal}});
  for (SinkLayout layout : {SinkLayout::kSH, SinkLayout::kSSH})
    for (std::int64_t len : {1, 3, kMaxSinkLen}) {
      SCOPED_TRACE(::testing::Message() << "layout " << int(layout) << " len " << len);
      Config cfg;
      cfg.opts.sink_layout = layout;
      check_both(mask, 4, 2, 32, cfg, len);
    }
  // An fp32 sink with fp64 compute is legal; the oracle sees the fp32-rounded logits.
  std::mt19937_64 rng(5);
  Config cfg = testing::config_for(DType::kF64);
  cfg.sink = DType::kF32;
  check_forward(mask, testing::random_problem(rng, 70, 66, 2, 1, 16, cfg, 2), cfg);
}

TEST(CpuForward, NothingVisibleAnywhere) {
  check_both(Mask(20, 30, {}), 2, 1, 16);
  check_both(Mask(20, 0, {}), 2, 1, 16);
  check_both(Mask(0, 30, {}), 2, 1, 16);
  Config cfg;
  check_both(Mask(20, 0, {}), 2, 1, 16, cfg, 2);
  cfg.max_logits = false;
  check_both(Mask(20, 30, {Slice{{0, 20}, {0, 30}, MaskType::kFull}}), 2, 1, 16, cfg);
}

TEST(CpuForward, NonContiguousViews) {
  const Mask mask(77, 90, {Slice{{0, 77}, {0, 90}, MaskType::kCausal},
                           Slice{{0, 50}, {80, 90}, MaskType::kFull}});
  for (Layout layout : {Layout::kPadded, Layout::kHeadMajor}) {
    Config cfg;
    cfg.layout = layout;
    check_both(mask, 4, 2, 72, cfg, 2);
    std::mt19937_64 rng(9);
    cfg = testing::config_for(DType::kBF16);
    cfg.layout = layout;
    check_forward(mask, testing::random_problem(rng, 77, 90, 4, 2, 64, cfg), cfg);
  }
}

TEST(CpuForward, NarrowInputsAndOutputs) {
  const Mask mask(130, 140, {Slice{{0, 130}, {0, 140}, MaskType::kCausal}});
  for (DType in : {DType::kBF16, DType::kF16})
    for (DType out : {DType::kF32, in}) {
      std::mt19937_64 rng(11);
      Config cfg = testing::config_for(in);
      cfg.out = out;
      check_forward(mask, testing::random_problem(rng, 130, 140, 2, 1, 128, cfg, 1), cfg);
    }
  std::mt19937_64 rng(12);
  Config cfg = testing::config_for(DType::kF64);
  cfg.out = DType::kF32;  // fp64 compute stored to fp32
  check_forward(mask, testing::random_problem(rng, 130, 140, 2, 1, 64, cfg), cfg);
}

// (out_a, lse_a) <- merge with (out_b, lse_b), in double, safe for -inf on either side.
void merge_row(double& lse_a, double* out_a, double lse_b, const double* out_b, std::int64_t d) {
  if (lse_b == -kInf) return;
  const double lse = lse_a == -kInf ? lse_b
                                    : std::max(lse_a, lse_b) +
                                          std::log1p(std::exp(-std::abs(lse_a - lse_b)));
  const double wa = lse_a == -kInf ? 0.0 : std::exp(lse_a - lse), wb = std::exp(lse_b - lse);
  for (std::int64_t e = 0; e < d; ++e) out_a[e] = wa * out_a[e] + wb * out_b[e];
  lse_a = lse;
}

TEST(CpuForward, AccumulateTwoCallsEqualsOneOverTheUnion) {
  const std::vector<Slice> a{Slice{{0, 150}, {0, 8}, MaskType::kFull},
                             Slice{{70, 150}, {70, 150}, MaskType::kCausal}};
  const std::vector<Slice> b{Slice{{8, 70}, {8, 70}, MaskType::kCausal},
                             Slice{{100, 150}, {8, 40}, MaskType::kBiCausal}};
  std::vector<Slice> both = a;
  both.insert(both.end(), b.begin(), b.end());
  const Mask mask_a(160, 150, a), mask_b(160, 150, b), mask_all(160, 150, both);
  for (DType in : {DType::kF64, DType::kF32})
    for (std::int64_t sink_len : {0, 2}) {
      std::mt19937_64 rng(21);
      const Config cfg = testing::config_for(in);
      const Problem p = testing::random_problem(rng, 160, 150, 4, 2, 64, cfg, sink_len);
      testing::FwdCall split(p, cfg), whole(p, cfg);
      AttnOptions opts = cfg.opts;
      ASSERT_NO_THROW(attn_forward(mask_a, split.args(/*with_sink=*/false), opts));
      opts.accumulate = true;  // the sink joins once, with the second part
      ASSERT_NO_THROW(attn_forward(mask_b, split.args(), opts));
      ASSERT_NO_THROW(attn_forward(mask_all, whole.args(), cfg.opts));
      const auto want = oracle::forward(mask_all, p);
      const auto got = split.result(), one = whole.result();
      const double tol = testing::tolerance(cfg.compute(), cfg.compute());
      const std::string what = describe(cfg, p);
      EXPECT_LE(testing::rel_err(got.out, want.out), tol) << what;
      EXPECT_LE(testing::lse_err(got.lse, want.lse), tol) << what;
      EXPECT_LE(testing::lse_err(got.max_logits, want.max_logits), tol) << what;
      EXPECT_LE(testing::rel_err(got.out, one.out), 2 * tol) << what;
      EXPECT_LE(testing::lse_err(got.lse, one.lse), 2 * tol) << what;
      if (sink_len == 0) {
        EXPECT_EQ(got.lse[150 * 4], -kInf) << "row 150 sees nothing: " << what;
      }
    }
}

TEST(CpuForward, AccumulateMergesIntoAnyPartialResult) {
  // out/lse start as an arbitrary partial result (some rows empty: 0 / -inf). Rows the call
  // does not touch stay bitwise unchanged unless a sink is passed, which reaches every row.
  const Mask mask(90, 80, {Slice{{10, 60}, {0, 80}, MaskType::kCausal},
                           Slice{{60, 70}, {0, 5}, MaskType::kBiCausal}});
  const std::uint64_t seed = testing::test_seed();
  for (DType in : {DType::kF64, DType::kF32})
    for (std::int64_t sink_len : {0, 2}) {
      std::mt19937_64 rng(seed);
      const Config cfg = testing::config_for(in);
      const Problem p = testing::random_problem(rng, 90, 80, 2, 1, 32, cfg, sink_len);
      const std::int64_t hq = 2, d = 32;
      std::vector<double> out0(90 * hq * d), lse0(90 * hq), ml0{0.25, -kInf};
      std::normal_distribution<double> normal;
      for (std::size_t r = 0; r < lse0.size(); ++r) {
        const bool empty = r % 5 == 0;
        lse0[r] = empty ? -kInf : testing::round_to(in, 2 * normal(rng));
        for (std::int64_t e = 0; e < d; ++e)
          out0[r * d + e] = empty ? 0.0 : testing::round_to(in, normal(rng));
      }
      testing::FwdCall call(p, cfg);
      call.out.store(out0);
      call.lse.store(lse0);
      call.max_logits.store(ml0);
      AttnOptions opts = cfg.opts;
      opts.accumulate = true;
      ASSERT_NO_THROW(attn_forward(mask, call.args(), opts));

      Problem no_sink = p;
      no_sink.sink_len = 0;
      no_sink.sink.clear();
      const auto part = oracle::forward(mask, no_sink);
      std::vector<double> out = out0, lse = lse0;
      for (std::size_t r = 0; r < lse.size(); ++r) {
        merge_row(lse[r], &out[r * d], part.lse[r], &part.out[r * d], d);
        // Each sink logit is one more component: out 0, lse = the logit.
        const std::int64_t h = std::int64_t(r) % hq, row = std::int64_t(r) / hq;
        const std::vector<double> zero(d, 0.0);
        for (std::int64_t t = 0; t < sink_len; ++t) {
          const double s = p.sink[p.sink_layout == SinkLayout::kSH ? t * hq + h
                                                                   : (row * sink_len + t) * hq + h];
          merge_row(lse[r], &out[r * d], s, zero.data(), d);
        }
      }
      const auto got = call.result();
      const double tol = testing::tolerance(cfg.compute(), cfg.compute());
      const std::string what = describe(cfg, p) + " " + testing::seed_note(seed);
      EXPECT_LE(testing::rel_err(got.out, out), tol) << what;
      EXPECT_LE(testing::lse_err(got.lse, lse), tol) << what;
      const std::vector<double> ml{std::max(0.25, part.max_logits[0]), part.max_logits[1]};
      EXPECT_LE(testing::lse_err(got.max_logits, ml), tol) << what;
      if (sink_len == 0)
        for (std::int64_t r = 0; r < 10 * hq; ++r) {  // rows 0-9: no slice
          EXPECT_EQ(got.lse[r], lse0[r]) << "untouched row " << r / hq << ": " << what;
          for (std::int64_t e = 0; e < d; ++e) EXPECT_EQ(got.out[r * d + e], out0[r * d + e]);
        }
    }
}

TEST(CpuForward, BitwiseDeterministic) {
  // attention.h promises bitwise repeatability for a fixed thread count; the CPU backend
  // (kernels/cpu/work.h) also promises independence from the thread count, checked too.
  std::mt19937_64 rng(31);
  const Mask mask = testing::random_mask(rng, 300, 280, 8);
  for (DType in : {DType::kF32, DType::kF64}) {
    Config cfg = testing::config_for(in);
    const Problem p = testing::random_problem(rng, 300, 280, 4, 2, 64, cfg, 1);
    std::vector<std::vector<std::uint64_t>> first;
    for (int threads : {1, 2, 3}) {
      cfg.opts.num_threads = threads;
      cfg.opts.deterministic = threads == 3;
      testing::FwdCall x(p, cfg), y(p, cfg);
      ASSERT_NO_THROW(attn_forward(mask, x.args(), cfg.opts));
      ASSERT_NO_THROW(attn_forward(mask, y.args(), cfg.opts));
      const std::vector<std::vector<std::uint64_t>> bits{x.out.raw(), x.lse.raw(),
                                                         x.max_logits.raw()};
      EXPECT_TRUE(bits == (std::vector{y.out.raw(), y.lse.raw(), y.max_logits.raw()}))
          << "two runs differ with " << threads << " threads";
      if (first.empty()) first = bits;
      EXPECT_TRUE(bits == first) << threads << " threads differ from 1 thread";
      check_forward(mask, p, cfg, "threads " + std::to_string(threads));
    }
  }
}

TEST(CpuForward, RandomSweep) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  const int iterations = testing::full_level() ? 400 : 40;
  auto pick = [&](std::initializer_list<std::int64_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng));
  };
  for (int it = 0; it < iterations; ++it) {
    const std::int64_t nq = pick({1, 17, 64, 65, 130, 257}) + pick({0, 0, 3});
    const std::int64_t nk = pick({1, 17, 63, 128, 129, 300});
    const std::int64_t hkv = pick({1, 2}), hq = hkv * pick({1, 2, 3});
    const std::int64_t d = pick({8, 16, 64, 72, 128});
    Config cfg = testing::config_for(pick({0, 1, 2}) == 0 ? DType::kF64
                                      : pick({0, 1, 2}) ? DType::kF32
                                                        : DType::kBF16);
    if (cfg.in == DType::kBF16 && pick({0, 1})) cfg.out = DType::kBF16;
    cfg.layout = Layout(pick({0, 0, 1, 2}));
    cfg.opts.softcap = pick({0, 0, 0, 1}) ? 5.0 : 0.0;
    cfg.opts.sink_layout = pick({0, 1}) ? SinkLayout::kSSH : SinkLayout::kSH;
    cfg.opts.num_threads = int(pick({0, 1, 2}));
    if (pick({0, 1, 2, 3}) == 0) cfg.opts.softmax_scale = 0.5;
    const std::int64_t sink_len = pick({0, 0, 1, 4});
    const Mask mask = testing::random_mask(rng, nq, nk, int(pick({1, 3, 8})));
    const Problem p = testing::random_problem(rng, nq, nk, hq, hkv, d, cfg, sink_len);
    check_forward(mask, p, cfg, testing::seed_note(seed) + " iteration " + std::to_string(it));
    if (::testing::Test::HasFailure()) break;  // the first failure, with its replay line
  }
}

// bf16 q, k, v and out: the path that runs on AMX tiles where the CPU has them (P rounded to
// bf16 there, so judged by the 16-bit rule, naive.h), the fp32 one elsewhere or under
// MAGI_CPU_ISA. Lengths off the 16 / 32 / 64 grids, D padded to 32, GQA, documents, sinks,
// softcap.
TEST(CpuForward, Bf16InAndOut) {
  const std::string isa = build_info().cpu_kernels;
  std::mt19937_64 rng(21);
  int cases = 0;
  for (std::int64_t d : {64, 128, 72})
    for (const auto& [nq, nk] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {33, 70},
                                 {300, 300}, {517, 611}}) {
      for (int kind = 0; kind < 4; ++kind) {
        const Mask mask = kind == 0   ? one_slice(nq, nk, Slice{{0, nq}, {0, nk}, MaskType::kFull})
                          : kind == 1 ? one_slice(nq, nk, Slice{{0, nq}, {0, nk}, MaskType::kCausal})
                          : kind == 2 ? testing::random_mask(rng, nq, nk, 3)
                                      : testing::packed_documents(rng, nq + 48);
        Config cfg = testing::config_for(DType::kBF16);
        cfg.out = DType::kBF16;
        cfg.opts.softcap = kind == 2 ? 5.0 : 0.0;
        const std::int64_t sink_len = kind == 3 ? 2 : 0;
        const Problem p = testing::random_problem(rng, mask.total_seqlen_q(),
                                                  mask.total_seqlen_k(), 4, kind == 1 ? 1 : 2, d,
                                                  cfg, sink_len);
        const std::string note = "kernels: " + isa + ", mask kind " + std::to_string(kind);
        if (isa.rfind("amx", 0) == 0)
          check_forward_16bit(mask, p, cfg, note);
        else
          check_forward(mask, p, cfg, note);
        ++cases;
      }
    }
  EXPECT_EQ(cases, 48);
}

TEST(CpuForward, SampledRowsOfALongSequence) {
  // Packed documents with 16 global tokens, checked on sampled rows so the fp64 oracle stays
  // fast at 4k tokens (16k in the full level).
  const std::int64_t n = testing::full_level() ? 16384 : 4096;
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  const Mask mask = testing::packed_documents(rng, n);
  const Config cfg = testing::config_for(DType::kF32);
  const Problem p = testing::random_problem(rng, n, n, 4, 2, 64, cfg, 1);
  testing::FwdCall call(p, cfg);
  ASSERT_NO_THROW(attn_forward(mask, call.args(), cfg.opts));
  std::vector<std::int64_t> rows{0, 15, 16, n - 1};
  for (int i = 0; i < 20; ++i)
    rows.push_back(std::uniform_int_distribution<std::int64_t>(0, n - 1)(rng));
  const auto want = oracle::sampled(mask, p, rows, {});
  const auto got = call.result();
  EXPECT_LE(testing::rel_err(testing::pick_rows(got.out, rows, 4 * 64), want.out), 1e-5)
      << testing::seed_note(seed);
  EXPECT_LE(testing::lse_err(testing::pick_rows(got.lse, rows, 4), want.lse), 1e-5)
      << testing::seed_note(seed);
}

}  // namespace
}  // namespace magi
