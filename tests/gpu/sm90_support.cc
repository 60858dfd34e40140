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
// The same-precision naive reference (sm90_support.h's header comment)

namespace {

float round16(DType t, float x) { return float(testing::round_to(t, x)); }

}  // namespace

FwdResult naive_forward(const Mask& mask, const Problem& p, DType in, DType out_dtype) {
  const std::int64_t nq = p.num_q, nk = p.num_k, hq = p.heads_q, d = p.head_dim;
  const std::int64_t group = p.heads_q / p.heads_kv;
  const std::vector<std::uint8_t> dense = masks::to_dense(mask);
  const float scale = float(p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(d)));
  const float cap = float(p.softcap);
  const std::vector<float> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()),
      v(p.v.begin(), p.v.end());
  FwdResult r;
  r.out.assign(std::size_t(nq * hq * d), 0.0);
  r.lse.assign(std::size_t(nq * hq), -kInf);
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t i = 0; i < nq; ++i) {
    std::vector<std::int64_t> keys;
    for (std::int64_t j = 0; j < nk; ++j)
      if (dense[std::size_t(i * nk + j)]) keys.push_back(j);
    std::vector<float> s(keys.size()), o(static_cast<std::size_t>(d));
    for (std::int64_t h = 0; h < hq; ++h) {
      const float* qi = &q[std::size_t((i * hq + h) * d)];
      const std::int64_t hk = h / group;
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const float* kj = &k[std::size_t((keys[n] * p.heads_kv + hk) * d)];
        float dot = 0.f;
        for (std::int64_t e = 0; e < d; ++e) dot += qi[e] * kj[e];
        float x = scale * dot;
        if (cap > 0.f) x = cap * std::tanh(x / cap);
        s[n] = x;
        m = std::max(m, x);
      }
      std::fill(o.begin(), o.end(), 0.f);
      float l = 0.f;
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const float pn = std::exp(s[n] - m);
        l += pn;
        const float pr = round16(in, pn);
        const float* vj = &v[std::size_t((keys[n] * p.heads_kv + hk) * d)];
        for (std::int64_t e = 0; e < d; ++e) o[std::size_t(e)] += pr * vj[e];
      }
      float lse = keys.empty() ? -std::numeric_limits<float>::infinity() : m + std::log(l);
      float w = keys.empty() ? 0.f : 1.f / l;
      if (p.sink_len > 0) {
        float smax = -std::numeric_limits<float>::infinity();
        std::vector<float> sk(std::size_t(p.sink_len));
        for (std::int64_t t = 0; t < p.sink_len; ++t) {
          const std::int64_t idx =
              p.sink_layout == SinkLayout::kSH ? t * hq + h : (i * p.sink_len + t) * hq + h;
          sk[std::size_t(t)] = float(p.sink[std::size_t(idx)]);
          smax = std::max(smax, sk[std::size_t(t)]);
        }
        float ssum = 0.f;
        for (float x : sk) ssum += std::exp(x - smax);
        const float lse_sink = smax + std::log(ssum);
        const float hi = std::max(lse, lse_sink), lo = std::min(lse, lse_sink);
        const float merged =
            lo == -std::numeric_limits<float>::infinity() ? hi : hi + std::log1p(std::exp(lo - hi));
        if (!keys.empty()) w *= std::exp(lse - merged);
        lse = merged;
      }
      r.lse[std::size_t(i * hq + h)] = lse;
      for (std::int64_t e = 0; e < d; ++e)
        r.out[std::size_t((i * hq + h) * d + e)] =
            testing::round_to(out_dtype, double(o[std::size_t(e)] * w));
    }
  }
  return r;
}

oracle::BwdResult naive_backward(const Mask& mask, const Problem& p, DType in, DType grad) {
  const FwdResult fwd = naive_forward(mask, p, in, in);
  const std::int64_t nq = p.num_q, nk = p.num_k, hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim;
  const std::int64_t group = hq / hkv;
  const std::vector<std::uint8_t> dense = masks::to_dense(mask);
  const float scale = float(p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(d)));
  const float cap = float(p.softcap);
  const std::vector<float> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()),
      v(p.v.begin(), p.v.end()), dout(p.dout.begin(), p.dout.end()),
      out(fwd.out.begin(), fwd.out.end());
  // The rounded P and dS of every (q head, row, key), 0 on hidden cells; Delta per (row, head).
  std::vector<float> pr(std::size_t(hq * nq * nk), 0.f), dsr(pr.size(), 0.f);
  std::vector<float> delta(std::size_t(nq * hq), 0.f);
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t i = 0; i < nq; ++i)
    for (std::int64_t h = 0; h < hq; ++h) {
      const float* qi = &q[std::size_t((i * hq + h) * d)];
      const float* gi = &dout[std::size_t((i * hq + h) * d)];
      const float* oi = &out[std::size_t((i * hq + h) * d)];
      float dl = 0.f;
      for (std::int64_t e = 0; e < d; ++e) dl += oi[e] * gi[e];
      delta[std::size_t(i * hq + h)] = dl;
      const float lse = float(fwd.lse[std::size_t(i * hq + h)]);
      const std::int64_t hk = h / group;
      for (std::int64_t j = 0; j < nk; ++j) {
        if (!dense[std::size_t(i * nk + j)]) continue;
        const float* kj = &k[std::size_t((j * hkv + hk) * d)];
        const float* vj = &v[std::size_t((j * hkv + hk) * d)];
        float dot = 0.f, dp = 0.f;
        for (std::int64_t e = 0; e < d; ++e) dot += qi[e] * kj[e], dp += gi[e] * vj[e];
        float l = scale * dot, chain = 1.f;
        if (cap > 0.f) {
          const float t = std::tanh(l / cap);
          l = cap * t;
          chain = 1.f - t * t;
        }
        const float pv = std::exp(l - lse);
        const std::size_t at = std::size_t((h * nq + i) * nk + j);
        pr[at] = round16(in, pv);
        dsr[at] = round16(in, pv * (dp - dl) * chain);
      }
    }
  oracle::BwdResult r;
  r.dq.assign(std::size_t(nq * hq * d), 0.0);
  r.dk.assign(std::size_t(nk * hkv * d), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t i = 0; i < nq; ++i)
    for (std::int64_t h = 0; h < hq; ++h) {
      std::vector<float> acc(std::size_t(d), 0.f);
      for (std::int64_t j = 0; j < nk; ++j) {
        const float ds = dsr[std::size_t((h * nq + i) * nk + j)];
        if (ds == 0.f) continue;
        const float* kj = &k[std::size_t((j * hkv + h / group) * d)];
        for (std::int64_t e = 0; e < d; ++e) acc[std::size_t(e)] += ds * kj[e];
      }
      for (std::int64_t e = 0; e < d; ++e)
        r.dq[std::size_t((i * hq + h) * d + e)] =
            testing::round_to(grad, double(scale * acc[std::size_t(e)]));
    }
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t j = 0; j < nk; ++j)
    for (std::int64_t hk = 0; hk < hkv; ++hk) {
      std::vector<float> ak(std::size_t(d), 0.f), av(std::size_t(d), 0.f);
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (std::int64_t i = 0; i < nq; ++i) {
          const std::size_t at = std::size_t((h * nq + i) * nk + j);
          if (pr[at] == 0.f && dsr[at] == 0.f) continue;
          const float* qi = &q[std::size_t((i * hq + h) * d)];
          const float* gi = &dout[std::size_t((i * hq + h) * d)];
          for (std::int64_t e = 0; e < d; ++e) {
            ak[std::size_t(e)] += dsr[at] * qi[e];
            av[std::size_t(e)] += pr[at] * gi[e];
          }
        }
      for (std::int64_t e = 0; e < d; ++e) {
        r.dk[std::size_t((j * hkv + hk) * d + e)] =
            testing::round_to(grad, double(scale * ak[std::size_t(e)]));
        r.dv[std::size_t((j * hkv + hk) * d + e)] =
            testing::round_to(grad, double(av[std::size_t(e)]));
      }
    }
  if (p.sink_len > 0) {
    const bool ssh = p.sink_layout == SinkLayout::kSSH;
    r.dsink.assign(p.sink.size(), 0.0);
    for (std::int64_t i = 0; i < nq; ++i)
      for (std::int64_t h = 0; h < hq; ++h) {
        const float lse = float(fwd.lse[std::size_t(i * hq + h)]);
        if (lse == -std::numeric_limits<float>::infinity()) continue;
        for (std::int64_t t = 0; t < p.sink_len; ++t) {
          const std::size_t idx = std::size_t(ssh ? (i * p.sink_len + t) * hq + h : t * hq + h);
          r.dsink[idx] -= double(std::exp(float(p.sink[idx]) - lse) * delta[std::size_t(i * hq + h)]);
        }
      }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Comparison

double abs_err(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return kInf;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return kInf;
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return kInf;
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

Verdict expect_close(const FwdResult& got, const FwdResult& want, const FwdResult& naive,
                     std::int64_t d, bool check_max_logits, const std::string& what) {
  Verdict v{};
  v.out = testing::rel_err(got.out, want.out);
  v.out_naive = testing::rel_err(naive.out, want.out);
  v.lse = abs_err(got.lse, want.lse);
  v.lse_naive = abs_err(naive.lse, want.lse);
  EXPECT_TRUE(std::isfinite(v.out_naive) && std::isfinite(v.lse_naive))
      << "test bug: the naive reference disagrees with the oracle on NaN/inf positions: " << what;
  EXPECT_LE(v.out, 2 * v.out_naive + 1e-6)
      << "out error vs oracle " << v.out << ", naive " << v.out_naive << ": " << what;
  EXPECT_LE(v.lse, 2 * v.lse_naive + 1e-5)
      << "lse abs error vs oracle " << v.lse << ", naive " << v.lse_naive << ": " << what;
  if (check_max_logits) {
    v.max_logits = testing::lse_err(got.max_logits, want.max_logits);
    EXPECT_LE(v.max_logits, 1e-5) << "max_logits relative error vs oracle: " << what;
  }
  // Rows that see nothing: the oracle gives lse -inf (lse_sink with a sink) and out exactly 0.
  std::int64_t nonzero = 0, bad_lse = 0, rows = 0;
  for (std::size_t r = 0; r < want.lse.size(); ++r) {
    const auto row = [&](const FwdResult& x, std::int64_t e) {
      return x.out[r * std::size_t(d) + std::size_t(e)];
    };
    bool empty = want.lse[r] == -kInf;
    if (!empty) {
      empty = true;
      for (std::int64_t e = 0; e < d && empty; ++e) empty = row(want, e) == 0.0;
    }
    if (!empty) continue;
    ++rows;
    bad_lse += want.lse[r] == -kInf && got.lse[r] != -kInf;
    for (std::int64_t e = 0; e < d; ++e) nonzero += row(got, e) != 0.0;
  }
  EXPECT_EQ(nonzero, 0) << "rows that see nothing must give out exactly 0: " << what;
  EXPECT_EQ(bad_lse, 0) << "rows that see nothing must give lse exactly -inf: " << what;
  std::cout << "  [sm90] " << what << std::scientific << std::setprecision(2) << ": out " << v.out
            << " (naive " << v.out_naive << "), lse " << v.lse << " (naive " << v.lse_naive << ")";
  if (check_max_logits) std::cout << ", max_logits " << v.max_logits;
  if (rows > 0) std::cout << std::defaultfloat << ", " << rows << " empty row-heads";
  std::cout << std::defaultfloat << "\n";
  return v;
}

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
