// Helpers shared by the Hopper (sm90) GPU tests (sm90_forward_test.cc, sm90_prepared_test.cc):
// device plumbing, which variants the build has, one case's problem and device buffers, and the
// comparison with the fp64 oracle by docs/semantics.md §5's rule for GPU kernels: the kernel's
// error may be at most twice that of a naive implementation in the same precision (the naive
// reference and the error measures: tests/support/naive.h).
//
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn_case.h"
#include "magi/attention.h"
#include "magi/mask.h"
#include "naive.h"

namespace magi::gputest {

using oracle::FwdResult;
using oracle::Problem;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Sets row `row` of head `head` of a [rows][heads][d] tensor to x (only column `col` if >= 0).
inline void plant_row(std::vector<double>& xs, std::int64_t row, std::int64_t head,
                      std::int64_t heads, std::int64_t d, double x, std::int64_t col = -1) {
  for (std::int64_t e = 0; e < d; ++e)
    if (col < 0 || e == col) xs[std::size_t((row * heads + head) * d + e)] = x;
}
#ifdef MAGI_GPU_TEST_BINARY
// The skip line of this binary (the header comment); constexpr: one per translation unit.
constexpr char kNoDevice[] = MAGI_GPU_TEST_BINARY ": no CUDA device";
#endif

// ---------------------------------------------------------------------------------------------
// Device plumbing

bool have_device();

#define REQUIRE_GPU()                                                        \
  do {                                                                       \
    if (!::magi::gputest::have_device())                                     \
      GTEST_SKIP() << ::magi::gputest::kNoDevice << " (cudaGetDeviceCount)"; \
  } while (0)

void cuda_ok(cudaError_t e, const std::string& what);
// Waits for the device and surfaces any asynchronous kernel error; ends the process with a
// message when the GPU has not finished within 120 s (a kernel hang).
void sync(const std::string& what);
int current_device();

class DeviceMem {
 public:
  DeviceMem() = default;
  explicit DeviceMem(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) cuda_ok(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  ~DeviceMem() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem(DeviceMem&& o) noexcept { *this = std::move(o); }
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  void upload(const std::vector<unsigned char>& host) {
    if (bytes_ > 0)
      cuda_ok(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), "upload");
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> host(bytes_);
    if (bytes_ > 0)
      cuda_ok(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "download");
    return host;
  }
  // 0xff bytes are NaN in fp32, bf16 and fp16 alike: an element the kernel fails to write
  // stays NaN and fails every comparison.
  void fill_nan() {
    if (bytes_ > 0) cuda_ok(cudaMemset(ptr_, 0xff, bytes_), "cudaMemset");
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

std::vector<unsigned char> encode(DType t, const std::vector<double>& xs);
std::vector<double> decode(DType t, const std::vector<unsigned char>& b);
TensorView device_view(void* data, DType t, const std::vector<std::int64_t>& shape,
                       const std::vector<std::int64_t>& stride);
std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape);
std::int64_t numel_of(const std::vector<std::int64_t>& shape);

// A contiguous device tensor, NaN until written.
struct DevTensor {
  DType dtype;
  std::vector<std::int64_t> shape;
  DeviceMem mem;
  TensorView view;

  DevTensor(DType t, std::vector<std::int64_t> shp)
      : dtype(t),
        shape(std::move(shp)),
        mem(std::size_t(numel_of(shape)) * std::size_t(dtype_size(t))) {
    mem.fill_nan();
    view = device_view(mem.get(), dtype, shape, contiguous_strides(shape));
  }
  void upload(const std::vector<double>& xs) { mem.upload(encode(dtype, xs)); }
  std::vector<double> download() const { return decode(dtype, mem.download()); }
};

// ---------------------------------------------------------------------------------------------
// Which (dtype, head dim) kernels this build has

std::string variant_name(DType t, std::int64_t d);
// Runs a 1x1 problem: nullopt when the variant exists, else the "no kernel" message.
std::optional<std::string> missing_variant(DType t, std::int64_t d);
// True when the kernel for (t, d) is built; else says why once and returns false. bf16/D128 is
// in every CUDA build: its absence is a failure.
bool built(DType t, std::int64_t d);

// ---------------------------------------------------------------------------------------------
// One case: dtypes, heads, options

struct Case {
  DType in = DType::kBF16;
  DType out = DType::kBF16;  // forward out dtype (bf16, fp16 or fp32)
  std::int64_t hq = 4, hkv = 2, d = 128;
  std::int64_t sink_len = 0;
  AttnOptions opts;  // softmax_scale, softcap, sink_layout (accumulate is set by the tests)
  bool max_logits = true;
};

// A non-blocking stream for a test's launches, destroyed with the object. one_cta() points a
// case's options at it with sm_margin past the SM count: a single persistent CTA then loops
// over every item, reusing its buffers and rings (the racecheck cases of scripts/gpu_test.sh).
class UserStream {
 public:
  UserStream() {
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~UserStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  UserStream(const UserStream&) = delete;
  UserStream& operator=(const UserStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void one_cta(AttnOptions& opts) const {
    opts.sm_margin = 1 << 20;
    opts.cuda_stream = reinterpret_cast<std::uintptr_t>(stream_);
  }

 private:
  cudaStream_t stream_ = nullptr;
};

Case with_dtype(Case c, DType in);
std::string describe(const Case& c, const Mask& mask);
Problem make_problem(const Mask& mask, const Case& c, std::uint64_t seed);
std::vector<std::int64_t> sink_shape(const Problem& p);

// Device buffers of one forward call; q/k/v/sink hold the problem, out/lse/max_logits NaN.
struct GpuCall {
  DevTensor q, k, v, out, lse, max_logits;
  std::optional<DevTensor> sink;
  bool has_max_logits;

  GpuCall(const Problem& p, const Case& c)
      : q(c.in, {p.num_q, p.heads_q, p.head_dim}),
        k(c.in, {p.num_k, p.heads_kv, p.head_dim}),
        v(c.in, {p.num_k, p.heads_kv, p.head_dim}),
        out(c.out, {p.num_q, p.heads_q, p.head_dim}),
        lse(DType::kF32, {p.num_q, p.heads_q}),
        max_logits(DType::kF32, {p.heads_q}),
        has_max_logits(c.max_logits) {
    q.upload(p.q);
    k.upload(p.k);
    v.upload(p.v);
    if (p.sink_len > 0) {
      sink.emplace(DType::kF32, sink_shape(p));
      sink->upload(p.sink);
    }
  }
  FwdArgs args(bool with_sink = true) const {
    FwdArgs a{q.view, k.view, v.view, out.view, lse.view, std::nullopt, std::nullopt};
    if (sink && with_sink) a.sink = sink->view;
    if (has_max_logits) a.max_logits = max_logits.view;
    return a;
  }
  FwdResult result() const {
    sync("download");
    return {out.download(), lse.download(),
            has_max_logits ? max_logits.download() : std::vector<double>{}};
  }
};

// ---------------------------------------------------------------------------------------------
// Comparison (the naive reference and expect_close: tests/support/naive.h)

using testing::abs_err;
using testing::expect_close;
using testing::naive_backward;
using testing::naive_forward;
using testing::Verdict;

void compare(const Mask& mask, const Problem& p, const Case& c, const FwdResult& got,
             const std::string& what);
FwdResult run_gpu(const Mask& mask, const Problem& p, const Case& c);
// One GPU forward of `mask` compared with the oracle; false when the variant is not built.
bool check(const Mask& mask, const Case& c, std::uint64_t seed = 1, const std::string& note = "");
// check() for bf16 and fp16 inputs (out following the input dtype unless c.out is fp32);
// returns how many ran.
int check_dtypes(const Mask& mask, const Case& c, std::uint64_t seed = 1,
                 const std::string& note = "");
// Expects f to throw a magi::Error whose message contains `want`.
void expect_error(const std::function<void()>& f, const std::string& want);

std::vector<std::int64_t> prefix_sums(const std::vector<std::int64_t>& lens);

}  // namespace magi::gputest
