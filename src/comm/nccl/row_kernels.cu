// Segment kernels (row_kernels.h). Grid: y walks the segments, x the units of one segment, so one
// launch serves every peer's rows whatever their sizes. Reductions keep layout.cc's operation
// order; the __*_rn intrinsics keep nvcc from fusing a multiply and an add into an FMA (which
// the host code, compiled with -ffp-contract=off under -std=c++20, never does).
#include "row_kernels.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "magi/error.h"

namespace magi::comm::nccl {
namespace {

constexpr int kThreads = 256;

__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ inline double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float exp_(float x) { return expf(x); }
__device__ inline double exp_(double x) { return exp(x); }
__device__ inline float log1p_(float x) { return log1pf(x); }
__device__ inline double log1p_(double x) { return log1p(x); }
__device__ inline float abs_(float x) { return fabsf(x); }
__device__ inline double abs_(double x) { return fabs(x); }
// std::max(a, b): b when a < b, else a (so max(-0, +0) is -0, as on the host).
template <typename T>
__device__ inline T max_(T a, T b) { return a < b ? b : a; }
// magi::nan_max.
template <typename T>
__device__ inline T nan_max(T a, T b) { return isnan(a) || isnan(b) ? add_rn(a, b) : max_(a, b); }

// The widest access that every address and size of the segment is aligned to.
__device__ inline int unit_of(const Segment& s) {
  const auto bits = reinterpret_cast<std::uintptr_t>(s.src) | reinterpret_cast<std::uintptr_t>(s.dst) |
                    std::uintptr_t(s.src_pitch) | std::uintptr_t(s.dst_pitch) | std::uintptr_t(s.width);
  return bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : 1;
}

// Unit-sized copy of one segment, by the blocks of grid row blockIdx.y.
template <typename U>
__device__ void copy_segment(const Segment& s) {
  const std::int64_t w = s.width / std::int64_t(sizeof(U)), total = s.rows * w;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / w, c = i % w;
    reinterpret_cast<U*>(s.dst + r * s.dst_pitch)[c] =
        reinterpret_cast<const U*>(s.src + r * s.src_pitch)[c];
  }
}

__global__ void copy_kernel(const Segment* segments, int n) {
  for (int k = blockIdx.y; k < n; k += gridDim.y) {
    const Segment s = segments[k];
    switch (unit_of(s)) {
      case 16: copy_segment<uint4>(s); break;
      case 8: copy_segment<unsigned long long>(s); break;
      case 4: copy_segment<unsigned>(s); break;
      default: copy_segment<unsigned char>(s); break;
    }
  }
}

// layout.cc combine_typed, kSum / kMax.
template <typename T, bool kMax>
__global__ void reduce_kernel(const Segment* segments, int n) {
  for (int k = blockIdx.y; k < n; k += gridDim.y) {
    const Segment s = segments[k];
    const T scale = T(s.scale);
    const std::int64_t w = s.width / std::int64_t(sizeof(T)), total = s.rows * w;
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
         i += std::int64_t(gridDim.x) * blockDim.x) {
      const std::int64_t r = i / w, c = i % w;
      T& dst = reinterpret_cast<T*>(s.dst + r * s.dst_pitch)[c];
      const T in = reinterpret_cast<const T*>(s.src + r * s.src_pitch)[c];
      if constexpr (kMax)
        dst = nan_max(dst, in);
      else
        dst = add_rn(dst, scale == T(1) ? in : mul_rn(in, scale));
    }
  }
}

// layout.cc lse_merge: one warp per (row, head); every lane computes the same weights from the
// same inputs, strides over the head's d elements, and lane 0 writes the lse once all lanes
// have read it.
template <typename T>
__global__ void lse_kernel(const LseSegment* segments, int n, std::int64_t heads, std::int64_t d) {
  constexpr T kNegInf = -INFINITY;
  const int lane = threadIdx.x % 32;
  const std::int64_t warp = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) / 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * blockDim.x / 32;
  for (int k = blockIdx.y; k < n; k += gridDim.y) {
    const LseSegment s = segments[k];
    for (std::int64_t i = warp; i < s.rows * heads; i += warps) {
      const std::int64_t r = i / heads, h = i % heads;
      T* o = reinterpret_cast<T*>(s.out) + (r * heads + h) * d;
      T* l = reinterpret_cast<T*>(s.lse) + r * heads + h;
      const T* oc = reinterpret_cast<const T*>(s.src + r * s.src_pitch) + h * d;
      const T lc = reinterpret_cast<const T*>(s.src + r * s.src_pitch)[heads * d + h];
      const T la = *l;
      if (lc == kNegInf) continue;  // warp-uniform: every lane has the same (r, h)
      T merged = lc;
      if (la == kNegInf) {
        for (std::int64_t e = lane; e < d; e += 32) o[e] = oc[e];
      } else {
        const T m = max_(la, lc);
        merged = add_rn(m, log1p_(exp_(-abs_(sub_rn(la, lc)))));
        const T wa = exp_(sub_rn(la, merged)), wc = exp_(sub_rn(lc, merged));
        for (std::int64_t e = lane; e < d; e += 32) o[e] = add_rn(mul_rn(wa, o[e]), mul_rn(wc, oc[e]));
      }
      __syncwarp();  // every lane has read *l
      if (lane == 0) *l = merged;
    }
  }
}

dim3 grid_for(int n, std::int64_t units_per_segment, int units_per_block) {
  const std::int64_t x = std::clamp<std::int64_t>((units_per_segment + units_per_block - 1) / units_per_block, 1, 1024);
  return dim3(unsigned(x), unsigned(std::min(n, 65535)));
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  MAGI_CHECK(e == cudaSuccess, "NCCL communicator: launching the ", what, " kernel failed: ",
             cudaGetErrorString(e));
}

}  // namespace

void launch_rows(RowOp op, DType dtype, const Segment* segments, int n, std::int64_t max_bytes,
                 cudaStream_t stream) {
  if (n <= 0 || max_bytes <= 0) return;
  // A thread moves about 16 bytes per pass; wider segments loop.
  const dim3 grid = grid_for(n, max_bytes, kThreads * 16);
  if (op == RowOp::kCopy) {
    copy_kernel<<<grid, kThreads, 0, stream>>>(segments, n);
  } else {
    MAGI_CHECK(dtype == DType::kF32 || dtype == DType::kF64,
               "NCCL communicator: reductions need fp32 or fp64, got ", dtype_name(dtype));
    const bool f64 = dtype == DType::kF64;
    if (op == RowOp::kSum)
      f64 ? reduce_kernel<double, false><<<grid, kThreads, 0, stream>>>(segments, n)
          : reduce_kernel<float, false><<<grid, kThreads, 0, stream>>>(segments, n);
    else
      f64 ? reduce_kernel<double, true><<<grid, kThreads, 0, stream>>>(segments, n)
          : reduce_kernel<float, true><<<grid, kThreads, 0, stream>>>(segments, n);
  }
  check_launch(op == RowOp::kCopy ? "copy" : op == RowOp::kSum ? "sum" : "max");
}

void launch_lse_merge(DType dtype, const LseSegment* segments, int n, std::int64_t max_rows,
                      std::int64_t heads, std::int64_t d, cudaStream_t stream) {
  if (n <= 0 || max_rows <= 0 || heads <= 0) return;
  MAGI_CHECK(dtype == DType::kF32 || dtype == DType::kF64,
             "NCCL communicator: lse merge needs fp32 or fp64, got ", dtype_name(dtype));
  const dim3 grid = grid_for(n, max_rows * heads, kThreads / 32);
  if (dtype == DType::kF64)
    lse_kernel<double><<<grid, kThreads, 0, stream>>>(segments, n, heads, d);
  else
    lse_kernel<float><<<grid, kThreads, 0, stream>>>(segments, n, heads, d);
  check_launch("lse merge");
}

}  // namespace magi::comm::nccl
