// Fixed-width vectors for the CPU kernels, written with GCC/Clang vector extensions instead of
// intrinsics (FMA aside) so one template serves fp32 and fp64 and any ISA -march picks:
// 64-byte vectors (16 floats, one AVX-512 register) when AVX-512 is on, else 32 bytes. exp is
// ours, not libm's: libm's is scalar, and exp runs once per score cell against 4 * D = 512
// FLOPs at D = 128 (it is still 14% of forward time).
#pragma once

#include "isa.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

namespace magi::kernels::cpu::MAGI_CPU_NS {

#ifdef __AVX512F__
inline constexpr int kVecBytes = 64;
#else
inline constexpr int kVecBytes = 32;
#endif

// 2^f on [-1/2, 1/2] by a degree-5 polynomial, highest coefficient first (near-minimax: 2.6e-7
// relative in fp32 arithmetic, about fp32's rounding). Simd::exp_fast_nonpos and the AMX
// softmax (amx.h).
inline constexpr float kExp2Poly[6] = {1.34004e-3f, 9.676040e-3f, 5.550327e-2f,
                                       2.4022107e-1f, 6.9314721e-1f, 1.00000008f};

template <typename T>
struct Simd {
  using Int = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  typedef T V __attribute__((vector_size(kVecBytes), aligned(kVecBytes)));
  typedef Int VI __attribute__((vector_size(kVecBytes), aligned(kVecBytes)));
  static constexpr int kWidth = kVecBytes / int(sizeof(T));

  // Aligned load/store for scratch (64-byte aligned, rows padded to kWidth); loadu for rows
  // read in place from the caller's tensors.
  static V load(const T* p) { return *reinterpret_cast<const V*>(p); }
  static V loadu(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static void store(T* p, V v) { *reinterpret_cast<V*>(p) = v; }
  static V splat(T x) { return x - V{}; }  // x - 0 == x for every x, so it folds

  // a * b + c rounded once where the ISA has FMA, whatever the optimisation level: `acc +=
  // a * b` is fused only when the compiler chooses to, and the backward needs its dot
  // products to round exactly like fma_scalar() (see Backward::prepare_rows).
  static V fma(V a, V b, V c) {
#if defined(__AVX512F__)
    if constexpr (sizeof(T) == 4)
      return _mm512_fmadd_ps(a, b, c);
    else
      return _mm512_fmadd_pd(a, b, c);
#elif defined(__FMA__)
    if constexpr (sizeof(T) == 4)
      return _mm256_fmadd_ps(a, b, c);
    else
      return _mm256_fmadd_pd(a, b, c);
#else
    return a * b + c;
#endif
  }
  static T fma_scalar(T a, T b, T c) {
#if defined(__AVX512F__) || defined(__FMA__)
    return std::fma(a, b, c);
#else
    return a * b + c;
#endif
  }
  static V max(V a, V b) { return a > b ? a : b; }
  // max(a, lo), a NaN kept: one vmaxps (lo, a), which returns its second operand on NaN (GCC
  // makes a compare and a blend of the same expression in vector form). The zero-masking form
  // on AVX-512 with all lanes on: GCC 12's unmasked one reports -Wmaybe-uninitialized.
  static V floor_at(V a, T lo) {
#if defined(__AVX512F__)
    if constexpr (sizeof(T) == 4) return _mm512_maskz_max_ps(__mmask16(0xffff), splat(lo), a);
#elif defined(__AVX__)
    if constexpr (sizeof(T) == 4) return _mm256_max_ps(splat(lo), a);
#endif
    return a < lo ? splat(lo) : a;
  }

  // Tree reductions (log2(width) shuffles): a serial lane-by-lane reduction is 15 dependent
  // operations per row and key tile, about 4% of forward time in perf.
  static T reduce_max(V v) {
    for_each_stride([&](auto stride) { v = max(v, swap_lanes<stride>(v)); });
    return v[0];
  }
  static T reduce_sum(V v) {
    for_each_stride([&](auto stride) { v += swap_lanes<stride>(v); });
    return v[0];
  }

  // exp(x), meant for x <= 0 (scores minus their row max or lse): exactly 0 below the
  // smallest normal (x < -87.3 for fp32, -708 for fp64), which is how masked cells (-inf)
  // vanish, and +inf above the largest finite result.
  static V exp(V x) {
    const auto underflow = x < ExpConst::kMin;
    const auto overflow = x > ExpConst::kMax;
    V xc = underflow || overflow ? splat(0) : x;
    V n = (xc * ExpConst::kLog2e + ExpConst::kRound) - ExpConst::kRound;  // round to nearest
    VI bits = (__builtin_convertvector(n, VI) + ExpConst::kBias) << ExpConst::kMantissa;
    V scaled = exp_reduced(xc, n) * std::bit_cast<V>(bits);
    scaled = overflow ? splat(std::numeric_limits<T>::infinity()) : scaled;
    return underflow ? splat(0) : scaled;
  }

  // exp(x) for x <= 0 or NaN only (the forward's softmax: scores minus a max at least as
  // large), bit for bit exp() there with less range work: no overflow test, x is not cleared
  // before the reduction (a lane below kMin computes garbage that the final select drops), and
  // 2^n comes from the bits of the rounding sum itself: t = x log2e + (1.5 * 2^mantissa +
  // bias) holds n + bias in its low mantissa bits, so t's bits << mantissa are 2^n's (the
  // rest shifts out), with no float -> int conversion and no bias add.
  static V exp_nonpos(V x) {
    constexpr T kShift = ExpConst::kRound + T(ExpConst::kBias);
    const auto underflow = x < ExpConst::kMin;
    const V t = fma(x, splat(ExpConst::kLog2e), splat(kShift));
    const V n = t - kShift;  // x log2e rounded to nearest, as in exp()
    const V two_n = std::bit_cast<V>(std::bit_cast<VI>(t) << ExpConst::kMantissa);
    return underflow ? splat(0) : exp_reduced(x, n) * two_n;
  }

  // exp(x) for x <= 0 or NaN, fp32 only, to 2.6e-7 relative instead of exp()'s correctly
  // rounded-or-nearly result: the fp32 forward's softmax, where it halves the vector work per
  // score cell (12 operations against 22; docs/benchmarks.md). 2^t for t = x log2e: t = n + f,
  // |f| <= 1/2, 2^f by kExp2Poly, 2^n from the bits of the rounding sum as in exp_nonpos. t is
  // clamped at -127, whose 2^n has all exponent bits clear (0): for t < -126.5 (x < -87.68) the
  // result is exactly 0 (masked cells, -inf, vanish), for t in [-126.5, -126) a subnormal; a NaN
  // stays NaN.
  static V exp_fast_nonpos(V x)
    requires(sizeof(T) == 4)
  {
    constexpr T kShift = ExpConst::kRound + T(ExpConst::kBias);
    V t = x * ExpConst::kLog2e;
    t = floor_at(t, T(-127));
    const V rounded = t + kShift;  // n + bias in the low mantissa bits
    const V f = t - (rounded - kShift);
    V p = fma(splat(kExp2Poly[0]), f, splat(kExp2Poly[1]));
    for (int k = 2; k < 6; ++k) p = fma(p, f, splat(kExp2Poly[k]));
    return p * std::bit_cast<V>(std::bit_cast<VI>(rounded) << ExpConst::kMantissa);
  }

 private:
  // The constants of exp and exp_nonpos: x = n ln2 + r with |r| <= ln2/2 (ln2 in a high part
  // exact in n * kLn2Hi and a low part), exp(r) by Taylor series: degree 7 leaves
  // 0.347^8/8! = 5e-9 < fp32 ulp (6e-8), degree 13 leaves 4e-18 < fp64 ulp (1.1e-16).
  struct ExpConst {
    static constexpr bool kF32 = sizeof(T) == 4;
    static constexpr int kDegree = kF32 ? 7 : 13;
    static constexpr T kLog2e = T(1.4426950408889634);
    static constexpr T kLn2Hi = kF32 ? T(0.693359375) : T(0.693145751953125);
    static constexpr T kLn2Lo = kF32 ? T(-2.12194440e-4) : T(1.4286068203094173e-06);
    static constexpr T kRound = kF32 ? T(12582912.0) : T(6755399441055744.0);  // 1.5 * 2^mant.
    static constexpr T kMin = kF32 ? T(-87.3) : T(-708.3);
    static constexpr T kMax = kF32 ? T(88.7) : T(709.7);
    static constexpr int kMantissa = kF32 ? 23 : 52;
    static constexpr Int kBias = kF32 ? 127 : 1023;
  };
  // exp(x - n ln2) for n = x log2e rounded to an integer.
  static V exp_reduced(V x, V n) {
    const V r = x - n * ExpConst::kLn2Hi - n * ExpConst::kLn2Lo;
    V p = splat(T(1) / factorial(ExpConst::kDegree));
    for (int k = ExpConst::kDegree - 1; k >= 0; --k) p = p * r + T(1) / factorial(k);
    return p;
  }

  // Lane i takes lane i ^ kStride.
  template <int kStride>
  static V swap_lanes(V v) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return __builtin_shufflevector(v, v, (int(I) ^ kStride)...);
    }(std::make_index_sequence<kWidth>());
  }
  // f(integral_constant stride) for stride = width / 2, ..., 2, 1.
  template <typename F>
  static void for_each_stride(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::integral_constant<int, (kWidth >> (I + 1))>{}), ...);
    }(std::make_index_sequence<std::bit_width(unsigned(kWidth)) - 1>());
  }

  static constexpr T factorial(int k) {
    T f = 1;
    for (int i = 2; i <= k; ++i) f *= T(i);
    return f;
  }
};

template <typename T>
inline constexpr T kNegInf = -std::numeric_limits<T>::infinity();

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
