// CPU backward vs the fp64 oracle, given the oracle's final out/lse so the backward is judged
// on its own: central differences of the backend's own forward (fp64), sinks, views, narrow
// gradients, accumulate, determinism and a seeded random sweep; the shared edge cases are in
// cpu_edge_cases_test.cc, the checks and tolerances in tests/support/cpu_checks.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "attn_case.h"
#include "cpu_checks.h"
#include "seed.h"

namespace magi {
namespace {

using oracle::Problem;
using testing::Config;
using testing::Layout;
using testing::check_backward;
using testing::describe;
using testing::one_slice;

void check_both(const Mask& mask, std::int64_t hq, std::int64_t hkv, std::int64_t d,
                Config cfg = {}, std::int64_t sink_len = 0, std::uint64_t seed = 1) {
  testing::check_both(testing::Direction::kBackward, mask, hq, hkv, d, cfg, sink_len, seed);
}

TEST(CpuBackward, Softcap) {
  const Mask mask(90, 90, {Slice{{0, 90}, {0, 90}, MaskType::kCausal}});
  Config cfg;
  cfg.opts.softcap = 1.0;
  cfg.opts.softmax_scale = 0.6;
  check_both(mask, 2, 1, 64, cfg, 1);
  cfg.opts.softcap = 30.0;
  cfg.opts.softmax_scale.reset();
  check_both(mask, 2, 1, 64, cfg);
}

TEST(CpuBackward, Sinks) {
  const Mask mask(70, 66, {Slice{{5, 70}, {0, 66}, MaskType::kCausal}});
  for (SinkLayout layout : {SinkLayout::kSH, SinkLayout::kSSH})
    for (std::int64_t len : {1, 3, kMaxSinkLen}) {
      SCOPED_TRACE(::testing::Message() << "layout " << int(layout) << " len " << len);
      Config cfg;
      cfg.opts.sink_layout = layout;
      check_both(mask, 4, 2, 32, cfg, len);
    }
  // A sink without dsink: the gradients of q, k, v do not depend on it.
  std::mt19937_64 rng(5);
  Config cfg = testing::config_for(DType::kF32);
  check_backward(mask, testing::random_problem(rng, 70, 66, 2, 1, 16, cfg, 2), cfg, "no dsink",
                 false);
  cfg = testing::config_for(DType::kF64);
  cfg.sink = DType::kF32;
  check_backward(mask, testing::random_problem(rng, 70, 66, 2, 1, 16, cfg, 2), cfg, "fp32 sink");
}

TEST(CpuBackward, NothingVisibleAnywhere) {
  check_both(Mask(20, 30, {}), 2, 1, 16);
  check_both(Mask(20, 0, {}), 2, 1, 16);
  check_both(Mask(0, 30, {}), 2, 1, 16);
  check_both(Mask(20, 30, {}), 2, 1, 16, Config{}, 2);
}

TEST(CpuBackward, NonContiguousViews) {
  const Mask mask(77, 90, {Slice{{0, 77}, {0, 90}, MaskType::kCausal},
                           Slice{{0, 50}, {80, 90}, MaskType::kFull}});
  for (Layout layout : {Layout::kPadded, Layout::kHeadMajor}) {
    Config cfg;
    cfg.layout = layout;
    check_both(mask, 4, 2, 72, cfg, 2);
    std::mt19937_64 rng(9);
    cfg = testing::config_for(DType::kBF16);
    cfg.layout = layout;
    check_backward(mask, testing::random_problem(rng, 77, 90, 4, 2, 64, cfg), cfg);
  }
}

TEST(CpuBackward, NarrowInputsAndGradients) {
  // out/lse are given in fp32, so Delta is computed from the same values as in the oracle.
  const Mask mask(130, 140, {Slice{{0, 130}, {0, 140}, MaskType::kCausal}});
  for (DType in : {DType::kBF16, DType::kF16})
    for (DType grad : {DType::kF32, in}) {
      std::mt19937_64 rng(11);
      Config cfg = testing::config_for(in);
      cfg.grad = grad;
      check_backward(mask, testing::random_problem(rng, 130, 140, 2, 1, 128, cfg, 1), cfg);
    }
}

// L = sum(out * dout) through the backend's own forward.
double backend_loss(const Mask& mask, const Problem& p, const Config& cfg) {
  testing::FwdCall call(p, cfg);
  attn_forward(mask, call.args(), cfg.opts);
  const auto out = call.out.load();
  double l = 0;
  for (std::size_t n = 0; n < out.size(); ++n) l += out[n] * p.dout[n];
  return l;
}

TEST(CpuBackward, MatchesFiniteDifferencesOfTheForward) {
  // Rows 0-1 see nothing; rows share slices; a bi-causal band; GQA 4:2.
  const Mask mask(12, 14, {Slice{{2, 9}, {3, 9}, MaskType::kCausal},
                           Slice{{4, 12}, {0, 2}, MaskType::kFull},
                           Slice{{9, 12}, {9, 14}, MaskType::kBiCausal},
                           Slice{{2, 5}, {10, 13}, MaskType::kInvCausal}});
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  for (SinkLayout layout : {SinkLayout::kSH, SinkLayout::kSSH})
    for (double softcap : {0.0, 1.5}) {
      Config cfg = testing::config_for(DType::kF64);
      cfg.opts.sink_layout = layout;
      cfg.opts.softcap = softcap;
      cfg.opts.num_threads = 1;  // thousands of tiny calls
      Problem p = testing::random_problem(rng, 12, 14, 4, 2, 8, cfg, 2);
      testing::BwdCall call(p, oracle::forward(mask, p), cfg);
      ASSERT_NO_THROW(attn_backward(mask, call.args(), cfg.opts));
      const auto got = call.result();
      const std::string what = describe(cfg, p) + " " + testing::seed_note(seed);
      const double eps = 1e-5;
      auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
        std::vector<double> fd(x.size());
        for (std::size_t n = 0; n < x.size(); ++n) {
          const double keep = x[n];
          x[n] = keep + eps;
          const double up = backend_loss(mask, p, cfg);
          x[n] = keep - eps;
          const double down = backend_loss(mask, p, cfg);
          x[n] = keep;
          fd[n] = (up - down) / (2 * eps);
        }
        EXPECT_LE(testing::rel_err(grad, fd), 1e-7) << name << ": " << what;
      };
      check(p.q, got.dq, "dq");
      check(p.k, got.dk, "dk");
      check(p.v, got.dv, "dv");
      check(p.sink, got.dsink, "dsink");
    }
}

TEST(CpuBackward, AccumulateAddsIntoTheGradients) {
  const Mask mask(90, 80, {Slice{{10, 60}, {0, 80}, MaskType::kCausal},
                           Slice{{60, 90}, {5, 40}, MaskType::kFull}});
  for (DType in : {DType::kF64, DType::kF32}) {
    std::mt19937_64 rng(41);
    Config cfg = testing::config_for(in);
    const Problem p = testing::random_problem(rng, 90, 80, 4, 2, 32, cfg, 2);
    testing::BwdCall call(p, oracle::forward(mask, p), cfg);
    std::normal_distribution<double> normal;
    auto noise = [&](std::size_t n) {
      std::vector<double> xs(n);
      for (double& x : xs) x = testing::round_to(in, normal(rng));
      return xs;
    };
    const auto dq0 = noise(p.q.size()), dk0 = noise(p.k.size()), dv0 = noise(p.v.size()),
               ds0 = noise(p.sink.size());
    call.dq.store(dq0);
    call.dk.store(dk0);
    call.dv.store(dv0);
    call.dsink->store(ds0);
    cfg.opts.accumulate = true;
    ASSERT_NO_THROW(attn_backward(mask, call.args(), cfg.opts));
    const auto want = oracle::backward(mask, p);
    const auto got = call.result();
    auto plus = [](std::vector<double> a, const std::vector<double>& b) {
      for (std::size_t n = 0; n < a.size(); ++n) a[n] += b[n];
      return a;
    };
    const double tol = testing::tolerance(cfg.compute(), cfg.compute());
    const std::string what = describe(cfg, p);
    EXPECT_LE(testing::rel_err(got.dq, plus(dq0, want.dq)), tol) << what;
    EXPECT_LE(testing::rel_err(got.dk, plus(dk0, want.dk)), tol) << what;
    EXPECT_LE(testing::rel_err(got.dv, plus(dv0, want.dv)), tol) << what;
    EXPECT_LE(testing::rel_err(got.dsink, plus(ds0, want.dsink)), tol) << what;
  }
}

TEST(CpuBackward, SlicesSplitOverTwoCallsSumToTheUnion) {
  // Both calls see the final out/lse of the union; the sink's gradient is taken once.
  const std::vector<Slice> a{Slice{{0, 150}, {0, 8}, MaskType::kFull},
                             Slice{{70, 150}, {70, 150}, MaskType::kCausal}};
  const std::vector<Slice> b{Slice{{8, 70}, {8, 70}, MaskType::kCausal},
                             Slice{{100, 150}, {8, 40}, MaskType::kBiCausal}};
  std::vector<Slice> both = a;
  both.insert(both.end(), b.begin(), b.end());
  const Mask mask_a(160, 150, a), mask_b(160, 150, b), mask_all(160, 150, both);
  for (DType in : {DType::kF64, DType::kF32}) {
    std::mt19937_64 rng(43);
    Config cfg = testing::config_for(in);
    const Problem p = testing::random_problem(rng, 160, 150, 4, 2, 64, cfg, 2);
    testing::BwdCall call(p, oracle::forward(mask_all, p), cfg);
    call.dsink->fill(0.0);  // only the accumulating call touches it
    BwdArgs args = call.args();
    args.sink.reset();
    args.dsink.reset();
    ASSERT_NO_THROW(attn_backward(mask_a, args, cfg.opts));
    cfg.opts.accumulate = true;
    ASSERT_NO_THROW(attn_backward(mask_b, call.args(), cfg.opts));
    const auto want = oracle::backward(mask_all, p);
    const auto got = call.result();
    const double tol = testing::tolerance(cfg.compute(), cfg.compute());
    const std::string what = describe(cfg, p);
    EXPECT_LE(testing::rel_err(got.dq, want.dq), tol) << what;
    EXPECT_LE(testing::rel_err(got.dk, want.dk), tol) << what;
    EXPECT_LE(testing::rel_err(got.dv, want.dv), tol) << what;
    EXPECT_LE(testing::rel_err(got.dsink, want.dsink), tol) << what;
  }
}

TEST(CpuBackward, BitwiseDeterministic) {
  // attention.h promises bitwise repeatability for a fixed thread count; the CPU backend
  // (kernels/cpu/backward.cc) also promises independence from the thread count, checked too.
  std::mt19937_64 rng(31);
  const Mask mask = testing::random_mask(rng, 300, 280, 8);
  for (DType in : {DType::kF32, DType::kF64}) {
    Config cfg = testing::config_for(in);
    const Problem p = testing::random_problem(rng, 300, 280, 4, 2, 64, cfg, 1);
    const auto fwd = oracle::forward(mask, p);
    std::vector<std::vector<std::uint64_t>> first;
    for (int threads : {1, 2, 3}) {
      cfg.opts.num_threads = threads;
      cfg.opts.deterministic = threads == 3;
      testing::BwdCall x(p, fwd, cfg), y(p, fwd, cfg);
      ASSERT_NO_THROW(attn_backward(mask, x.args(), cfg.opts));
      ASSERT_NO_THROW(attn_backward(mask, y.args(), cfg.opts));
      const std::vector<std::vector<std::uint64_t>> bits{x.dq.raw(), x.dk.raw(), x.dv.raw(),
                                                         x.dsink->raw()};
      EXPECT_TRUE(bits == (std::vector{y.dq.raw(), y.dk.raw(), y.dv.raw(), y.dsink->raw()}))
          << "two runs differ with " << threads << " threads";
      if (first.empty()) first = bits;
      EXPECT_TRUE(bits == first) << threads << " threads differ from 1 thread";
      check_backward(mask, p, cfg, "threads " + std::to_string(threads));
    }
  }
}

TEST(CpuBackward, RandomSweep) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  const int iterations = testing::full_level() ? 300 : 30;
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
    cfg.layout = Layout(pick({0, 0, 1, 2}));
    cfg.opts.softcap = pick({0, 0, 0, 1}) ? 5.0 : 0.0;
    cfg.opts.sink_layout = pick({0, 1}) ? SinkLayout::kSSH : SinkLayout::kSH;
    cfg.opts.num_threads = int(pick({0, 1, 2}));
    if (pick({0, 1, 2, 3}) == 0) cfg.opts.softmax_scale = 0.5;
    const std::int64_t sink_len = pick({0, 0, 1, 4});
    const Mask mask = testing::random_mask(rng, nq, nk, int(pick({1, 3, 8})));
    const Problem p = testing::random_problem(rng, nq, nk, hq, hkv, d, cfg, sink_len);
    check_backward(mask, p, cfg, testing::seed_note(seed) + " iteration " + std::to_string(it));
    if (::testing::Test::HasFailure()) break;  // the first failure, with its replay line
  }
}

TEST(CpuBackward, SampledRowsOfALongSequence) {
  const std::int64_t n = testing::full_level() ? 16384 : 4096;
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  const Mask mask = testing::packed_documents(rng, n);
  const Config cfg = testing::config_for(DType::kF32);
  const Problem p = testing::random_problem(rng, n, n, 4, 2, 64, cfg, 1);
  std::vector<std::int64_t> q_rows{0, 15, 16, n - 1}, k_rows{0, 15, 16, n - 1};
  for (int i = 0; i < 12; ++i) {
    q_rows.push_back(std::uniform_int_distribution<std::int64_t>(0, n - 1)(rng));
    k_rows.push_back(std::uniform_int_distribution<std::int64_t>(0, n - 1)(rng));
  }
  const auto want = oracle::sampled(mask, p, q_rows, k_rows);
  // out/lse come from the backend's forward: the oracle computes them for sampled rows only.
  testing::FwdCall fwd(p, cfg);
  ASSERT_NO_THROW(attn_forward(mask, fwd.args(), cfg.opts));
  testing::BwdCall call(p, fwd.result(), cfg);
  ASSERT_NO_THROW(attn_backward(mask, call.args(), cfg.opts));
  const auto got = call.result();
  using testing::pick_rows;
  const std::string what = testing::seed_note(seed);
  EXPECT_LE(testing::rel_err(pick_rows(got.dq, q_rows, 4 * 64), want.dq), 1e-5) << what;
  EXPECT_LE(testing::rel_err(pick_rows(got.dk, k_rows, 2 * 64), want.dk), 1e-5) << what;
  EXPECT_LE(testing::rel_err(pick_rows(got.dv, k_rows, 2 * 64), want.dv), 1e-5) << what;
}

}  // namespace
}  // namespace magi
