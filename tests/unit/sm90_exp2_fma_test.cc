// 2^x on the FMA pipe (src/kernels/sm90/exp2_fma.h), which the sm90 forward's softmax uses for
// some of its exponentials: as accurate as the MUFU's ex2.approx over the range a softmax
// feeds it (x <= 0), exactly 0 for masked cells and below the normal range, exactly 1 at the
// row's maximum, exact powers of two at integers, NaN kept. The device runs the same code
// (host/device header, explicit fmaf).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/sm90/exp2_fma.h"

namespace magi::kernels::sm90::detail {
namespace {

TEST(Sm90Exp2Fma, RelativeErrorWithinTheMufuClassOnTheSoftmaxRange) {
  // Every float in [-8, 0] one in 97 (about 10 M values: f covers [-0.5, 0.5] many times with
  // every exponent of f), and a coarser sweep down to -126.
  double worst = 0.0;
  float worst_x = 0.f;
  auto check = [&](float x) {
    const double want = std::exp2(double(x));
    const double got = double(exp2_fma(x));
    const double rel = std::fabs(got / want - 1.0);
    if (rel > worst) worst = rel, worst_x = x;
  };
  for (std::uint32_t b = std::bit_cast<std::uint32_t>(-0.f);
       b <= std::bit_cast<std::uint32_t>(-8.f); b += 97)
    check(std::bit_cast<float>(b));
  for (float x = -126.f; x <= 0.f; x += 0.0078125f * 1.37f) check(x);
  // ex2.approx.f32: at most 2^-22 (2.4e-7) relative (PTX ISA); the polynomial with fp32 Horner
  // measured 1.9e-7 on a dense grid of [-0.5, 0.5].
  EXPECT_LE(worst, 2.4e-7) << "at x = " << worst_x;
  EXPECT_GT(worst, 0.0);  // the sweep ran
}

TEST(Sm90Exp2Fma, MaskedAndUnderflowingGiveExactlyZero) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {-inf, -1e30f, -1000.f, -128.f, -127.f, -126.9f, -126.51f}) {
    const float y = exp2_fma(x);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(y), 0u) << "x = " << x << " gave " << y;  // +0, not -0
  }
  // From -126.5 on, the result is 2^-126 times 2^f: normal at -126, never 0 above -126.5.
  EXPECT_EQ(exp2_fma(-126.f), std::ldexp(1.f, -126));
  EXPECT_GT(exp2_fma(-126.49f), 0.f);
}

TEST(Sm90Exp2Fma, IntegersAreExactPowersOfTwoAndZeroIsOne) {
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exp2_fma(0.f)), std::bit_cast<std::uint32_t>(1.f));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exp2_fma(-0.f)), std::bit_cast<std::uint32_t>(1.f));
  for (int n = -126; n <= 0; ++n) EXPECT_EQ(exp2_fma(float(n)), std::ldexp(1.f, n)) << n;
}

TEST(Sm90Exp2Fma, NanStaysNanAndPlusInfIsNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(exp2_fma(nan)));
  EXPECT_TRUE(std::isnan(exp2_fma(-nan)));
  EXPECT_TRUE(std::isnan(exp2_fma(std::numeric_limits<float>::infinity())));
  EXPECT_EQ(max_keep_nan(-200.f, -127.f), -127.f);
  EXPECT_EQ(max_keep_nan(-3.f, -127.f), -3.f);
}

}  // namespace
}  // namespace magi::kernels::sm90::detail
