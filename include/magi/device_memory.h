// Device memory for the layers above the kernels (the runtime's scratch rows, the staging
// communicator's copies): stream-ordered allocation, zeroing and host <-> device copies on one
// CUDA device. Built without CUDA, every call throws magi::Error saying so (and nothing can
// hand these functions a device pointer: TensorViews on a device come from a CUDA build).
#pragma once

#include <cstddef>
#include <cstdint>

namespace magi::device {

bool built_with_cuda();

// `bytes` on `device`, allocated and freed in order on `stream` (cudaMallocAsync /
// cudaFreeAsync; the CUDA handle as an integer, 0 = the legacy default stream). Move only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::size_t bytes, int device, std::uintptr_t stream);
  ~Buffer();
  Buffer(Buffer&& o) noexcept { *this = static_cast<Buffer&&>(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void reset() noexcept;  // frees (queued on the stream)
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = -1;
  std::uintptr_t stream_ = 0;
};

// A CUDA event with timing on `device`, for the runtime's stage timeline (runtime.h CalcStats).
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(Event&& o) noexcept : event_(o.event_), device_(o.device_) { o.event_ = nullptr; }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event& operator=(Event&&) = delete;
  // Queued on `stream`: marks the point after the work queued there before it.
  void record(std::uintptr_t stream);
  // Seconds on the device from `a` to `b` (both recorded); waits until `b` has happened.
  static double seconds_between(const Event& a, const Event& b);

 private:
  void* event_ = nullptr;  // cudaEvent_t
  int device_ = -1;
};

// Queued on `stream`: `bytes` of zeros at `dst` (device memory of `device`).
void zero(void* dst, std::size_t bytes, int device, std::uintptr_t stream);
// Device -> host: waits for the work queued on `stream` before it (the producers of `src`),
// returns with the bytes in `dst`.
void to_host(void* dst, const void* src, std::size_t bytes, int device, std::uintptr_t stream);
// Host -> device, queued on `stream` (the consumers that follow on it see the bytes); returns
// once `src` may be reused.
void to_device(void* dst, const void* src, std::size_t bytes, int device, std::uintptr_t stream);
// Waits for the work queued on `stream` of `device` (and surfaces its asynchronous errors).
void synchronize(int device, std::uintptr_t stream);
// Bytes of `device`'s memory that are free now (cudaMemGetInfo), for callers that refuse a
// problem before allocating it.
std::size_t free_bytes(int device);

}  // namespace magi::device
