// Host-side pieces the sm90 forward and backward share (forward.cu, backward.cu): CUDA error
// checks, the SM count, output dtypes, allocations made during a stream capture, stream-ordered
// frees.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>

#include "fwd_params.h"  // OutType
#include "magi/error.h"
#include "magi/dtype.h"

// A CUDA call that must succeed; `who` names the caller ("GPU forward"), `what` the step.
#define MAGI_CUDA_CHECK_IN(who, expr, what)                                           \
  do {                                                                                \
    const cudaError_t magi_err_ = (expr);                                             \
    MAGI_CHECK(magi_err_ == cudaSuccess, who, ": ", what, ": ",                       \
               cudaGetErrorName(magi_err_), " (", cudaGetErrorString(magi_err_), ")"); \
  } while (0)

namespace magi::kernels::sm90 {

// The kernels' store type for a tensor (`name` in the error) of dtype t.
inline OutType out_type(DType t, const char* name) {
  switch (t) {
    case DType::kBF16: return OutType::kBF16;
    case DType::kF16: return OutType::kF16;
    case DType::kF32: return OutType::kF32;
    default: MAGI_FAIL(name, ": dtype ", dtype_name(t), " is not bf16, fp16 or fp32 on the GPU");
  }
}

// Makes `device` (the call's tensors' device) current for this thread's CUDA calls; `who`
// names the caller in errors.
inline void use_device(int device, const char* who) {
  int current = -1;
  MAGI_CUDA_CHECK_IN(who, cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) MAGI_CUDA_CHECK_IN(who, cudaSetDevice(device), "cudaSetDevice");
}

// Multiprocessors of a device, asked once per device.
inline int sm_count(int device) {
  static std::array<std::atomic<int>, 64> known{};  // per device; 0: not asked yet
  const bool cached = device >= 0 && device < int(known.size());
  if (cached && known[std::size_t(device)].load(std::memory_order_relaxed) > 0)
    return known[std::size_t(device)].load(std::memory_order_relaxed);
  int n = 0;
  MAGI_CUDA_CHECK_IN("GPU kernels", cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
                     "multiprocessor count");
  if (cached) known[std::size_t(device)].store(n, std::memory_order_relaxed);
  return n;
}

// CUDA calls that are not stream work (allocation, a private stream's copy) made while some
// stream of this process is being captured: relaxed, as torch's allocator does, so they neither
// fail nor invalidate the capture.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Frees a per-call allocation after the kernels on the stream (stream-ordered), also on an
// error path.
struct StreamFree {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  ~StreamFree() {
    if (ptr != nullptr) cudaFreeAsync(ptr, stream);
  }
};

constexpr std::size_t align16(std::size_t n) { return (n + 15) / 16 * 16; }

}  // namespace magi::kernels::sm90
