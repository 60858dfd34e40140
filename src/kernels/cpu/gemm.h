// The one matrix product of the CPU kernels: C (+)= A * B on small packed tiles, register
// blocked as kMicroRows rows x 2 vectors: 8 with AVX-512 (16 accumulators of its 32 registers;
// per step of k, 2 loads of B and 8 broadcasts of A feed 16 FMAs), 6 with AVX2 (12 accumulators,
// 2 of B and a broadcast: 15 of its 16 registers; 8 rows spilled there, 2.4x slower). A is read
// one element at a time through two strides, so P and P^T (backward's dV = P^T dO) are both A
// operands without a copy.
#pragma once

#include "isa.h"

#include <cstdint>

#include "simd.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {

inline constexpr int kMicroRows = kVecBytes == 64 ? 8 : 6;

// C[kRows x kVecs*W] (+)= A[kRows x k] * B[k x kVecs*W]; A(i, p) = a[i*a_row + p*a_col].
// Never inlined: inside the forward's tile loop (P V) g++ ran out of integer registers and
// reloaded the row offsets of A from the stack in the inner loop (4 loads per 12 FMAs on
// AVX2), where the function alone keeps each row's pointer in a register.
template <typename T, int kRows, int kVecs, bool kAccumulate>
[[gnu::noinline]] void micro_kernel(std::int64_t k, const T* a, std::int64_t a_row,
                                    std::int64_t a_col, const T* b, std::int64_t ldb, T* c,
                                    std::int64_t ldc) {
  using S = Simd<T>;
  using V = typename S::V;
  V acc[kRows][kVecs];
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v)
      acc[i][v] = kAccumulate ? S::load(c + i * ldc + v * S::kWidth) : V{};
  for (std::int64_t p = 0; p < k; ++p) {
    V bv[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) bv[v] = S::loadu(b + p * ldb + v * S::kWidth);
    const T* ap = a + p * a_col;
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const V av = S::splat(ap[i * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[i][v] = S::fma(av, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) S::store(c + i * ldc + v * S::kWidth, acc[i][v]);
}

// sum_p a[p] * b[p] rounded exactly like one lane of the micro-kernel's products.
template <typename T>
inline T dot_like_gemm(const T* a, const T* b, std::int64_t n) {
  T acc = 0;
  for (std::int64_t p = 0; p < n; ++p) acc = Simd<T>::fma_scalar(a[p], b[p], acc);
  return acc;
}

template <typename T, int kVecs, bool kAccumulate>
inline void row_block(int rows, std::int64_t k, const T* a, std::int64_t a_row,
                      std::int64_t a_col, const T* b, std::int64_t ldb, T* c, std::int64_t ldc) {
  switch (rows) {
#define MAGI_ROWS_CASE(R)                                                            \
  case R:                                                                            \
    micro_kernel<T, R, kVecs, kAccumulate>(k, a, a_row, a_col, b, ldb, c, ldc);      \
    break;
    MAGI_ROWS_CASE(1)
    MAGI_ROWS_CASE(2)
    MAGI_ROWS_CASE(3)
    MAGI_ROWS_CASE(4)
    MAGI_ROWS_CASE(5)
    MAGI_ROWS_CASE(6)
    MAGI_ROWS_CASE(7)
    MAGI_ROWS_CASE(8)
#undef MAGI_ROWS_CASE
    default:
      break;
  }
}

// C[m x n] (+)= A[m x k] * B[k x n]. n is a multiple of the vector width; C rows are vector
// aligned (scratch); B rows may lie anywhere (the caller's own rows when already head-major,
// see Rows in pack.h). Column blocks outside, rows inside, so a block of B (k x 2W: 16 KiB at
// k = 128, fp32) stays in L1 while all rows of A stream by.
template <typename T, bool kAccumulate>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t a_row,
          std::int64_t a_col, const T* b, std::int64_t ldb, T* c, std::int64_t ldc) {
  constexpr int kW = Simd<T>::kWidth;
  std::int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW)
    for (std::int64_t i = 0; i < m; i += kMicroRows)
      row_block<T, 2, kAccumulate>(int(m - i < kMicroRows ? m - i : kMicroRows), k,
                                   a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j,
                                   ldc);
  if (j < n)
    for (std::int64_t i = 0; i < m; i += kMicroRows)
      row_block<T, 1, kAccumulate>(int(m - i < kMicroRows ? m - i : kMicroRows), k,
                                   a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j,
                                   ldc);
}

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
