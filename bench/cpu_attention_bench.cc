// CPU FFA forward/backward throughput against OpenBLAS sgemm, measured in one process with the
// same thread count: sgemm at the attention's own shape (M = N = seqlen, K = hdim, what QK^T
// would cost as one product) and square 4096^3. The shaped sgemm runs interleaved with the
// attention passes, iteration by iteration, so that a busy shared machine slows both alike;
// medians of --iters after a warm-up. FLOPs over the visible area (docs/semantics.md §4).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "magi/attention.h"
#include "magi/dtype.h"
#include "magi/mask_families.h"

namespace {

struct Flags {
  std::int64_t seqlen = 4096;
  std::int64_t hdim = 128;
  std::string heads = "8";  // "Hq" or "Hq:Hkv"
  std::vector<std::string> masks = {"full", "causal", "varlen-causal"};
  std::string dtype = "fp32";
  int iters = 5;
  int threads = 0;
  bool backward = true;
  std::uint64_t seed = 0;
  std::string json;
};

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

// Median seconds of each function over `iters` rounds, the functions interleaved within a
// round; one untimed warm-up round first (page faults, thread pools, caches).
std::vector<double> interleaved_medians(int iters, const std::vector<std::function<void()>>& fns) {
  for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> times(fns.size());
  for (int i = 0; i < iters; ++i)
    for (std::size_t f = 0; f < fns.size(); ++f) times[f].push_back(seconds(fns[f]));
  std::vector<double> medians;
  for (const auto& t : times) medians.push_back(median(t));
  return medians;
}

// C = A B^T with both operands row-major [rows x k]: the shape of Q K^T.
struct Sgemm {
  std::int64_t m, n, k;
  std::vector<float> a, b, c;
  Sgemm(std::int64_t m_, std::int64_t n_, std::int64_t k_)
      : m(m_), n(n_), k(k_), a(std::size_t(m * k), 0.5f), b(std::size_t(n * k), 0.25f),
        c(std::size_t(m * n)) {}
  void operator()() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, a.data(),
                int(k), b.data(), int(k), 0.0f, c.data(), int(n));
  }
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// Random values of the given dtype, contiguous [n, h, d].
struct Tensor {
  std::vector<std::uint8_t> bytes;
  magi::TensorView view;
  Tensor(magi::DType dtype, std::int64_t n, std::int64_t h, std::int64_t d, std::mt19937_64& rng)
      : bytes(std::size_t(n * h * d * magi::dtype_size(dtype))) {
    view = magi::make_view(bytes.data(), dtype, {n, h, d});
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < n * h * d; ++i) {
      const float x = dist(rng);
      switch (dtype) {
        case magi::DType::kF32: view.ptr<float>()[i] = x; break;
        case magi::DType::kF64: view.ptr<double>()[i] = x; break;
        case magi::DType::kBF16: view.ptr<magi::BF16>()[i] = magi::to_bf16(x); break;
        case magi::DType::kF16: view.ptr<magi::F16>()[i] = magi::to_f16(x); break;
      }
    }
  }
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"CPU FFA forward/backward GFLOP/s next to OpenBLAS sgemm", "cpu_attention_bench"};
  app.add_option("--seqlen", f.seqlen, "tokens (masks are seqlen x seqlen)")->capture_default_str();
  app.add_option("--hdim", f.hdim, "head dim")->capture_default_str();
  app.add_option("--heads", f.heads, "query heads, or Hq:Hkv for GQA")->capture_default_str();
  app.add_option("--mask", f.masks, "mask families (see `magiattn mask --help`)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--dtype", f.dtype, "fp32, fp64, bf16 or fp16")->capture_default_str();
  app.add_option("--iters", f.iters, "timed runs per measurement (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", f.threads, "threads for attention and sgemm (0: all)")
      ->capture_default_str();
  app.add_flag("!--no-bwd", f.backward, "skip the backward pass");
  app.add_option("--seed", f.seed, "seed of document lengths and tensors")->capture_default_str();
  app.add_option("--json", f.json, "also write the results to this file");
  CLI11_PARSE(app, argc, argv);

  const std::size_t colon = f.heads.find(':');
  const std::int64_t hq = std::stoll(f.heads.substr(0, colon));
  const std::int64_t hkv = colon == std::string::npos ? hq : std::stoll(f.heads.substr(colon + 1));
  const int threads = f.threads > 0 ? f.threads : omp_get_max_threads();
  const magi::DType dtype = magi::dtype_from_name(f.dtype);
  const magi::DType compute = dtype == magi::DType::kF64 ? dtype : magi::DType::kF32;
  openblas_set_num_threads(threads);

  const std::string corename = openblas_get_corename();
  std::printf("cpu_attention_bench: seqlen %lld, hdim %lld, heads %lld:%lld, %s, %d threads, "
              "median of %d\n",
              (long long)f.seqlen, (long long)f.hdim, (long long)hq, (long long)hkv,
              f.dtype.c_str(), threads, f.iters);
  std::printf("cpu: %s; OpenBLAS kernel: %s%s\n", cpu_model().c_str(), corename.c_str(),
              corename == "Prescott" ? " (generic SSE3: set OPENBLAS_CORETYPE=SkylakeX for "
                                       "a fair AVX-512 baseline)"
                                     : "");
  Sgemm square(4096, 4096, 4096), shaped(f.seqlen, f.seqlen, f.hdim);
  const double square_s = interleaved_medians(f.iters, {std::ref(square)})[0];
  const double square_gf = square.flops() / square_s / 1e9;
  std::printf("sgemm 4096x4096x4096: %.1f GFLOP/s\n", square_gf);
  std::printf("sgemm %lldx%lldx%lld (interleaved with each mask below)\n\n", (long long)f.seqlen,
              (long long)f.seqlen, (long long)f.hdim);
  std::printf("%-14s %10s %8s %8s %9s %6s %8s %9s %6s\n", "mask", "area", "sgemm", "fwd ms",
              "fwd GF/s", "/gemm", "bwd ms", "bwd GF/s", "/gemm");

  nlohmann::json results = nlohmann::json::array();
  std::mt19937_64 rng(f.seed);
  Tensor q(dtype, f.seqlen, hq, f.hdim, rng), k(dtype, f.seqlen, hkv, f.hdim, rng),
      v(dtype, f.seqlen, hkv, f.hdim, rng), dout(dtype, f.seqlen, hq, f.hdim, rng);
  Tensor out(dtype, f.seqlen, hq, f.hdim, rng), dq(dtype, f.seqlen, hq, f.hdim, rng),
      dk(dtype, f.seqlen, hkv, f.hdim, rng), dv(dtype, f.seqlen, hkv, f.hdim, rng);
  Tensor lse(compute, f.seqlen, hq, 1, rng);
  magi::TensorView lse_view = magi::make_view(lse.view.data, compute, {f.seqlen, hq});
  magi::AttnOptions opts;
  opts.num_threads = threads;

  for (const std::string& family : f.masks) {
    magi::FamilySpec spec;
    spec.family = family;
    spec.seqlen = f.seqlen;
    spec.seed = f.seed;
    const magi::Mask mask = magi::build_family(spec);
    const double flops = magi::attn_fwd_flops(mask.area(), hq, f.hdim);
    const magi::FwdArgs fwd{q.view, k.view, v.view, out.view, lse_view, {}, {}};
    const magi::BwdArgs bwd{dout.view, q.view,  k.view,  v.view, out.view,
                            lse_view,  dq.view, dk.view, dv.view, {}, {}};
    std::vector<std::function<void()>> fns = {std::ref(shaped),
                                              [&] { magi::attn_forward(mask, fwd, opts); }};
    if (f.backward) fns.push_back([&] { magi::attn_backward(mask, bwd, opts); });
    const std::vector<double> t = interleaved_medians(f.iters, fns);
    const double gemm_gf = shaped.flops() / t[0] / 1e9;
    const double fwd_gf = flops / t[1] / 1e9;
    const double bwd_gf = f.backward ? 2.5 * flops / t[2] / 1e9 : 0;
    const double bwd_ms = f.backward ? t[2] * 1e3 : 0;
    std::printf("%-14s %10lld %8.1f %8.1f %9.1f %5.0f%% %8.1f %9.1f %5.0f%%\n", family.c_str(),
                (long long)mask.area(), gemm_gf, t[1] * 1e3, fwd_gf, 100 * fwd_gf / gemm_gf,
                bwd_ms, bwd_gf, 100 * bwd_gf / gemm_gf);
    results.push_back({{"mask", family},          {"area", mask.area()},
                       {"sgemm_gflops", gemm_gf}, {"fwd_ms", t[1] * 1e3},
                       {"fwd_gflops", fwd_gf},    {"bwd_ms", bwd_ms},
                       {"bwd_gflops", bwd_gf}});
  }

  if (!f.json.empty()) {
    const nlohmann::json doc = {
        {"bench", "cpu_attention_bench"}, {"cpu", cpu_model()},
        {"openblas_core", corename},      {"threads", threads},
        {"seqlen", f.seqlen},             {"hdim", f.hdim},
        {"heads_q", hq},                  {"heads_kv", hkv},
        {"dtype", f.dtype},               {"iters", f.iters},
        {"sgemm_4096_gflops", square_gf},
        {"results", results}};
    std::ofstream(f.json) << doc.dump(2) << "\n";
  }
  return 0;
}
