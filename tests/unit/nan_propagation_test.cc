// Non-finite inputs on the CPU backend (docs/numerics.md): a NaN or inf in an element a row
// reads makes that row's out and lse NaN, and the gradients its cells touch NaN; an element no
// row reads changes nothing, bit for bit. Every case is checked against the fp64 oracle (which
// implements the rule by definition, NaN positions first) and the unseen ones against the run
// with clean values. Sizes are not tile multiples (256 x 64), so the poked keys sit in
// partially visible tiles, beside rows of the same tile that do not see them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_checks.h"
#include "magi/mask_builders.h"
#include "seed.h"

namespace magi::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t kHq = 2, kHkv = 1, kD = 16;

enum class Where { kQ, kK, kV, kDout };
const char* name(Where w) {
  switch (w) {
    case Where::kQ: return "q";
    case Where::kK: return "k";
    case Where::kV: return "v";
    case Where::kDout: return "dout";
  }
  return "?";
}

// Element `col` of `row` (head 0) of one input set to x.
void poke(oracle::Problem& p, Where w, std::int64_t row, double x, std::int64_t col = 3) {
  switch (w) {
    case Where::kQ: p.q[std::size_t((row * p.heads_q) * p.head_dim + col)] = x; break;
    case Where::kK: p.k[std::size_t((row * p.heads_kv) * p.head_dim + col)] = x; break;
    case Where::kV: p.v[std::size_t((row * p.heads_kv) * p.head_dim + col)] = x; break;
    case Where::kDout: p.dout[std::size_t((row * p.heads_q) * p.head_dim + col)] = x; break;
  }
}

std::int64_t count_nan(const std::vector<double>& xs) {
  std::int64_t n = 0;
  for (double x : xs) n += std::isnan(x);
  return n;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

struct Case {
  std::string name;
  Mask mask;
  std::vector<std::int64_t> seen_keys, unseen_keys, seen_rows, unseen_rows;
};

// Three documents with holes between them (keys and rows 90..99 and 170..179 belong to no
// slice), a causal mask, a causal one with more queries than keys (rows 0..49 see nothing)
// and a sliding window.
std::vector<Case> cases() {
  std::vector<Case> cs;
  cs.push_back({"causal", masks::causal(260, 260), {5, 70}, {}, {5, 70}, {}});
  cs.push_back({"documents", Mask(260, 260, {Slice{{0, 90}, {0, 90}, MaskType::kCausal},
                                            Slice{{100, 170}, {100, 170}, MaskType::kCausal},
                                            Slice{{180, 260}, {180, 260}, MaskType::kFull}}),
                {130, 185}, {95, 175, 179}, {130}, {95, 172}});
  cs.push_back({"causal_sq_gt_sk", masks::causal(260, 210), {0, 200}, {}, {100}, {3, 49}});
  cs.push_back({"sliding", masks::sliding_window(260, 260, {37, 5}), {150, 63}, {}, {150}, {}});
  return cs;
}

Config config(DType in) {
  Config c = config_for(in);
  c.max_logits = true;
  return c;
}

oracle::Problem problem(const Mask& mask, const Config& cfg, std::int64_t sink_len = 0) {
  std::mt19937_64 rng(7);
  return random_problem(rng, mask.total_seqlen_q(), mask.total_seqlen_k(), kHq, kHkv, kD, cfg,
                        sink_len);
}

oracle::FwdResult run_forward(const Mask& mask, const oracle::Problem& p, const Config& cfg) {
  FwdCall call(p, cfg);
  attn_forward(mask, call.args(), cfg.opts);
  return call.result();
}

oracle::BwdResult run_backward(const Mask& mask, const oracle::Problem& p, const Config& cfg) {
  BwdCall call(p, oracle::forward(mask, p), cfg);
  attn_backward(mask, call.args(), cfg.opts);
  return call.result();
}

// Every (dtype, mask, input, position) with NaN and an inf (+inf and -inf by turns): against
// the oracle, and an unseen position against the clean run bit for bit, forward and backward.
TEST(NanPropagation, EveryInputValueAndPositionMatchesTheOracle) {
  for (DType in : {DType::kF64, DType::kF32, DType::kBF16})
    for (const Case& c : cases()) {
      const Config cfg = config(in);
      const oracle::Problem clean = problem(c.mask, cfg);
      const oracle::FwdResult clean_fwd = run_forward(c.mask, clean, cfg);
      const oracle::BwdResult clean_bwd = run_backward(c.mask, clean, cfg);
      for (Where w : {Where::kQ, Where::kK, Where::kV, Where::kDout})
        for (int v = 0; v < 2; ++v)
          for (bool seen : {true, false}) {
            const bool rows = w == Where::kQ || w == Where::kDout;
            const auto& at = rows ? (seen ? c.seen_rows : c.unseen_rows)
                                  : (seen ? c.seen_keys : c.unseen_keys);
            for (std::int64_t row : at) {
              const double x = v == 0 ? kNaN : row % 2 ? kInf : -kInf;
              oracle::Problem p = clean;
              poke(p, w, row, x);
              const std::string what = std::string(dtype_name(in)) + " " + c.name + ": " +
                                       name(w) + "[" + std::to_string(row) + "] = " +
                                       std::to_string(x) + (seen ? " (seen)" : " (unseen)");
              SCOPED_TRACE(what);
              const oracle::FwdResult want = oracle::forward(c.mask, p);
              if (w != Where::kDout) {
                check_forward(c.mask, p, cfg, what);
                EXPECT_EQ(count_nan(want.lse) > 0, seen) << "the case itself: " << what;
              }
              check_backward(c.mask, p, cfg, what);
              if (seen) continue;
              const oracle::FwdResult got = run_forward(c.mask, p, cfg);
              EXPECT_TRUE(same_bits(got.out, clean_fwd.out)) << "out: " << what;
              EXPECT_TRUE(same_bits(got.lse, clean_fwd.lse)) << "lse: " << what;
              EXPECT_TRUE(same_bits(got.max_logits, clean_fwd.max_logits)) << what;
              const oracle::BwdResult g = run_backward(c.mask, p, cfg);
              EXPECT_TRUE(same_bits(g.dq, clean_bwd.dq)) << "dq: " << what;
              EXPECT_TRUE(same_bits(g.dk, clean_bwd.dk)) << "dk: " << what;
              EXPECT_TRUE(same_bits(g.dv, clean_bwd.dv)) << "dv: " << what;
            }
          }
    }
}

// The issue's case: causal 128, NaN in key row 5. Rows 5..127 NaN out and lse; rows 0..4
// exactly as without the NaN. Backward: dq of rows 5.. NaN, of rows 0..4 clean; every key is
// seen by row 127, so every dk/dv row is NaN.
TEST(NanPropagation, NanKeyRowOfTheIssue) {
  const Mask mask = masks::causal(128, 128);
  for (DType in : {DType::kF64, DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(in));
    const Config cfg = config(in);
    const oracle::Problem clean = problem(mask, cfg);
    oracle::Problem p = clean;
    for (std::int64_t c = 0; c < kD; ++c) poke(p, Where::kK, 5, kNaN, c);
    const oracle::FwdResult a = run_forward(mask, clean, cfg), b = run_forward(mask, p, cfg);
    for (std::int64_t i = 0; i < 128; ++i)
      for (std::int64_t h = 0; h < kHq; ++h) {
        const std::size_t r = std::size_t(i * kHq + h);
        if (i >= 5) {
          EXPECT_TRUE(std::isnan(b.lse[r])) << "row " << i;
          for (std::int64_t e = 0; e < kD; ++e) EXPECT_TRUE(std::isnan(b.out[r * kD + e]));
        } else {
          EXPECT_EQ(b.lse[r], a.lse[r]) << "row " << i;
          for (std::int64_t e = 0; e < kD; ++e) EXPECT_EQ(b.out[r * kD + e], a.out[r * kD + e]);
        }
      }
    EXPECT_TRUE(std::isnan(b.max_logits[0]) && std::isnan(b.max_logits[1]));
    const oracle::BwdResult ga = run_backward(mask, clean, cfg), gb = run_backward(mask, p, cfg);
    for (std::int64_t i = 0; i < 128 * kHq * kD; ++i) {
      const std::int64_t row = i / (kHq * kD);
      if (row >= 5)
        EXPECT_TRUE(std::isnan(gb.dq[std::size_t(i)])) << "dq row " << row;
      else
        EXPECT_EQ(gb.dq[std::size_t(i)], ga.dq[std::size_t(i)]) << "dq row " << row;
    }
    EXPECT_EQ(count_nan(gb.dk), std::int64_t(gb.dk.size()));
    EXPECT_EQ(count_nan(gb.dv), std::int64_t(gb.dv.size()));
  }
}

// A row that sees nothing keeps out 0 and lse -inf whatever its q holds.
TEST(NanPropagation, RowsThatSeeNothingStayEmpty) {
  const Mask mask = masks::causal(70, 20);  // rows 0..49 see nothing
  const Config cfg = config(DType::kF32);
  oracle::Problem p = problem(mask, cfg);
  for (std::int64_t i = 0; i < 50; ++i) poke(p, Where::kQ, i, i % 2 ? kNaN : kInf);
  const oracle::FwdResult got = run_forward(mask, p, cfg);
  for (std::int64_t r = 0; r < 50 * kHq; ++r) {
    EXPECT_EQ(got.lse[std::size_t(r)], -kInf);
    for (std::int64_t e = 0; e < kD; ++e) EXPECT_EQ(got.out[std::size_t(r * kD + e)], 0.0);
  }
  check_forward(mask, p, cfg);
  check_backward(mask, p, cfg);
}

// max_logits: NaN for a head with a NaN row (a NaN/inf in q, k or v it reads), finite for the
// other head; softcap does not hide an inf (the rule is on inputs: tanh(inf) would be finite).
TEST(NanPropagation, MaxLogitsAndSoftcap) {
  const Mask mask = masks::causal(150, 150);
  for (double cap : {0.0, 5.0}) {
    Config cfg = config(DType::kF32);
    cfg.opts.softcap = cap;
    oracle::Problem p = problem(mask, cfg);
    p.q[std::size_t((80 * kHq + 1) * kD + 2)] = kInf;  // head 1 of row 80
    const oracle::FwdResult got = run_forward(mask, p, cfg);
    EXPECT_FALSE(std::isnan(got.max_logits[0])) << "softcap " << cap;
    EXPECT_TRUE(std::isnan(got.max_logits[1])) << "softcap " << cap;
    EXPECT_TRUE(std::isnan(got.lse[80 * kHq + 1])) << "softcap " << cap;
    check_forward(mask, p, cfg, "softcap " + std::to_string(cap));
    check_backward(mask, p, cfg, "softcap " + std::to_string(cap));
    oracle::Problem pv = problem(mask, cfg);
    poke(pv, Where::kV, 60, kNaN);
    const oracle::FwdResult gv = run_forward(mask, pv, cfg);
    EXPECT_TRUE(std::isnan(gv.max_logits[0]) && std::isnan(gv.max_logits[1]));  // kv head 0
    EXPECT_TRUE(std::isnan(gv.lse[60 * kHq]));
    check_forward(mask, pv, cfg, "v, softcap " + std::to_string(cap));
  }
}

// Sink: a NaN or +inf sink logit poisons every row it joins (all rows for "sh", its row for
// "ssh"), rows that see no key included; -inf is an absent sink; dsink follows.
TEST(NanPropagation, Sink) {
  const Mask mask = masks::causal(90, 70);  // rows 0..19 see only the sink
  for (SinkLayout layout : {SinkLayout::kSH, SinkLayout::kSSH})
    for (double x : {kNaN, kInf, -kInf}) {
      Config cfg = config(DType::kF64);
      cfg.opts.sink_layout = layout;
      oracle::Problem p = problem(mask, cfg, 2);
      p.sink[layout == SinkLayout::kSH ? 0 : std::size_t((10 * 2 + 1) * kHq)] = x;  // head 0
      const std::string what = std::string(layout == SinkLayout::kSH ? "sh" : "ssh") +
                               " sink = " + std::to_string(x);
      check_forward(mask, p, cfg, what);
      check_backward(mask, p, cfg, what);
      const oracle::FwdResult got = run_forward(mask, p, cfg);
      EXPECT_EQ(std::isnan(got.lse[10 * kHq]), x != -kInf) << what;
      EXPECT_FALSE(std::isnan(got.lse[10 * kHq + 1])) << what;
    }
  // A NaN dout of a row that sees only the sink: dsink NaN (Delta = out . dout), dq 0.
  Config cfg = config(DType::kF64);
  oracle::Problem p = problem(mask, cfg, 1);
  poke(p, Where::kDout, 3, kNaN);
  check_backward(mask, p, cfg, "dout NaN on a sink-only row");
}

// Accumulating into a given out/lse (slices sharing rows, distributed stages): a NaN given lse
// stays NaN whether or not the call touches the row; a given -inf (empty) side changes nothing.
TEST(NanPropagation, AccumulateKeepsNanAndIgnoresEmptySides) {
  const Mask first(64, 64, {Slice{{0, 40}, {0, 30}, MaskType::kFull}});
  const Mask second(64, 64, {Slice{{20, 64}, {30, 64}, MaskType::kFull}});
  for (DType in : {DType::kF64, DType::kF32}) {
    Config cfg = config(in);
    cfg.max_logits = false;
    oracle::Problem p = problem(first, cfg);
    poke(p, Where::kK, 7, kNaN);  // seen by rows 0..39 in the first call only
    FwdCall call(p, cfg);
    attn_forward(first, call.args(), cfg.opts);
    Config acc = cfg;
    acc.opts.accumulate = true;
    attn_forward(second, call.args(), acc.opts);
    const oracle::FwdResult got = call.result();
    const Mask both(64, 64, {first[0], second[0]});
    const oracle::FwdResult want = oracle::forward(both, p);
    EXPECT_LE(rel_err(got.out, want.out), tolerance(cfg.compute(), cfg.out)) << dtype_name(in);
    EXPECT_LE(lse_err(got.lse, want.lse), tolerance(cfg.compute(), cfg.compute()));
    for (std::int64_t i = 0; i < 64; ++i)
      EXPECT_EQ(std::isnan(got.lse[std::size_t(i * kHq)]), i < 40) << "row " << i;
  }
}

// A head-major fp32 V with whole vectors is read in place unless it holds a non-finite value:
// that path must sanitise too.
TEST(NanPropagation, InPlaceLayout) {
  const Mask mask(200, 200, {Slice{{0, 100}, {0, 100}, MaskType::kCausal},
                            Slice{{120, 200}, {120, 200}, MaskType::kCausal}});
  Config cfg = config(DType::kF32);
  cfg.layout = Layout::kHeadMajor;
  const oracle::Problem clean = problem(mask, cfg);
  for (std::int64_t key : {110, 150}) {
    oracle::Problem p = clean;
    poke(p, Where::kV, key, kNaN);
    check_forward(mask, p, cfg, "v key " + std::to_string(key));
    check_backward(mask, p, cfg, "v key " + std::to_string(key));
  }
  oracle::Problem p = clean;
  poke(p, Where::kV, 110, kNaN);
  EXPECT_TRUE(same_bits(run_forward(mask, p, cfg).out, run_forward(mask, clean, cfg).out));
}

// Seeded sweep: random masks, a few random pokes of every kind, against the oracle.
TEST(NanPropagation, RandomSweep) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 12; ++it) {
    const std::int64_t nq = std::uniform_int_distribution<std::int64_t>(1, 200)(rng);
    const std::int64_t nk = std::uniform_int_distribution<std::int64_t>(1, 200)(rng);
    const Mask mask = random_mask(rng, nq, nk, 6);
    const Config cfg = config(it % 2 ? DType::kF32 : DType::kF64);
    oracle::Problem p = random_problem(rng, nq, nk, kHq, kHkv, kD, cfg);
    for (int n = 0; n < 3; ++n) {
      const Where w = Where(std::uniform_int_distribution<int>(0, 3)(rng));
      const std::int64_t rows = w == Where::kQ || w == Where::kDout ? nq : nk;
      const double vals[] = {kNaN, kInf, -kInf};
      poke(p, w, std::uniform_int_distribution<std::int64_t>(0, rows - 1)(rng),
           vals[std::uniform_int_distribution<int>(0, 2)(rng)],
           std::uniform_int_distribution<std::int64_t>(0, kD - 1)(rng));
    }
    check_forward(mask, p, cfg, "sweep " + std::to_string(it));
    check_backward(mask, p, cfg, "sweep " + std::to_string(it));
  }
}

}  // namespace
}  // namespace magi::testing
