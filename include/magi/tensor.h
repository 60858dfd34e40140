// A non-owning view of a strided array: what crosses the public API. Strides are in elements;
// backends honour them or reject them with an error naming the tensor (never misread them).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "magi/dtype.h"

namespace magi {

enum class Device : std::uint8_t { kCPU, kCUDA };

struct TensorView {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  int device_idx = 0;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> stride{};

  std::int64_t numel() const;
  std::int64_t size(int d) const { return shape[d]; }
  bool is_contiguous() const;
  std::string describe() const;  // "[8, 4, 128] fp32 strides (512, 128, 1) cpu"

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// A contiguous view of `data` with the given shape.
TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     Device device = Device::kCPU);

}  // namespace magi
