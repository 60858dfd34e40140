// The copies with_device_staging (magi/comm.h) makes, as a seam: the CUDA ones in the library,
// host memcpy in tests/unit/staging_test.cc, which checks the staging's bookkeeping (what is
// copied when, sums of several reductions in flight, rows a cast does not write) over real
// MPI ranks on a machine without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "magi/comm.h"

namespace magi::comm::detail {

struct DeviceCopies {
  // As magi/device_memory.h's to_host / to_device.
  void (*to_host)(void* dst, const void* src, std::size_t bytes, int device, std::uintptr_t stream);
  void (*to_device)(void* dst, const void* src, std::size_t bytes, int device,
                    std::uintptr_t stream);
};

DeviceCopies cuda_copies();
std::unique_ptr<Communicator> with_device_staging(Communicator& inner, DeviceCopies copies);

}  // namespace magi::comm::detail
