// Host side of the sm90 forward: finds the work list (resident in a PreparedMask, or built and
// uploaded per call), launches the pre-pass that readies the per-call workspace (the
// scheduler's counter and the NaN/inf row flags of K and V, flag_bad_rows) and fills
// max_logits, then the instantiation for (dtype, D), on the caller's stream: two launches. A
// call on a prepared mask with a workspace is capturable in a CUDA graph: stream work only,
// nothing synchronises.
#include <cuda_runtime.h>

#include <algorithm>

#include "../backend.h"
#include "device_work.h"
#include "fwd_instances.h"
#include "fwd_kernel.cuh"
#include "host_common.h"
#include "magi/error.h"
#include "magi/prepared.h"

namespace magi::kernels::sm90 {
namespace {

#define MAGI_CUDA_CHECK(expr, what) MAGI_CUDA_CHECK_IN("GPU forward", expr, what)

__global__ void fill_kernel(float* x, int n, float value) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = value;
}

// One block per (32 key rows, kv head): bit j of the word is set when row 32 * word + j of K
// or of V holds a NaN or inf (docs/numerics.md). Every thread issues all its loads before it
// tests any (up to 4 of K and 4 of V at D 256), so the pass runs at memory bandwidth even where
// K and V are a few MB (2k tokens: 10 us with one warp a block and one load in flight, now
// 4). Words past the last row (the padding the kernel's unaligned reads touch) are 0.
// The pass also readies the workspace for this call (fwd_params.h FwdWorkspaceLayout: the
// counters zeroed, the flagged heads marked, stale ranges marked for this call; no memset)
// and fills max_logits with -inf where the kernel maxes into it. With a RangeCheck, the
// blocks of kv head 0 also compare the caller's device ranges with the prepared copy. The
// forward kernel is launched as this pass's programmatic dependent: it may start as soon as
// every block here has started, and reads nothing the pass writes before the pass completed.
constexpr int kFlagThreads = 256;
constexpr int kFlagLoads = 4;  // per thread and tensor: 32 rows x D / 8 chunks
static_assert(kFlagThreads * kFlagLoads >= 32 * 256 / 8, "the largest kernel head dim, 256");
template <bool kBf16>
__global__ void __launch_bounds__(kFlagThreads) flag_bad_rows(FwdParams p, int chunks,
                                                              unsigned* flags, unsigned* any,
                                                              RangeCheck rc) {
  detail::launch_dependents();
  __shared__ unsigned warp_bits[kFlagThreads / 32];
  const int word = int(blockIdx.x), head = int(blockIdx.y), t = int(threadIdx.x);
  const int block = head * int(gridDim.x) + word;
  if (block == 0 && t == 0) *p.counter = 0, *p.done = 0;
  if (p.max_logits != nullptr && !p.accumulate) {
    for (int i = block * kFlagThreads + t; i < p.heads_q;
         i += int(gridDim.x * gridDim.y) * kFlagThreads)
      p.max_logits[i] = -INFINITY;
  }
  uint4 kc[kFlagLoads], vc[kFlagLoads];
  bool live[kFlagLoads];
#pragma unroll
  for (int j = 0; j < kFlagLoads; ++j) {
    const int i = t + j * kFlagThreads, row = 32 * word + i / chunks;
    live[j] = i < 32 * chunks && row < p.num_k;
    if (!live[j]) continue;
    const auto* k = static_cast<const std::uint16_t*>(p.k) + row * p.k_row + head * p.k_head;
    const auto* v = static_cast<const std::uint16_t*>(p.v) + row * p.v_row + head * p.v_head;
    kc[j] = reinterpret_cast<const uint4*>(k)[i % chunks];
    vc[j] = reinterpret_cast<const uint4*>(v)[i % chunks];
  }
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < kFlagLoads; ++j)
    if (live[j] && (detail::non_finite8<kBf16>(kc[j]) || detail::non_finite8<kBf16>(vc[j])))
      bits |= 1u << ((t + j * kFlagThreads) / chunks);
  bits = __reduce_or_sync(0xffffffffu, bits);
  if (t % 32 == 0) warp_bits[t / 32] = bits;
  __syncthreads();
  if (t == 0) {
    unsigned all = 0;
    for (unsigned b : warp_bits) all |= b;
    flags[std::int64_t(head) * gridDim.x + word] = all;
    if (all != 0u) any[head] = 1u;
  }
  if (rc.count == 0 || head != 0) return;
  // Head 0's blocks also compare the caller's ranges with the prepared ones, a slice a thread.
  auto load = [](const void* base, int bytes, int i) {
    return bytes == 8 ? static_cast<const long long*>(base)[i]
                      : static_cast<long long>(static_cast<const int*>(base)[i]);
  };
  bool differs = false;
  for (int i = word * kFlagThreads + t; i < rc.count; i += int(gridDim.x) * kFlagThreads) {
    const std::int32_t* e = rc.expect + 5 * i;
    differs |= load(rc.q, rc.range_bytes, 2 * i) != e[0] ||
               load(rc.q, rc.range_bytes, 2 * i + 1) != e[1] ||
               load(rc.k, rc.range_bytes, 2 * i) != e[2] ||
               load(rc.k, rc.range_bytes, 2 * i + 1) != e[3] ||
               (rc.types == nullptr ? 0 : load(rc.types, rc.type_bytes, i)) != e[4];
  }
  if (__any_sync(0xffffffffu, differs) && t % 32 == 0) *rc.stale = fwd_stale_mark(*p.epoch);
}

using Launcher = cudaError_t (*)(const FwdParams&, int, std::int64_t, cudaStream_t);

Launcher find_launcher(DType t, std::int64_t d) {
#define MAGI_SM90_CASE(T, D, DT) \
  if (t == DType::DT && d == D) return &launch_forward<T, D>;
  MAGI_SM90_FWD_INSTANCES(MAGI_SM90_CASE)
#undef MAGI_SM90_CASE
  return nullptr;
}

}  // namespace

CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                      const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                      CUtensorMapFloatOOBfill oob) {
  using Fn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                          CUtensorMapFloatOOBfill);
  static const Fn fn = [] {
    void* pfn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pfn, 12000,
                                                           cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<Fn>(pfn)
                                                                    : nullptr;
  }();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return fn(map, type, rank, address, dims, strides, box, element_strides, interleave, swizzle,
            l2, oob);
}

void forward(const Mask& mask, const PreparedMask* prepared, const FwdArgs& a, const Resolved& r,
             int sm_margin, std::uintptr_t stream_handle) {
  const Dims& dm = r.dims;
  const Launcher launch = find_launcher(a.q.dtype, dm.head_dim);
  MAGI_CHECK(launch != nullptr, "GPU forward: no kernel for q dtype ", dtype_name(a.q.dtype),
             " and head dim ", dm.head_dim, " (built: ", MAGI_SM90_FWD_BUILT,
             "; configure with -DMAGI_CUDA_KERNELS=all for every variant)");
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const int device = a.q.device_idx;
  use_device(device, "GPU forward");

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
  p.out_type = out_type(a.out.dtype, "out");
  p.accumulate = r.accumulate;
  p.out_pairs = p.o_row % 2 == 0 && p.o_head % 2 == 0 &&
                reinterpret_cast<std::uintptr_t>(p.out) % (2 * dtype_size(a.out.dtype)) == 0;
  p.out_rows16 = p.out_type != OutType::kF32 && !p.accumulate && p.o_row % 8 == 0 &&
                 p.o_head % 8 == 0 && reinterpret_cast<std::uintptr_t>(p.out) % 16 == 0;

  if (a.max_logits) {
    p.max_logits = static_cast<float*>(a.max_logits->data);
    MAGI_CHECK(a.max_logits->stride[0] == 1 || dm.heads_q == 1,
               "max_logits: must be contiguous on the GPU, got ", a.max_logits->describe());
    if (!r.accumulate && dm.num_q == 0) {  // else the pre-pass fills it
      fill_kernel<<<int((dm.heads_q + 255) / 256), 256, 0, stream>>>(p.max_logits,
                                                                  int(dm.heads_q), -INFINITY);
      MAGI_CUDA_CHECK(cudaGetLastError(), "max_logits fill");
    }
  }
  if (dm.num_q == 0) return;

  // The work list: resident in the prepared mask (built on its first call per device and
  // head dim), or built now and uploaded behind the workspace in one per-call allocation.
  const FwdWorkspaceLayout ws = fwd_workspace_layout(dm.num_k, dm.heads_kv);
  const int d = int(dm.head_dim);
  WorkImage img;
  const std::int32_t* expect = nullptr;
  if (prepared != nullptr) {
    const DeviceWork& work =
        device_work(*prepared, device, fwd_block_m(d), fwd_block_n(d), TileAxis::kQuery);
    p.tiles = work.tiles(), p.pieces = work.pieces(), p.num_tiles = work.num_tiles();
    expect = work.slices();
  } else {
    img = work_image(mask, fwd_block_m(d), fwd_block_n(d), TileAxis::kQuery, false);
    p.num_tiles = img.num_tiles;
  }
  const bool own_scratch = !a.workspace.has_value();
  const std::size_t image_off = own_scratch ? align16(ws.bytes) : 0;
  StreamFree owned{nullptr, stream};
  if (own_scratch || prepared == nullptr)
    MAGI_CUDA_CHECK(cudaMallocAsync(&owned.ptr, image_off + img.bytes.size(), stream),
                    "per-call work list allocation");
  auto* scratch = static_cast<unsigned char*>(own_scratch ? owned.ptr : a.workspace->data);
  if (prepared == nullptr) {
    auto* dev = static_cast<unsigned char*>(owned.ptr) + image_off;
    MAGI_CUDA_CHECK(cudaMemcpyAsync(dev, img.bytes.data(), img.bytes.size(),
                                    cudaMemcpyHostToDevice, stream),
                    "work list upload");
    p.tiles = reinterpret_cast<const Tile*>(dev);
    p.pieces = reinterpret_cast<const Piece*>(dev + img.pieces_off);
  }
  p.counter = reinterpret_cast<std::int32_t*>(scratch);
  p.done = reinterpret_cast<unsigned*>(scratch + ws.done_off);
  p.epoch = reinterpret_cast<unsigned long long*>(scratch + ws.epoch_off);
  auto* flags = reinterpret_cast<unsigned*>(scratch + ws.flags_off);
  auto* any = reinterpret_cast<unsigned*>(scratch + ws.any_off);
  p.bad_rows = flags, p.bad_any = any, p.bad_words = ws.bad_words;
  RangeCheck rc;
  if (a.device_ranges && expect != nullptr) {
    const DeviceRanges& dr = *a.device_ranges;
    rc = RangeCheck{dr.q, dr.k, dr.types, dr.range_bytes, dr.type_bytes,
                    std::int32_t(dr.count), expect,
                    reinterpret_cast<unsigned long long*>(scratch + ws.stale_off)};
    p.stale = rc.stale;
  }
  const dim3 flag_grid(unsigned(ws.bad_words), unsigned(dm.heads_kv));
  const int chunks = int(dm.head_dim / 8);
  if (a.k.dtype == DType::kBF16)
    flag_bad_rows<true><<<flag_grid, kFlagThreads, 0, stream>>>(p, chunks, flags, any, rc);
  else
    flag_bad_rows<false><<<flag_grid, kFlagThreads, 0, stream>>>(p, chunks, flags, any, rc);
  MAGI_CUDA_CHECK(cudaGetLastError(), "row flag launch");

  const std::int64_t items = std::int64_t(p.num_tiles) * dm.heads_q;
  const int sms = std::max(1, sm_count(device) - sm_margin);
  MAGI_CUDA_CHECK(launch(p, sms, items, stream), "kernel launch");
}

}  // namespace magi::kernels::sm90
