// Core pieces: half-precision conversions bit-exact against the compiler's own _Float16 and a
// bf16 rounding table; tensor views; the error macro's message format.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "magi/dtype.h"
#include "magi/error.h"
#include "magi/tensor.h"
#include "seed.h"

namespace magi {
namespace {

using ::testing::HasSubstr;

TEST(DType, HalfToFloatIsExactForEveryPattern) {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    _Float16 h;
    const std::uint16_t b16 = std::uint16_t(bits);
    std::memcpy(&h, &b16, 2);
    const float expect = float(h);
    const float got = to_float(F16{b16});
    if (std::isnan(expect)) {
      ASSERT_TRUE(std::isnan(got)) << bits;
      continue;
    }
    ASSERT_EQ(got, expect) << "pattern " << bits;
    ASSERT_EQ(to_f16(got).bits, b16) << "round trip of pattern " << bits;
  }
}

TEST(DType, FloatToHalfRoundsLikeTheCompiler) {
  const std::uint64_t seed = testing::test_seed();
  std::mt19937 rng{std::uint32_t(seed)};
  for (int it = 0; it < 2000000; ++it) {
    std::uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    std::uint16_t expect;
    std::memcpy(&expect, &h, 2);
    ASSERT_EQ(to_f16(f).bits, expect) << "float bits " << u << " " << testing::seed_note(seed);
  }
  EXPECT_TRUE(std::isnan(to_float(to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, BF16RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_float(to_bf16(1.0f + 1.0f / 256)), 1.0f);              // tie -> even
  EXPECT_EQ(to_float(to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // tie -> even (up)
  EXPECT_EQ(to_float(to_bf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(DType, Names) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("float64"), DType::kF64);
  EXPECT_EQ(dtype_name(DType::kF16), "fp16");
  try {
    dtype_from_name("int8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown dtype 'int8'"));
  }
}

TEST(Tensor, ViewsAndDescriptions) {
  float buf[24];
  TensorView t = make_view(buf, DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.describe(), "[2, 3, 4] fp32 strides (12, 4, 1) cpu");
  t.stride[0] = 13;
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_THROW(make_view(buf, DType::kF32, {1, 2, 3, 4, 5}), Error);
  EXPECT_THROW(make_view(buf, DType::kF32, {-1}), Error);
}

TEST(Error, MessageCarriesLocationAndExpression) {
  try {
    const int d = 100;
    MAGI_CHECK(d % 8 == 0, "q: head dim ", d, " is not a multiple of 8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("q: head dim 100 is not a multiple of 8"));
    EXPECT_THAT(e.what(), HasSubstr("d % 8 == 0"));
    EXPECT_THAT(e.what(), HasSubstr("core_test.cc:"));
  }
}

}  // namespace
}  // namespace magi
