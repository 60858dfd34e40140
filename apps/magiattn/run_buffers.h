// Host tensors of `magiattn run`: a contiguous buffer of one dtype, filled with portable
// seeded normals, and the nine tensors of one forward + backward. Inputs are in the run's
// dtype, outputs in the compute type, so the oracle check measures the kernels, not a final
// rounding.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <numbers>
#include <optional>
#include <random>
#include <vector>

#include "magi/attention.h"

namespace magi::cli {

// A contiguous host buffer of one dtype; set() rounds to the dtype and returns what it stored.
class Buffer {
 public:
  Buffer(DType dtype, std::int64_t numel)
      : dtype_(dtype), bytes_(std::size_t(numel) * std::size_t(dtype_size(dtype))) {}

  TensorView view(std::initializer_list<std::int64_t> shape) {
    return make_view(bytes_.data(), dtype_, shape);
  }

  double get(std::size_t i) const {
    switch (dtype_) {
      case DType::kF64:
        return load<double>(i);
      case DType::kF32:
        return load<float>(i);
      case DType::kBF16:
        return to_float(load<BF16>(i));
      case DType::kF16:
        return to_float(load<F16>(i));
    }
    return 0;
  }

  double set(std::size_t i, double x) {
    switch (dtype_) {
      case DType::kF64:
        store(i, x);
        break;
      case DType::kF32:
        store(i, float(x));
        break;
      case DType::kBF16:
        store(i, to_bf16(float(x)));
        break;
      case DType::kF16:
        store(i, to_f16(float(x)));
        break;
    }
    return get(i);
  }

  std::size_t numel() const { return bytes_.size() / std::size_t(dtype_size(dtype_)); }
  DType dtype() const { return dtype_; }
  // The raw bytes: what a GPU run uploads and downloads (device_run.h).
  void* data() { return bytes_.data(); }
  std::size_t bytes() const { return bytes_.size(); }

 private:
  template <typename T>
  T load(std::size_t i) const {
    T x;
    std::memcpy(&x, bytes_.data() + i * sizeof(T), sizeof(T));
    return x;
  }
  template <typename T>
  void store(std::size_t i, T x) {
    std::memcpy(bytes_.data() + i * sizeof(T), &x, sizeof(T));
  }

  DType dtype_;
  std::vector<std::byte> bytes_;
};

// Standard normals by Box-Muller over the top 53 bits of mt19937_64: the same inputs for a
// seed on every standard library (std::normal_distribution is not portable). Returns the
// stored (rounded) values in fp64, which the oracle reads.
inline std::vector<double> fill_normal(Buffer& buf, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto unit = [&] { return double(rng() >> 11) * 0x1.0p-53; };
  std::vector<double> exact(buf.numel());
  for (std::size_t i = 0; i < exact.size(); i += 2) {
    const double radius = std::sqrt(-2 * std::log(1 - unit()));  // 1 - u in (0, 1]
    const double angle = 2 * std::numbers::pi * unit();
    exact[i] = buf.set(i, radius * std::cos(angle));
    if (i + 1 < exact.size()) exact[i + 1] = buf.set(i + 1, radius * std::sin(angle));
  }
  return exact;
}

// Used for the whole problem and, distributed, for each rank's local rows.
struct AttnBuffers {
  std::int64_t nq, nk, hq, hkv, d;
  Buffer q, k, v, dout, out, lse, dq, dk, dv;

  AttnBuffers(DType in, DType compute, std::int64_t nq_, std::int64_t nk_, std::int64_t hq_,
              std::int64_t hkv_, std::int64_t d_)
      : nq(nq_), nk(nk_), hq(hq_), hkv(hkv_), d(d_),
        q(in, nq * hq * d), k(in, nk * hkv * d), v(in, nk * hkv * d), dout(in, nq * hq * d),
        out(compute, nq * hq * d), lse(compute, nq * hq), dq(compute, nq * hq * d),
        dk(compute, nk * hkv * d), dv(compute, nk * hkv * d) {}

  FwdArgs fwd(std::optional<TensorView> sink) {
    return FwdArgs{q.view({nq, hq, d}), k.view({nk, hkv, d}), v.view({nk, hkv, d}),
                   out.view({nq, hq, d}), lse.view({nq, hq}), sink, std::nullopt};
  }
  BwdArgs bwd(std::optional<TensorView> sink, std::optional<TensorView> dsink) {
    return BwdArgs{dout.view({nq, hq, d}), q.view({nq, hq, d}),   k.view({nk, hkv, d}),
                   v.view({nk, hkv, d}),   out.view({nq, hq, d}), lse.view({nq, hq}),
                   dq.view({nq, hq, d}),   dk.view({nk, hkv, d}), dv.view({nk, hkv, d}),
                   sink,                   dsink};
  }
};

}  // namespace magi::cli
