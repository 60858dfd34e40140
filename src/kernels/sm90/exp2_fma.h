// 2^x for x <= 0 on the FMA pipe (FlashAttention-4's trick): at D 64 the forward's softmax
// needs as many MUFU cycles as its two GEMMs need tensor cycles (66 MUFU.EX2 a 128-key block a
// warp, 8 cycles each on the quarter-SM's 4 lanes), so moving some exponentials to the FP32
// pipe shortens the busier of the two. Host and device: the unit test checks it on the CPU.
//
// x = n + f with n = round(x) (the 1.5 * 2^23 addition), f in [-0.5, 0.5]; 2^f by a degree-5
// polynomial (near-minimax for the relative error with its constant term 1, 1.9e-7 with fp32
// Horner, the MUFU's 2^-22 class), times 2^n built in the exponent field. What the softmax
// needs of it (tests/unit/sm90_exp2_fma_test.cc):
// - x = -inf (a masked cell) and every x <= -127 give exactly +0 (2^n's bits are 0), as
//   ex2.approx.ftz does below 2^-126;
// - NaN stays NaN (the clamp propagates it and 2^f is NaN; the product is NaN);
// - x = 0 gives exactly 1 (the row's maximum: P = 1 exactly, as with the MUFU);
// - +inf gives NaN (only from an infinite logit, whose row is NaN anyway: docs/numerics.md).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MAGI_HD __host__ __device__ __forceinline__
#else
#define MAGI_HD inline
#endif

namespace magi::kernels::sm90::detail {

// max(x, lo) that keeps a NaN x (fmaxf would return lo).
MAGI_HD float max_keep_nan(float x, float lo) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(lo));
  return y;
#else
  return x != x ? x : (x < lo ? lo : x);
#endif
}

MAGI_HD float exp2_fma(float x) {
  x = max_keep_nan(x, -127.f);
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: x + it has round(x) in its low bits
  const float t = x + kRound;
  const float f = x - (t - kRound);  // in [-0.5, 0.5]
  // c0 = 1 exactly (fitted with it fixed): f = 0 gives p = 1, so an integer x gives exactly
  // 2^x, and x = 0 (the row's maximum) gives P = 1, as with the MUFU.
  // Explicit fmaf: the same roundings on the host (the test) and the device.
  float p = 0x1.5bba14p-10f;
  p = fmaf(p, f, 0x1.3cea88p-7f);
  p = fmaf(p, f, 0x1.c6b752p-5f);
  p = fmaf(p, f, 0x1.ebf9bcp-3f);
  p = fmaf(p, f, 0x1.62e42ap-1f);
  p = fmaf(p, f, 1.f);
  // round(x) + 127 in the exponent field: t's low bits hold round(x) (two's complement within
  // the mantissa), shifted up 23 they are its exponent offset; 0 at round(x) = -127.
  return p * std::bit_cast<float>((std::bit_cast<std::uint32_t>(t) << 23) + 0x3f800000u);
}

}  // namespace magi::kernels::sm90::detail

#undef MAGI_HD
