// Definitions of the sm90 GPU tests' shared helpers: sm90_support.h says what they do and how
// errors are measured.
#include "sm90_support.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "error_of.h"
#include "magi/error.h"
#include "magi/mask_builders.h"

namespace magi::gputest {

// ---------------------------------------------------------------------------------------------
// Device plumbing

bool have_device() {
  static const bool has = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();  // a missing driver leaves a sticky error behind
    return e == cudaSuccess && n > 0;
  }();
  return has;
}

void cuda_ok(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA error in " + what + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

void sync(const std::string& what) {
  // A kernel that hangs would block cudaDeviceSynchronize (and CTest until its timeout): poll
  // an event behind the work instead, and end the process with a message past the deadline
  // (a hung kernel cannot be recovered from inside it).
  constexpr auto kDeadline = std::chrono::seconds(120);
  cudaEvent_t done = nullptr;
  cuda_ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what + " (event)");
  cuda_ok(cudaEventRecord(done, nullptr), what + " (event record)");
  const auto start = std::chrono::steady_clock::now();
  cudaError_t e;
  while ((e = cudaEventQuery(done)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - start > kDeadline) {
      std::cerr << "FATAL: " << what << ": the GPU did not finish within "
                << kDeadline.count() << " s (a kernel hang)" << std::endl;
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  cudaEventDestroy(done);
  cuda_ok(e, what + " (event query)");
  cuda_ok(cudaDeviceSynchronize(), what + " (synchronize)");
  cuda_ok(cudaGetLastError(), what);
}

int current_device() {
  int d = 0;
  cuda_ok(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

std::vector<unsigned char> encode(DType t, const std::vector<double>& xs) {
  std::vector<unsigned char> b(xs.size() * std::size_t(dtype_size(t)));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    unsigned char* dst = b.data() + i * std::size_t(dtype_size(t));
    switch (t) {
      case DType::kF64:
        std::memcpy(dst, &xs[i], 8);
        break;
      case DType::kF32: {
        const float f = float(xs[i]);
        std::memcpy(dst, &f, 4);
        break;
      }
      case DType::kBF16: {
        const BF16 h = to_bf16(float(xs[i]));
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::kF16: {
        const F16 h = to_f16(float(xs[i]));
        std::memcpy(dst, &h, 2);
        break;
      }
    }
  }
  return b;
}

std::vector<double> decode(DType t, const std::vector<unsigned char>& b) {
  std::vector<double> xs(b.size() / std::size_t(dtype_size(t)));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const unsigned char* src = b.data() + i * std::size_t(dtype_size(t));
    switch (t) {
      case DType::kF64:
        std::memcpy(&xs[i], src, 8);
        break;
      case DType::kF32: {
        float f;
        std::memcpy(&f, src, 4);
        xs[i] = f;
        break;
      }
      case DType::kBF16: {
        BF16 h;
        std::memcpy(&h, src, 2);
        xs[i] = to_float(h);
        break;
      }
      case DType::kF16: {
        F16 h;
        std::memcpy(&h, src, 2);
        xs[i] = to_float(h);
        break;
      }
    }
  }
  return xs;
}

TensorView device_view(void* data, DType t, const std::vector<std::int64_t>& shape,
                       const std::vector<std::int64_t>& stride) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.device = Device::kCUDA;
  v.device_idx = current_device();
  v.ndim = int(shape.size());
  for (int d = 0; d < v.ndim; ++d)
    v.shape[d] = shape[std::size_t(d)], v.stride[d] = stride[std::size_t(d)];
  return v;
}

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s(shape.size(), 1);
  for (int d = int(shape.size()) - 2; d >= 0; --d)
    s[std::size_t(d)] = s[std::size_t(d) + 1] * shape[std::size_t(d) + 1];
  return s;
}

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

// ---------------------------------------------------------------------------------------------
// Which (dtype, head dim) kernels this build has

std::string variant_name(DType t, std::int64_t d) {
  return std::string(dtype_name(t)) + "/D" + std::to_string(d);
}

std::optional<std::string> missing_variant(DType t, std::int64_t d) {
  static std::map<std::pair<DType, std::int64_t>, std::optional<std::string>> cache;
  const auto key = std::pair{t, d};
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  DevTensor q(t, {1, 1, d}), k(t, {1, 1, d}), v(t, {1, 1, d}), out(t, {1, 1, d});
  DevTensor lse(DType::kF32, {1, 1});
  q.upload(std::vector<double>(std::size_t(d), 0.0));
  k.upload(std::vector<double>(std::size_t(d), 0.0));
  v.upload(std::vector<double>(std::size_t(d), 0.0));
  const Mask mask(1, 1, {Slice{{0, 1}, {0, 1}, MaskType::kFull}});
  std::optional<std::string> missing;
  try {
    attn_forward(mask, FwdArgs{q.view, k.view, v.view, out.view, lse.view, {}, {}});
    sync("probe " + variant_name(t, d));
  } catch (const Error& e) {
    if (std::string(e.what()).find("no kernel for q dtype") == std::string::npos) throw;
    missing = e.what();
  }
  return cache[key] = missing;
}

bool built(DType t, std::int64_t d) {
  static std::map<std::pair<DType, std::int64_t>, bool> told;
  const auto missing = missing_variant(t, d);
  if (!missing) return true;
  if (t == DType::kBF16 && d == 128) {
    ADD_FAILURE() << "bf16/D128 must be built in every CUDA build: " << *missing;
  } else if (!told[{t, d}]) {
    told[{t, d}] = true;
    std::cout << "[ skipped  ] " << variant_name(t, d) << " is not built: " << *missing << "\n";
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// One case: dtypes, heads, options

Case with_dtype(Case c, DType in) {
  if (c.out == c.in) c.out = in;  // "out like in" follows the input dtype
  c.in = in;
  return c;
}

std::string describe(const Case& c, const Mask& mask) {
  std::ostringstream os;
  os << variant_name(c.in, c.d) << " out " << dtype_name(c.out) << " " << mask.total_seqlen_q()
     << "x" << mask.total_seqlen_k() << " (" << mask.size() << " slices, area " << mask.area()
     << ") hq " << c.hq << " hkv " << c.hkv;
  if (c.opts.softcap > 0) os << " softcap " << c.opts.softcap;
  if (c.opts.softmax_scale) os << " scale " << *c.opts.softmax_scale;
  if (c.sink_len > 0)
    os << " sink " << c.sink_len << (c.opts.sink_layout == SinkLayout::kSH ? " sh" : " ssh");
  return os.str();
}

Problem make_problem(const Mask& mask, const Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  testing::Config cfg = testing::config_for(c.in);
  cfg.sink = DType::kF32;  // the GPU takes fp32 sinks
  cfg.opts = c.opts;
  return testing::random_problem(rng, mask.total_seqlen_q(), mask.total_seqlen_k(), c.hq, c.hkv,
                                 c.d, cfg, c.sink_len);
}

std::vector<std::int64_t> sink_shape(const Problem& p) { return testing::sink_shape(p); }

// ---------------------------------------------------------------------------------------------
// Comparison

void compare(const Mask& mask, const Problem& p, const Case& c, const FwdResult& got,
             const std::string& what) {
  const FwdResult want = oracle::forward(mask, p);
  const FwdResult naive = naive_forward(mask, p, c.in, c.out);
  expect_close(got, want, naive, p.head_dim, c.max_logits, what);
}

FwdResult run_gpu(const Mask& mask, const Problem& p, const Case& c) {
  GpuCall call(p, c);
  attn_forward(mask, call.args(), c.opts);
  return call.result();
}

bool check(const Mask& mask, const Case& c, std::uint64_t seed, const std::string& note) {
  if (!built(c.in, c.d)) return false;
  const std::string what = describe(c, mask) + (note.empty() ? "" : " [" + note + "]");
  SCOPED_TRACE(what);
  const Problem p = make_problem(mask, c, seed);
  FwdResult got;
  try {
    got = run_gpu(mask, p, c);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "GPU forward threw: " << e.what() << "\n" << what;
    return true;
  }
  compare(mask, p, c, got, what);
  return true;
}

int check_dtypes(const Mask& mask, const Case& c, std::uint64_t seed, const std::string& note) {
  int ran = 0;
  for (DType in : {DType::kBF16, DType::kF16}) ran += check(mask, with_dtype(c, in), seed, note);
  return ran;
}

void expect_error(const std::function<void()>& f, const std::string& want) {
  const std::string got = testing::error_of(f);
  EXPECT_NE(got.find(want), std::string::npos)
      << "wanted an error with \"" << want << "\", got: " << got;
}

std::vector<std::int64_t> prefix_sums(const std::vector<std::int64_t>& lens) {
  std::vector<std::int64_t> cu{0};
  for (std::int64_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

}  // namespace magi::gputest
