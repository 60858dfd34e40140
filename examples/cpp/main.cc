// Attention over a varlen-causal mask on the CPU through the installed C++ package, checked
// against a direct computation of the same rows (CI builds and runs it: scripts/test.sh).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "magi/attention.h"
#include "magi/build_info.h"
#include "magi/mask_builders.h"

int main() {
  const std::int64_t n = 300, hq = 4, hkv = 2, d = 64;
  const std::vector<std::int64_t> cu = {0, 100, 250, 300};
  const magi::Mask mask = magi::masks::varlen_causal(cu);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::vector<float> q(n * hq * d), k(n * hkv * d), v(n * hkv * d), out(n * hq * d), lse(n * hq);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  magi::FwdArgs a{magi::make_view(q.data(), magi::DType::kF32, {n, hq, d}),
                  magi::make_view(k.data(), magi::DType::kF32, {n, hkv, d}),
                  magi::make_view(v.data(), magi::DType::kF32, {n, hkv, d}),
                  magi::make_view(out.data(), magi::DType::kF32, {n, hq, d}),
                  magi::make_view(lse.data(), magi::DType::kF32, {n, hq}),
                  std::nullopt, std::nullopt};
  magi::attn_forward(mask, a);

  // Row 180, head 3 (kv head 1): it sees keys 100..180 of its document.
  const std::int64_t row = 180, h = 3, g = h / (hq / hkv);
  std::vector<double> p;
  double m = -INFINITY, sum = 0, err = 0;
  for (std::int64_t j = 100; j <= row; ++j) {
    double s = 0;
    for (std::int64_t c = 0; c < d; ++c)
      s += double(q[(row * hq + h) * d + c]) * k[(j * hkv + g) * d + c];
    p.push_back(s / std::sqrt(double(d)));
    m = std::max(m, p.back());
  }
  for (double& x : p) sum += (x = std::exp(x - m));
  for (std::int64_t c = 0; c < d; ++c) {
    double o = 0;
    for (std::size_t j = 0; j < p.size(); ++j)
      o += p[j] / sum * v[((100 + std::int64_t(j)) * hkv + g) * d + c];
    err = std::max(err, std::abs(o - out[(row * hq + h) * d + c]));
  }
  const magi::BuildInfo info = magi::build_info();
  std::printf("magiattn %s (%s); row %lld head %lld: max |out - direct| = %.2e\n",
              info.version.c_str(), info.cpu_kernels.c_str(), static_cast<long long>(row),
              static_cast<long long>(h), err);
  if (!(err < 1e-5)) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
