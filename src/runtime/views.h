// Internal: TensorView <-> comm::Rows. The communicator moves contiguous row buffers, so every
// tensor the runtime sends or receives must be contiguous; this is checked once per call here.
#pragma once

#include <cstdint>
#include <string>

#include "magi/comm.h"
#include "magi/error.h"
#include "magi/tensor.h"

namespace magi::runtime::detail {

// Elements per row (product of all dims but the first), valid for zero-row tensors too.
inline std::int64_t row_elems(const TensorView& t) {
  std::int64_t n = 1;
  for (int d = 1; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

inline comm::Rows rows_of(const TensorView& t, const char* name) {
  MAGI_CHECK(t.ndim >= 1, name, ": needs at least one dim (rows), got ", t.describe());
  MAGI_CHECK(t.device == Device::kCPU, name, ": the runtime moves host buffers, got ",
             t.describe());
  MAGI_CHECK(t.shape[0] == 0 || t.is_contiguous(), name, ": must be contiguous, got ",
             t.describe());
  return comm::Rows{t.data, t.shape[0], row_elems(t), t.dtype};
}

}  // namespace magi::runtime::detail
