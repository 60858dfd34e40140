// Strided tensor access with dtype conversion: the only place the CPU kernels touch user
// memory. Rows (last dim, stride 1) are copied into or out of contiguous compute-type scratch
// once per call or per task, never inside the tile loops, so strides and bf16/fp16 cost
// O(D) per row against the O(D x keys) arithmetic of that row.
#pragma once

#include "isa.h"

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "magi/dtype.h"
#include "magi/tensor.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {

// Byte address of element idx (as many indices as given, leading dims first).
inline char* element(const TensorView& t, std::initializer_list<std::int64_t> idx) {
  std::int64_t offset = 0;
  int d = 0;
  for (std::int64_t i : idx) offset += i * t.stride[d++];
  return static_cast<char*>(t.data) + offset * dtype_size(t.dtype);
}

template <typename T, typename S>
inline T widen(S x) {
  if constexpr (std::is_same_v<S, BF16> || std::is_same_v<S, F16>)
    return T(to_float(x));
  else
    return T(x);
}

template <typename S, typename T>
inline S narrow(T x) {
  if constexpr (std::is_same_v<S, BF16>)
    return to_bf16(float(x));
  else if constexpr (std::is_same_v<S, F16>)
    return to_f16(float(x));
  else
    return S(x);
}

// Calls f(tag) with a value of the storage type of t.
template <typename F>
inline void visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(float{}); break;
    case DType::kF64: f(double{}); break;
    case DType::kBF16: f(BF16{}); break;
    case DType::kF16: f(F16{}); break;
  }
}

// dst[0, n) = mult * row, where row starts at element `at`.
template <typename T>
inline void load_row(const TensorView& t, std::initializer_list<std::int64_t> at, std::int64_t n,
                     T mult, T* dst) {
  const char* src = element(t, at);
  visit_dtype(t.dtype, [&](auto tag) {
    using S = decltype(tag);
    const S* p = reinterpret_cast<const S*>(src);
    for (std::int64_t i = 0; i < n; ++i) dst[i] = mult * widen<T>(p[i]);
  });
}

// row = mult * src, or row += mult * src (read in its own dtype, summed in T).
template <typename T>
inline void store_row(const TensorView& t, std::initializer_list<std::int64_t> at,
                      std::int64_t n, T mult, const T* src, bool add) {
  char* dst = element(t, at);
  visit_dtype(t.dtype, [&](auto tag) {
    using S = decltype(tag);
    S* p = reinterpret_cast<S*>(dst);
    if (add)
      for (std::int64_t i = 0; i < n; ++i) p[i] = narrow<S>(widen<T>(p[i]) + mult * src[i]);
    else
      for (std::int64_t i = 0; i < n; ++i) p[i] = narrow<S>(mult * src[i]);
  });
}

template <typename T>
inline T load_scalar(const TensorView& t, std::initializer_list<std::int64_t> at) {
  T x{};
  load_row<T>(t, at, 1, T(1), &x);
  return x;
}

template <typename T>
inline void store_scalar(const TensorView& t, std::initializer_list<std::int64_t> at, T x) {
  store_row<T>(t, at, 1, T(1), &x, false);
}

}  // namespace magi::kernels::cpu::MAGI_CPU_NS
