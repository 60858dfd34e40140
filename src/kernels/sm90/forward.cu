// Host side of the sm90 forward: builds the work list, uploads it with the scheduler's counter
// in one stream-ordered allocation (which also holds the NaN/inf row flags of K and V, written
// by flag_bad_rows), fills max_logits, picks the instantiation for (dtype, D) and launches on
// the caller's stream. Nothing here synchronises with the device.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "../backend.h"
#include "fwd_instances.h"
#include "fwd_kernel.cuh"
#include "magi/error.h"

namespace magi::kernels::sm90 {
namespace {

#define MAGI_CUDA_CHECK(expr, what)                                                   \
  do {                                                                                \
    const cudaError_t magi_err_ = (expr);                                             \
    MAGI_CHECK(magi_err_ == cudaSuccess, "GPU forward: ", what, ": ",                 \
               cudaGetErrorName(magi_err_), " (", cudaGetErrorString(magi_err_), ")"); \
  } while (0)

__global__ void fill_kernel(float* x, int n, float value) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = value;
}

// One warp per (32 key rows, kv head): bit j of the word is set when row 32 * word + j of K or
// of V holds a NaN or inf (docs/numerics.md). One read of K and V, about 1 % of a 32k causal
// forward; words past the last row (the padding the kernel's unaligned reads touch) are 0.
template <bool kBf16>
__global__ void flag_bad_rows(FwdParams p, int chunks, unsigned* flags, unsigned* any) {
  const int word = int(blockIdx.x), head = int(blockIdx.y), lane = int(threadIdx.x);
  unsigned bits = 0;
  for (int i = lane; i < 32 * chunks; i += 32) {
    const int r = i / chunks, row = 32 * word + r, c = i % chunks;
    if (row >= p.num_k) break;
    const auto* k = static_cast<const std::uint16_t*>(p.k) + row * p.k_row + head * p.k_head;
    const auto* v = static_cast<const std::uint16_t*>(p.v) + row * p.v_row + head * p.v_head;
    const uint4 kc = reinterpret_cast<const uint4*>(k)[c], vc = reinterpret_cast<const uint4*>(v)[c];
    if (detail::non_finite8<kBf16>(kc) || detail::non_finite8<kBf16>(vc)) bits |= 1u << r;
  }
  bits = __reduce_or_sync(0xffffffffu, bits);
  if (lane == 0) flags[std::int64_t(head) * gridDim.x + word] = bits;
  if (lane == 0 && bits != 0u) atomicOr(&any[head], 1u);
}

using Launcher = cudaError_t (*)(const FwdParams&, int, std::int64_t, cudaStream_t);

Launcher find_launcher(DType t, std::int64_t d) {
#define MAGI_SM90_CASE(T, D, DT) \
  if (t == DType::DT && d == D) return &launch_forward<T, D>;
  MAGI_SM90_FWD_INSTANCES(MAGI_SM90_CASE)
#undef MAGI_SM90_CASE
  return nullptr;
}

OutType out_type(DType t) {
  switch (t) {
    case DType::kBF16: return OutType::kBF16;
    case DType::kF16: return OutType::kF16;
    case DType::kF32: return OutType::kF32;
    default: MAGI_FAIL("out: dtype ", dtype_name(t), " is not bf16, fp16 or fp32 on the GPU");
  }
}

int sm_count(int device) {
  int n = 0;
  MAGI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
                  "multiprocessor count");
  return n;
}

}  // namespace

void forward(const Mask& mask, const FwdArgs& a, const Resolved& r, int sm_margin,
             std::uintptr_t stream_handle) {
  const Dims& dm = r.dims;
  const Launcher launch = find_launcher(a.q.dtype, dm.head_dim);
  MAGI_CHECK(launch != nullptr, "GPU forward: no kernel for q dtype ", dtype_name(a.q.dtype),
             " and head dim ", dm.head_dim, " (built: ", MAGI_SM90_FWD_BUILT,
             "; configure with -DMAGI_CUDA_KERNELS=all for every variant)");
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  MAGI_CUDA_CHECK(cudaSetDevice(a.q.device_idx), "cudaSetDevice");

  FwdParams p;
  p.q = a.q.data, p.k = a.k.data, p.v = a.v.data, p.out = a.out.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.q_row = a.q.stride[0], p.q_head = a.q.stride[1];
  p.k_row = a.k.stride[0], p.k_head = a.k.stride[1];
  p.v_row = a.v.stride[0], p.v_head = a.v.stride[1];
  p.o_row = a.out.stride[0], p.o_head = a.out.stride[1];
  p.lse_row = a.lse.stride[0], p.lse_head = a.lse.stride[1];
  if (a.sink) {
    p.sink = static_cast<const float*>(a.sink->data);
    p.sink_len = std::int32_t(dm.sink_len);
    const bool ssh = r.sink_layout == SinkLayout::kSSH;
    p.sink_row = ssh ? a.sink->stride[0] : 0;
    p.sink_s = a.sink->stride[ssh ? 1 : 0];
    p.sink_head = a.sink->stride[ssh ? 2 : 1];
  }
  p.num_q = std::int32_t(dm.num_q), p.num_k = std::int32_t(dm.num_k);
  p.heads_q = std::int32_t(dm.heads_q), p.heads_kv = std::int32_t(dm.heads_kv);
  p.scale = float(r.scale);
  p.softcap = float(r.softcap);
  p.out_type = out_type(a.out.dtype);
  p.accumulate = r.accumulate;
  p.out_pairs = p.o_row % 2 == 0 && p.o_head % 2 == 0 &&
                reinterpret_cast<std::uintptr_t>(p.out) % (2 * dtype_size(a.out.dtype)) == 0;

  if (a.max_logits) {
    p.max_logits = static_cast<float*>(a.max_logits->data);
    MAGI_CHECK(a.max_logits->stride[0] == 1 || dm.heads_q == 1,
               "max_logits: must be contiguous on the GPU, got ", a.max_logits->describe());
    if (!r.accumulate) {
      fill_kernel<<<int((dm.heads_q + 255) / 256), 256, 0, stream>>>(p.max_logits,
                                                                  int(dm.heads_q), -INFINITY);
      MAGI_CUDA_CHECK(cudaGetLastError(), "max_logits fill");
    }
  }
  if (dm.num_q == 0) return;

  const WorkList w = make_work_list(mask, fwd_block_m(int(dm.head_dim)),
                                    fwd_block_n(int(dm.head_dim)));
  // One allocation: counter, per-head any-flag words, tiles, pieces, row flags (each 16-byte
  // aligned). The row flags are written on the device; the rest is uploaded (zeros included).
  const std::size_t any_off = 16;
  const std::size_t tiles_off = (any_off + dm.heads_kv * sizeof(unsigned) + 15) / 16 * 16;
  const std::size_t tiles_bytes = w.tiles.size() * sizeof(Tile);
  const std::size_t pieces_off = (tiles_off + tiles_bytes + 15) / 16 * 16;
  const std::size_t flags_off = (pieces_off + w.pieces.size() * sizeof(Piece) + 15) / 16 * 16;
  const int flag_words = int((dm.num_k + 31) / 32) + detail::kBadWords + 1;
  const std::size_t upload = flags_off;
  const std::size_t bytes = flags_off + std::size_t(flag_words) * dm.heads_kv * sizeof(unsigned);
  std::vector<unsigned char> host(upload, 0);
  std::memcpy(host.data() + tiles_off, w.tiles.data(), tiles_bytes);
  std::memcpy(host.data() + pieces_off, w.pieces.data(), w.pieces.size() * sizeof(Piece));
  void* dev = nullptr;
  MAGI_CUDA_CHECK(cudaMallocAsync(&dev, bytes, stream), "work list allocation");
  auto* base = static_cast<unsigned char*>(dev);
  const cudaError_t copied = cudaMemcpyAsync(dev, host.data(), upload, cudaMemcpyHostToDevice, stream);
  if (copied != cudaSuccess) cudaFreeAsync(dev, stream);
  MAGI_CUDA_CHECK(copied, "work list upload");
  p.counter = reinterpret_cast<std::int32_t*>(base);
  p.tiles = reinterpret_cast<const Tile*>(base + tiles_off);
  p.pieces = reinterpret_cast<const Piece*>(base + pieces_off);
  p.num_tiles = std::int32_t(w.tiles.size());
  auto* flags = reinterpret_cast<unsigned*>(base + flags_off);
  auto* any = reinterpret_cast<unsigned*>(base + any_off);
  p.bad_rows = flags, p.bad_any = any, p.bad_words = flag_words;
  const dim3 flag_grid(unsigned(flag_words), unsigned(dm.heads_kv));
  const int chunks = int(dm.head_dim / 8);
  if (a.k.dtype == DType::kBF16)
    flag_bad_rows<true><<<flag_grid, 32, 0, stream>>>(p, chunks, flags, any);
  else
    flag_bad_rows<false><<<flag_grid, 32, 0, stream>>>(p, chunks, flags, any);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    cudaFreeAsync(dev, stream);
    MAGI_CUDA_CHECK(e, "row flag launch");
  }

  const std::int64_t items = std::int64_t(w.tiles.size()) * dm.heads_q;
  const int sms = std::max(1, sm_count(a.q.device_idx) - sm_margin);
  const cudaError_t launched = launch(p, sms, items, stream);
  cudaFreeAsync(dev, stream);  // stream-ordered: after the kernel
  MAGI_CUDA_CHECK(launched, "kernel launch");
}

}  // namespace magi::kernels::sm90
