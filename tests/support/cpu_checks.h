// Single-call checks of the CPU backend against the fp64 oracle (docs/semantics.md §5), shared by
// the forward, backward and edge-case tests. Inputs are rounded to the tested dtype before the
// oracle sees them, so what is left is the backend's own arithmetic plus the final store: 1e-12 in
// fp64, 1e-5 in fp32, and one extra rounding (2^-8 bf16, 2^-11 fp16) for narrow outputs and
// gradients. The backward is given the oracle's final out/lse, so it is judged on its own.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <sstream>
#include <string>

#include "attn_case.h"
#include "naive.h"

namespace magi::testing {

inline std::string describe(const Config& c, const oracle::Problem& p) {
  std::ostringstream os;
  os << dtype_name(c.in) << " in, " << dtype_name(c.out) << " out, " << dtype_name(c.grad)
     << " grads, " << p.num_q << "x" << p.num_k << " hq " << p.heads_q << " hkv " << p.heads_kv
     << " d " << p.head_dim << " layout " << int(c.layout) << " softcap " << c.opts.softcap
     << " threads " << c.opts.num_threads;
  if (p.sink_len > 0)
    os << " sink " << p.sink_len << (p.sink_layout == SinkLayout::kSH ? " sh" : " ssh");
  return os.str();
}

// One forward call compared with the oracle; rows that see nothing must be exactly 0 / -inf.
inline void check_forward(const Mask& mask, const oracle::Problem& p, const Config& cfg,
                          const std::string& note = "") {
  const std::string what = describe(cfg, p) + "; " + note + "\n" + mask.to_string();
  FwdCall call(p, cfg);
  ASSERT_NO_THROW(attn_forward(mask, call.args(), cfg.opts)) << what;
  const auto want = oracle::forward(mask, p);
  const auto got = call.result();
  const double tol_c = tolerance(cfg.compute(), cfg.compute());
  EXPECT_LE(rel_err(got.out, want.out), tolerance(cfg.compute(), cfg.out)) << "out: " << what;
  EXPECT_LE(lse_err(got.lse, want.lse), tol_c) << "lse: " << what;
  if (cfg.max_logits) {
    EXPECT_LE(lse_err(got.max_logits, want.max_logits), tol_c) << "max_logits: " << what;
  }
  std::int64_t nonzero = 0;
  for (std::size_t r = 0; r < want.lse.size(); ++r)
    if (want.lse[r] == -std::numeric_limits<double>::infinity())
      for (std::int64_t e = 0; e < p.head_dim; ++e) nonzero += got.out[r * p.head_dim + e] != 0.0;
  EXPECT_EQ(nonzero, 0) << "empty rows must give out exactly 0: " << what;
  EXPECT_TRUE(call.gaps_intact()) << "wrote outside the view: " << what;
}

// One forward call judged by the 16-bit rule (naive.h): out within twice the error of the
// same-precision naive reference, lse likewise, empty rows exactly 0 / -inf. For the AMX path,
// whose P V takes P rounded to bf16 as the GPU kernels do.
inline void check_forward_16bit(const Mask& mask, const oracle::Problem& p, const Config& cfg,
                                const std::string& note = "") {
  const std::string what = describe(cfg, p) + "; " + note + "\n" + mask.to_string();
  FwdCall call(p, cfg);
  ASSERT_NO_THROW(attn_forward(mask, call.args(), cfg.opts)) << what;
  const auto want = oracle::forward(mask, p);
  const auto naive = naive_forward(mask, p, cfg.in, cfg.out);
  expect_close(call.result(), want, naive, p.head_dim, cfg.max_logits, what, "cpu");
  EXPECT_TRUE(call.gaps_intact()) << "wrote outside the view: " << what;
}

// One backward call (given the oracle's out/lse) compared with the oracle's gradients.
inline void check_backward(const Mask& mask, const oracle::Problem& p, const Config& cfg,
                           const std::string& note = "", bool with_dsink = true) {
  const std::string what = describe(cfg, p) + "; " + note + "\n" + mask.to_string();
  BwdCall call(p, oracle::forward(mask, p), cfg, with_dsink);
  ASSERT_NO_THROW(attn_backward(mask, call.args(), cfg.opts)) << what;
  const auto want = oracle::backward(mask, p);
  const auto got = call.result();
  const double tol = tolerance(cfg.compute(), cfg.grad);
  const double scale = grad_scale(want);
  EXPECT_LE(err_at_scale(got.dq, want.dq, scale), tol) << "dq: " << what;
  EXPECT_LE(err_at_scale(got.dk, want.dk, scale), tol) << "dk: " << what;
  EXPECT_LE(err_at_scale(got.dv, want.dv, scale), tol) << "dv: " << what;
  if (call.dsink) {
    EXPECT_LE(err_at_scale(got.dsink, want.dsink, scale), tolerance(cfg.compute(), cfg.sink))
        << "dsink: " << what;
  }
  EXPECT_TRUE(call.gaps_intact()) << "wrote outside the view: " << what;
}

enum class Direction { kForward, kBackward };
inline void PrintTo(Direction d, std::ostream* os) {
  *os << (d == Direction::kForward ? "forward" : "backward");
}

inline void check(Direction dir, const Mask& mask, const oracle::Problem& p, const Config& cfg,
                  const std::string& note = "") {
  if (dir == Direction::kForward)
    check_forward(mask, p, cfg, note);
  else
    check_backward(mask, p, cfg, note);
}

// The same mask and shape in fp64 and fp32 (layout, options and max_logits from cfg).
inline void check_both(Direction dir, const Mask& mask, std::int64_t hq, std::int64_t hkv,
                       std::int64_t d, Config cfg = {}, std::int64_t sink_len = 0,
                       std::uint64_t seed = 1) {
  for (DType in : {DType::kF64, DType::kF32}) {
    std::mt19937_64 rng(seed);
    Config c = config_for(in);
    c.layout = cfg.layout;
    c.opts = cfg.opts;
    c.max_logits = cfg.max_logits;
    check(dir, mask,
          random_problem(rng, mask.total_seqlen_q(), mask.total_seqlen_k(), hq, hkv, d, c,
                         sink_len),
          c);
  }
}

inline Mask one_slice(std::int64_t nq, std::int64_t nk, Slice s) { return Mask(nq, nk, {s}); }

}  // namespace magi::testing
