// include/magi/device_memory.h: plain CUDA runtime calls (no kernels), or errors in a build
// without CUDA.
#include "magi/device_memory.h"

#include <string>
#include <utility>

#include "magi/error.h"

#if MAGI_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace magi::device {

#if MAGI_HAS_CUDA
namespace {

void ok(cudaError_t e, const char* what) {
  MAGI_CHECK(e == cudaSuccess, "device memory: ", what, ": ", cudaGetErrorString(e));
}
cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }
// Makes `device` current for the calls that follow (the caller's thread may be on another).
void on(int device) { ok(cudaSetDevice(device), "cudaSetDevice"); }

}  // namespace

bool built_with_cuda() { return true; }

Buffer::Buffer(std::size_t bytes, int device, std::uintptr_t stream)
    : bytes_(bytes), device_(device), stream_(stream) {
  if (bytes == 0) return;
  on(device);
  ok(cudaMallocAsync(&data_, bytes, as_stream(stream)), "cudaMallocAsync");
}

void Buffer::reset() noexcept {
  if (data_ == nullptr) return;
  cudaSetDevice(device_);
  cudaFreeAsync(data_, as_stream(stream_));  // cannot throw here: a failure shows later
  data_ = nullptr;
}

Buffer::~Buffer() { reset(); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
    stream_ = o.stream_;
  }
  return *this;
}

void zero(void* dst, std::size_t bytes, int device, std::uintptr_t stream) {
  if (bytes == 0) return;
  on(device);
  ok(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)), "cudaMemsetAsync");
}

namespace {
// A copy queued on `stream`, returned from once the stream has reached its end (device to
// host: the bytes are there; host to device, pageable memory: `src` has been read).
void copy_now(void* dst, const void* src, std::size_t bytes, int device, std::uintptr_t stream,
              cudaMemcpyKind kind, const std::string& what) {
  if (bytes == 0) return;
  on(device);
  ok(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)), what.c_str());
  ok(cudaStreamSynchronize(as_stream(stream)), (what + " (stream synchronize)").c_str());
}
}  // namespace

void to_host(void* dst, const void* src, std::size_t bytes, int device, std::uintptr_t stream) {
  copy_now(dst, src, bytes, device, stream, cudaMemcpyDeviceToHost, "device to host copy");
}

void to_device(void* dst, const void* src, std::size_t bytes, int device, std::uintptr_t stream) {
  copy_now(dst, src, bytes, device, stream, cudaMemcpyHostToDevice, "host to device copy");
}

void synchronize(int device, std::uintptr_t stream) {
  on(device);
  ok(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

std::size_t free_bytes(int device) {
  on(device);
  std::size_t free = 0, total = 0;
  ok(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

Event::Event(int device) : device_(device) {
  on(device);
  cudaEvent_t e = nullptr;
  ok(cudaEventCreate(&e), "cudaEventCreate");
  event_ = e;
}
Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}
void Event::record(std::uintptr_t stream) {
  on(device_);
  ok(cudaEventRecord(static_cast<cudaEvent_t>(event_), as_stream(stream)), "cudaEventRecord");
}
double Event::seconds_between(const Event& a, const Event& b) {
  ok(cudaEventSynchronize(static_cast<cudaEvent_t>(b.event_)), "cudaEventSynchronize");
  float ms = 0;
  ok(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a.event_),
                          static_cast<cudaEvent_t>(b.event_)),
     "cudaEventElapsedTime");
  return double(ms) * 1e-3;
}

#else

namespace {
[[noreturn]] void no_cuda(const char* what) {
  MAGI_FAIL("device memory: ", what, ": this build of magiattn has no CUDA (a CPU-only build)");
}
}  // namespace

bool built_with_cuda() { return false; }
Buffer::Buffer(std::size_t bytes, int, std::uintptr_t) {
  if (bytes != 0) no_cuda("allocation");
}
void Buffer::reset() noexcept {}
Buffer::~Buffer() = default;
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  data_ = std::exchange(o.data_, nullptr);
  bytes_ = std::exchange(o.bytes_, 0);
  return *this;
}
void zero(void*, std::size_t bytes, int, std::uintptr_t) {
  if (bytes != 0) no_cuda("zeroing");
}
void to_host(void*, const void*, std::size_t bytes, int, std::uintptr_t) {
  if (bytes != 0) no_cuda("device to host copy");
}
void to_device(void*, const void*, std::size_t bytes, int, std::uintptr_t) {
  if (bytes != 0) no_cuda("host to device copy");
}
void synchronize(int, std::uintptr_t) { no_cuda("synchronize"); }
std::size_t free_bytes(int) { no_cuda("memory query"); }
Event::Event(int device) : device_(device) { no_cuda("event"); }
Event::~Event() = default;
void Event::record(std::uintptr_t) { no_cuda("event"); }
double Event::seconds_between(const Event&, const Event&) { no_cuda("event"); }

#endif

}  // namespace magi::device
