// The oracle checked against hand-computed answers and against the docs/semantics.md §1 visibility
// table written out again here, then its backward against central differences of its forward: the
// yardstick itself must be beyond doubt before it judges a backend.
#include "oracle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "attn_case.h"
#include "seed.h"

namespace magi {
namespace {

using oracle::Problem;
constexpr double kInf = std::numeric_limits<double>::infinity();

Problem zeros(std::int64_t nq, std::int64_t nk, std::int64_t hq, std::int64_t hkv,
              std::int64_t d) {
  Problem p;
  p.num_q = nq;
  p.num_k = nk;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = d;
  p.q.assign(nq * hq * d, 0.0);
  p.k.assign(nk * hkv * d, 0.0);
  p.v.assign(nk * hkv * d, 0.0);
  p.dout.assign(nq * hq * d, 0.0);
  return p;
}

Mask full(std::int64_t nq, std::int64_t nk) {
  return Mask(nq, nk, {Slice{{0, nq}, {0, nk}, MaskType::kFull}});
}

double logaddexp(double a, double b) {
  const double m = std::max(a, b);
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

TEST(Oracle, SingleKeyGivesItsValue) {
  Problem p = zeros(1, 1, 1, 1, 8);
  for (int e = 0; e < 8; ++e) {
    p.q[e] = 0.5 * e;
    p.k[e] = 1.0 - 0.25 * e;
    p.v[e] = 3.0 + e;
  }
  const auto r = oracle::forward(full(1, 1), p);
  double s = 0;
  for (int e = 0; e < 8; ++e) s += p.q[e] * p.k[e];
  s /= std::sqrt(8.0);
  for (int e = 0; e < 8; ++e) EXPECT_DOUBLE_EQ(r.out[e], 3.0 + e);
  EXPECT_DOUBLE_EQ(r.lse[0], s);
  EXPECT_DOUBLE_EQ(r.max_logits[0], s);
}

TEST(Oracle, EqualScoresAverageTheValues) {
  Problem p = zeros(1, 2, 1, 1, 8);
  for (int e = 0; e < 8; ++e) {
    p.k[e] = 1.0 + e;  // q = 0: both scores are 0 whatever the keys
    p.v[e] = 2.0;
    p.v[8 + e] = -4.0 + e;
  }
  const auto r = oracle::forward(full(1, 2), p);
  for (int e = 0; e < 8; ++e) EXPECT_DOUBLE_EQ(r.out[e], (2.0 + (-4.0 + e)) / 2);
  EXPECT_DOUBLE_EQ(r.lse[0], std::log(2.0));
}

TEST(Oracle, EmptyRowGivesZeroAndMinusInf) {
  Problem p = zeros(2, 1, 1, 1, 8);
  for (int e = 0; e < 8; ++e) p.v[e] = 1.0;
  const Mask mask(2, 1, {Slice{{0, 1}, {0, 1}, MaskType::kFull}});
  const auto r = oracle::forward(mask, p);
  EXPECT_DOUBLE_EQ(r.lse[0], 0.0);
  EXPECT_EQ(r.lse[1], -kInf);
  for (int e = 0; e < 8; ++e) EXPECT_EQ(r.out[8 + e], 0.0);

  const auto none = oracle::forward(Mask(2, 0, {}), zeros(2, 0, 1, 1, 8));
  EXPECT_EQ(none.lse[0], -kInf);
  EXPECT_EQ(none.max_logits[0], -kInf);
}

TEST(Oracle, SinkShiftsLseByLogaddexp) {
  Problem p = zeros(2, 1, 1, 1, 8);
  p.q[0] = 2.0;
  p.k[0] = std::sqrt(8.0);  // score 2
  for (int e = 0; e < 8; ++e) p.v[e] = 1.0 + e;
  p.sink_len = 2;
  p.sink = {0.5, -1.0};
  const Mask mask(2, 1, {Slice{{0, 1}, {0, 1}, MaskType::kFull}});  // row 1 sees nothing
  const auto r = oracle::forward(mask, p);
  const double lse_sink = logaddexp(0.5, -1.0);
  EXPECT_NEAR(r.lse[0], logaddexp(2.0, lse_sink), 1e-15);
  for (int e = 0; e < 8; ++e) EXPECT_NEAR(r.out[e], (1.0 + e) * std::exp(2.0 - r.lse[0]), 1e-14);
  EXPECT_NEAR(r.lse[1], lse_sink, 1e-15);
  for (int e = 0; e < 8; ++e) EXPECT_EQ(r.out[8 + e], 0.0);
  EXPECT_DOUBLE_EQ(r.max_logits[0], 2.0);  // the sink is not a logit of q.k
}

TEST(Oracle, PerTokenSinkUsesItsRow) {
  Problem p = zeros(2, 1, 2, 1, 8);
  p.sink_len = 1;
  p.sink_layout = SinkLayout::kSSH;
  p.sink = {0.0, 1.0, 2.0, 3.0};  // [row, 1, head]
  const auto r = oracle::forward(full(2, 1), p);
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 2; ++h)
      EXPECT_NEAR(r.lse[i * 2 + h], logaddexp(0.0, p.sink[i * 2 + h]), 1e-15);
}

TEST(Oracle, SoftcapBendsLogitsButNotMaxLogits) {
  Problem p = zeros(2, 1, 2, 1, 8);
  p.softcap = 2.0;
  p.scale = 1.0;
  p.k[0] = 1.0;
  p.q[0] = 3.0;       // row 0 head 0: s = 3
  p.q[8] = -1.0;      // row 0 head 1: s = -1
  p.q[16] = 5.0;      // row 1 head 0: s = 5
  p.q[24] = -0.5;     // row 1 head 1: s = -0.5
  const auto r = oracle::forward(full(2, 1), p);
  EXPECT_DOUBLE_EQ(r.lse[0], 2.0 * std::tanh(1.5));
  EXPECT_DOUBLE_EQ(r.lse[3], 2.0 * std::tanh(-0.25));
  EXPECT_DOUBLE_EQ(r.max_logits[0], 5.0);
  EXPECT_DOUBLE_EQ(r.max_logits[1], -0.5);
}

TEST(Oracle, GqaQueryHeadsShareTheirKvHead) {
  Problem p = zeros(1, 1, 4, 2, 8);
  for (int e = 0; e < 8; ++e) {
    p.v[e] = 1.0;       // kv head 0
    p.v[8 + e] = 2.0;   // kv head 1
  }
  const auto r = oracle::forward(full(1, 1), p);
  for (int h = 0; h < 4; ++h) EXPECT_DOUBLE_EQ(r.out[h * 8], h < 2 ? 1.0 : 2.0);
}

// docs/semantics.md §1 table, independent of src/mask: local (i, j) in a sq x sk slice.
bool spec_visible(MaskType t, std::int64_t i, std::int64_t j, std::int64_t sq, std::int64_t sk) {
  switch (t) {
    case MaskType::kFull: return true;
    case MaskType::kCausal: return j <= i + (sk - sq);
    case MaskType::kInvCausal: return j >= i;
    case MaskType::kBiCausal: return i <= j && j <= i + (sk - sq);
  }
  return false;
}

TEST(Oracle, VisibilityFollowsTheSpecTable) {
  // q = 0 and one-hot values make out[i][j] = 1/count_i on exactly the visible keys.
  for (int t = 0; t < 4; ++t) {
    for (auto [sq, sk] : {std::pair{3, 5}, {4, 4}, {5, 3}, {1, 1}}) {
      const std::int64_t q0 = 2, k0 = 1;  // slice offset inside a larger matrix
      const MaskType type = MaskType(t);
      Problem p = zeros(q0 + sq + 1, k0 + sk + 2, 1, 1, 8);
      for (std::int64_t j = 0; j < p.num_k; ++j) p.v[j * 8 + j] = 1.0;
      const Mask mask(p.num_q, p.num_k, {Slice{{q0, q0 + sq}, {k0, k0 + sk}, type}});
      const auto r = oracle::forward(mask, p);
      auto vis = [&](std::int64_t i, std::int64_t j) {
        return i >= 0 && i < sq && j >= 0 && j < sk && spec_visible(type, i, j, sq, sk);
      };
      ASSERT_LE(p.num_k, 8);  // one-hot values need a column per key
      for (std::int64_t q = 0; q < p.num_q; ++q) {
        std::int64_t count = 0;
        for (std::int64_t k = 0; k < p.num_k; ++k) count += vis(q - q0, k - k0);
        for (std::int64_t k = 0; k < p.num_k; ++k)
          EXPECT_DOUBLE_EQ(r.out[q * 8 + k], vis(q - q0, k - k0) ? 1.0 / double(count) : 0.0)
              << mask_type_name(type) << " sq " << sq << " sk " << sk << " q " << q << " k " << k;
        EXPECT_EQ(std::isinf(r.lse[q]), count == 0) << "row " << q;
      }
    }
  }
}

// L = sum(out * dout) is what the backward differentiates.
double loss(const Mask& mask, const Problem& p) {
  const auto r = oracle::forward(mask, p);
  double l = 0;
  for (std::size_t n = 0; n < r.out.size(); ++n) l += r.out[n] * p.dout[n];
  return l;
}

void check_finite_differences(const Mask& mask, Problem p) {
  const auto g = oracle::backward(mask, p);
  const double eps = 1e-5;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    ASSERT_EQ(x.size(), grad.size()) << name;
    std::vector<double> fd(x.size());
    for (std::size_t n = 0; n < x.size(); ++n) {
      const double keep = x[n];
      x[n] = keep + eps;
      const double up = loss(mask, p);
      x[n] = keep - eps;
      const double down = loss(mask, p);
      x[n] = keep;
      fd[n] = (up - down) / (2 * eps);
    }
    EXPECT_LE(testing::rel_err(grad, fd), 1e-7) << name;
  };
  check(p.q, g.dq, "dq");
  check(p.k, g.dk, "dk");
  check(p.v, g.dv, "dv");
  check(p.sink, g.dsink, "dsink");
}

Mask mixed_mask() {
  // Rows 0-1 see nothing; rows 2-8 see a causal document plus global keys; overlapping q
  // ranges across slices; a bi-causal band on the rest.
  return Mask(12, 14, {Slice{{2, 9}, {3, 9}, MaskType::kCausal},
                       Slice{{4, 12}, {0, 2}, MaskType::kFull},
                       Slice{{9, 12}, {9, 14}, MaskType::kBiCausal},
                       Slice{{2, 5}, {10, 13}, MaskType::kInvCausal}});
}

TEST(Oracle, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(testing::test_seed());
  for (SinkLayout layout : {SinkLayout::kSH, SinkLayout::kSSH}) {
    for (double softcap : {0.0, 1.5}) {
      testing::Config cfg;
      cfg.opts.sink_layout = layout;
      cfg.opts.softcap = softcap;
      Problem p = testing::random_problem(rng, 12, 14, 4, 2, 8, cfg, 2);
      SCOPED_TRACE(::testing::Message() << "sink " << int(layout) << " softcap " << softcap);
      check_finite_differences(mixed_mask(), p);
    }
  }
}

TEST(Oracle, SampledRowsMatchTheDenseResult) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 4; ++it) {
    testing::Config cfg;
    cfg.opts.softcap = it % 2 ? 2.0 : 0.0;
    const Mask mask = testing::random_mask(rng, 40, 50, 6);
    const Problem p = testing::random_problem(rng, 40, 50, 4, 2, 16, cfg, it);
    const auto fwd = oracle::forward(mask, p);
    const auto bwd = oracle::backward(mask, p);
    const std::vector<std::int64_t> q_rows{0, 7, 39, 13}, k_rows{49, 0, 21};
    const auto s = oracle::sampled(mask, p, q_rows, k_rows);
    const std::int64_t hq = 4, hkv = 2, d = 16;
    using testing::pick_rows;
    const std::string note = testing::seed_note(seed) + " iteration " + std::to_string(it);
    EXPECT_LE(testing::rel_err(s.out, pick_rows(fwd.out, q_rows, hq * d)), 1e-14) << note;
    EXPECT_LE(testing::rel_err(s.lse, pick_rows(fwd.lse, q_rows, hq)), 1e-14) << note;
    EXPECT_LE(testing::rel_err(s.dq, pick_rows(bwd.dq, q_rows, hq * d)), 1e-13) << note;
    EXPECT_LE(testing::rel_err(s.dk, pick_rows(bwd.dk, k_rows, hkv * d)), 1e-13) << note;
    EXPECT_LE(testing::rel_err(s.dv, pick_rows(bwd.dv, k_rows, hkv * d)), 1e-13) << note;
  }
}

TEST(Oracle, RelErrorRequiresMatchingNonFinitePositions) {
  const double nan = std::nan("");
  const std::vector<double> a{1.0, -kInf, nan, 2.0}, b{1.5, -kInf, nan, 2.0};
  EXPECT_DOUBLE_EQ(testing::rel_err(a, b), 0.25);
  EXPECT_EQ(testing::rel_err({1.0, nan}, {1.0, 1.0}), kInf);
  EXPECT_EQ(testing::rel_err({1.0, kInf}, {1.0, -kInf}), kInf);
  EXPECT_EQ(testing::rel_err({-kInf}, {0.0}), kInf);
  EXPECT_EQ(testing::rel_err({0.0, 0.0}, {0.0, 0.0}), 0.0);
}

}  // namespace
}  // namespace magi
