// Internal: TensorView <-> comm::Rows. The communicator moves contiguous row buffers, so every
// tensor the runtime sends or receives must be contiguous; this is checked once per call here.
// Tensors on a CUDA device: scratch rows beside them (Scratch), host copies for the host-side
// row shuffles (HostCopy).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "magi/comm.h"
#include "magi/device_memory.h"
#include "magi/error.h"
#include "magi/tensor.h"

namespace magi::runtime::detail {

// Elements per row (product of all dims but the first), valid for zero-row tensors too.
inline std::int64_t row_elems(const TensorView& t) {
  std::int64_t n = 1;
  for (int d = 1; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

// The rows of t for the communicator: host memory, or CUDA memory ordered on `stream`.
inline comm::Rows rows_of(const TensorView& t, const char* name, std::uintptr_t stream = 0) {
  MAGI_CHECK(t.ndim >= 1, name, ": needs at least one dim (rows), got ", t.describe());
  MAGI_CHECK(t.shape[0] == 0 || t.is_contiguous(), name, ": must be contiguous, got ",
             t.describe());
  comm::Rows r{t.data, t.shape[0], row_elems(t), t.dtype};
  if (t.device == Device::kCUDA) r.device = t.device_idx, r.stream = stream;
  return r;
}

inline std::size_t num_bytes(const TensorView& t) {
  return std::size_t(t.numel()) * std::size_t(dtype_size(t.dtype));
}

// Scratch bytes where `like` lives: a host vector, or device memory of its device (allocated
// in order on `stream`). Optionally zeroed.
class Scratch {
 public:
  Scratch() = default;
  Scratch(std::size_t bytes, const TensorView& like, std::uintptr_t stream, bool zeroed) {
    if (like.device == Device::kCUDA) {
      dev_ = device::Buffer(bytes, like.device_idx, stream);
      if (zeroed) device::zero(dev_.data(), bytes, like.device_idx, stream);
    } else {
      host_.assign(bytes, 0);  // 0.0 is all-zero bits
    }
  }
  void* data() { return dev_.data() != nullptr ? dev_.data() : host_.data(); }

 private:
  std::vector<unsigned char> host_;
  device::Buffer dev_;
};

// A host copy of a device tensor for the host-side algorithms (dispatch's gathers, roll's
// copies): read now if `read`, written back by commit(); a host tensor is used in place.
class HostCopy {
 public:
  HostCopy(const TensorView& t, std::uintptr_t stream, bool read) : dev_(t), stream_(stream) {
    view = t;
    if (t.device != Device::kCUDA) return;
    bytes_.resize(num_bytes(t));
    view.data = bytes_.data();
    view.device = Device::kCPU;
    view.device_idx = 0;
    if (read) device::to_host(bytes_.data(), t.data, bytes_.size(), t.device_idx, stream);
  }
  void commit() const {
    if (dev_.device == Device::kCUDA)
      device::to_device(dev_.data, bytes_.data(), bytes_.size(), dev_.device_idx, stream_);
  }
  TensorView view;

 private:
  TensorView dev_;
  std::uintptr_t stream_;
  std::vector<unsigned char> bytes_;
};

// Whether any of the views is on a CUDA device.
inline bool any_on_device(std::initializer_list<const TensorView*> ts) {
  for (const TensorView* t : ts)
    if (t != nullptr && t->device == Device::kCUDA) return true;
  return false;
}

// `comm` itself, or (device tensors, a host-only communicator such as MPI's) `comm` behind
// host staging (comm.h with_device_staging), kept alive in `holder`.
inline comm::Communicator& for_rows(comm::Communicator& comm, bool on_device,
                                    std::unique_ptr<comm::Communicator>& holder) {
  if (!on_device || comm.device_rows()) return comm;
  holder = comm::with_device_staging(comm);
  return *holder;
}

}  // namespace magi::runtime::detail
