// Host side of the sm90 backward (bwd_params.h has the three launches): finds the key-tile work
// list (resident in a PreparedMask, or built and uploaded per call), lays out the per-call
// workspace (the caller's, or cudaMallocAsync per call), and queues the row pass, the main
// kernel and the dq / dsink pass on the caller's stream.
#include <cuda_runtime.h>

#include <algorithm>

#include "../backend.h"
#include "bwd_kernel.cuh"
#include "device_work.h"
#include "fwd_instances.h"
#include "host_common.h"
#include "magi/error.h"

#define MAGI_CUDA_CHECK(expr, what) MAGI_CUDA_CHECK_IN("GPU backward", expr, what)

namespace magi::kernels::sm90 {
namespace {

__device__ inline float load_float(const void* x, std::int64_t i, OutType t) {
  switch (t) {
    case OutType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
    case OutType::kF16: return __half2float(static_cast<const __half*>(x)[i]);
    default: return static_cast<const float*>(x)[i];
  }
}

struct RowsArgs {
  OutType out_type, dout_type;
  std::int32_t head_dim;
  bool vec;    // q, out and dout 2-byte, their strides and pointers on 16-byte boundaries, D % 8 == 0
  bool bf16;   // q is bf16 (else fp16)
  int lanes;   // per row: vec, the power of 2 at or above D / 8; else 32
};

// Two 2-byte values of type t (kBF16 or kF16) packed in w, as floats.
__device__ inline float2 unpack2(unsigned w, OutType t) {
  if (t == OutType::kBF16) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// ra.lanes lanes per (row, q head), 256 threads a block: Delta = rowsum(out * dout) in fp32 and
// lse in log2 units into the workspace rows [Hq][rows_pad]; rows past num_q get lse +inf and
// Delta 0 (P = 0 there). Rows whose q or dout hold a NaN/inf get their bit in the block's word
// of q_bad (the main kernel zeroes them in its Q / dO tiles, so that the 0 of P and dS on the
// cells they do not see stays 0); such a row, or one whose Delta is not finite (a NaN/inf in
// out), that sees a key (lse finite) gets lse NaN: the cells it sees give NaN gradients
// (docs/numerics.md). The main kernel is this pass's programmatic dependent.
constexpr int kRowThreads = 256;
__global__ void __launch_bounds__(kRowThreads) bwd_rows(BwdParams p, RowsArgs ra) {
  detail::launch_dependents();
  const int lane = int(threadIdx.x) % 32, sub = lane % ra.lanes;
  const std::int64_t row =
      (std::int64_t(blockIdx.x) * kRowThreads + threadIdx.x) / ra.lanes;
  const int h = int(blockIdx.y);
  const bool live = row < p.num_q;
  float acc = 0.f;
  bool bad = false;
  if (live && ra.vec) {  // 8 columns per lane, 16-byte loads
    using U16 = unsigned short;
    for (int c = sub * 8; c < ra.head_dim; c += 8 * ra.lanes) {
      const auto at = [&](const void* x, std::int64_t rs, std::int64_t hs) {
        return *reinterpret_cast<const uint4*>(static_cast<const U16*>(x) + row * rs + h * hs + c);
      };
      const uint4 o = at(p.out, p.o_row, p.o_head), g = at(p.dout, p.do_row, p.do_head);
      const uint4 q = at(p.q, p.q_row, p.q_head);
      bad |= (ra.bf16 ? detail::non_finite8<true>(q) : detail::non_finite8<false>(q)) ||
             (ra.dout_type == OutType::kBF16 ? detail::non_finite8<true>(g)
                                             : detail::non_finite8<false>(g));
      const unsigned ow[4] = {o.x, o.y, o.z, o.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = unpack2(ow[e], ra.out_type), b = unpack2(gw[e], ra.dout_type);
        acc += a.x * b.x + a.y * b.y;
      }
    }
  } else if (live) {
    const OutType qt = ra.bf16 ? OutType::kBF16 : OutType::kF16;
    for (int c = sub; c < ra.head_dim; c += 32) {
      const float g = load_float(p.dout, row * p.do_row + h * p.do_head + c, ra.dout_type);
      bad |= !isfinite(g) || !isfinite(load_float(p.q, row * p.q_row + h * p.q_head + c, qt));
      acc += load_float(p.out, row * p.o_row + h * p.o_head + c, ra.out_type) * g;
    }
  }
  for (int off = ra.lanes / 2; off > 0; off >>= 1) {
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
    bad = __shfl_xor_sync(0xffffffffu, int(bad), off) != 0 || bad;
  }
  if (sub != 0 || row >= p.rows_pad) return;
  float* lse2 = p.lse2 + std::int64_t(h) * p.rows_pad + row;
  float* delta = p.delta + std::int64_t(h) * p.rows_pad + row;
  if (!live) {
    *lse2 = INFINITY, *delta = 0.f;
    return;
  }
  const float lse = p.lse_in[row * p.lse_row + h * p.lse_head];
  const bool poisoned = lse != -INFINITY && (!isfinite(lse) || !isfinite(acc) || bad);
  *lse2 = poisoned ? __int_as_float(0x7fffffff) : lse * detail::kLog2e;
  *delta = acc;
  if (bad) atomicOr(p.q_bad + std::int64_t(h) * (p.rows_pad / 64) + row / 64, 1ull << (row % 64));
}

// dsink_j = -sum_q exp(sink_j - lse_q) Delta_q (docs/semantics.md): per head over all rows for
// "sh" (a block per (j, head), summed in a fixed order: deterministic), per row for "ssh".
struct SinkArgs {
  const float* sink = nullptr;
  float* dsink = nullptr;
  std::int64_t row = 0, s = 0, head = 0;  // strides of sink and dsink (row 0: "sh")
  std::int64_t drow = 0, ds = 0, dhead = 0;
  std::int32_t len = 0;
  bool ssh = false;
};

__device__ inline float sink_term(const BwdParams& p, float sink, std::int64_t q, int h) {
  const float lse = p.lse_in[q * p.lse_row + h * p.lse_head];
  const float lse2 = p.lse2[std::int64_t(h) * p.rows_pad + q];
  if (lse == -INFINITY) return 0.f;
  if (lse2 != lse2) return __int_as_float(0x7fffffff);  // a poisoned row
  return -expf(sink - lse) * p.delta[std::int64_t(h) * p.rows_pad + q];
}

__global__ void bwd_dsink_sh(BwdParams p, SinkArgs sa) {
  const int j = int(blockIdx.x), h = int(blockIdx.y);
  const float sink = sa.sink[j * sa.s + h * sa.head];
  float acc = 0.f;
  for (std::int64_t q = threadIdx.x; q < p.num_q; q += blockDim.x) acc += sink_term(p, sink, q, h);
  __shared__ float part[32];
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x != 0) return;
  float sum = 0.f;
  for (int w = 0; w < int(blockDim.x) / 32; ++w) sum += part[w];
  float* out = sa.dsink + j * sa.ds + h * sa.dhead;
  *out = p.accumulate ? *out + sum : sum;
}

__global__ void bwd_dsink_ssh(BwdParams p, SinkArgs sa) {
  const std::int64_t n = std::int64_t(p.num_q) * sa.len * p.heads_q;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int h = int(i % p.heads_q);
    const std::int64_t j = (i / p.heads_q) % sa.len, q = i / (std::int64_t(p.heads_q) * sa.len);
    const float g = sink_term(p, sa.sink[q * sa.row + j * sa.s + h * sa.head], q, h);
    float* out = sa.dsink + q * sa.drow + j * sa.ds + h * sa.dhead;
    *out = p.accumulate ? *out + g : g;
  }
}

struct Launchers {
  cudaError_t (*main)(const BwdParams&, int, std::int64_t, cudaStream_t) = nullptr;
  cudaError_t (*dq)(const BwdParams&, cudaStream_t) = nullptr;
};

Launchers find_launchers(DType t, std::int64_t d) {
#define MAGI_SM90_CASE(T, D, DT) \
  if (t == DType::DT && d == D) return {&launch_backward<T, D>, &launch_backward_dq<T, D>};
  MAGI_SM90_BWD_INSTANCES(MAGI_SM90_CASE)
#undef MAGI_SM90_CASE
  return {};
}

}  // namespace

void backward(const Mask& mask, const PreparedMask* prepared, const BwdArgs& a,
              const Resolved& r, int sm_margin, std::uintptr_t stream_handle) {
  const Dims& dm = r.dims;
  const Launchers launch = find_launchers(a.q.dtype, dm.head_dim);
  MAGI_CHECK(launch.main != nullptr, "GPU backward: no kernel for q dtype ", dtype_name(a.q.dtype),
             " and head dim ", dm.head_dim, " (the sm90 backward has head dims 64, 128, 192 and 256; "
             "forward kernels built: ", MAGI_SM90_FWD_BUILT, ")");
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const int device = a.q.device_idx;
  use_device(device, "GPU backward");

  BwdParams p;
  p.q = a.q.data, p.k = a.k.data, p.v = a.v.data, p.out = a.out.data, p.dout = a.dout.data;
  p.lse_in = static_cast<const float*>(a.lse.data);
  p.dq = a.dq.data, p.dk = a.dk.data, p.dv = a.dv.data;
  p.q_row = a.q.stride[0], p.q_head = a.q.stride[1];
  p.k_row = a.k.stride[0], p.k_head = a.k.stride[1];
  p.v_row = a.v.stride[0], p.v_head = a.v.stride[1];
  p.o_row = a.out.stride[0], p.o_head = a.out.stride[1];
  p.do_row = a.dout.stride[0], p.do_head = a.dout.stride[1];
  p.lse_row = a.lse.stride[0], p.lse_head = a.lse.stride[1];
  p.dq_row = a.dq.stride[0], p.dq_head = a.dq.stride[1];
  p.dk_row = a.dk.stride[0], p.dk_head = a.dk.stride[1];
  p.dv_row = a.dv.stride[0], p.dv_head = a.dv.stride[1];
  p.dq_type = out_type(a.dq.dtype, "dq");
  p.dk_type = out_type(a.dk.dtype, "dk");
  p.dv_type = out_type(a.dv.dtype, "dv");
  p.num_q = std::int32_t(dm.num_q), p.num_k = std::int32_t(dm.num_k);
  p.heads_q = std::int32_t(dm.heads_q), p.heads_kv = std::int32_t(dm.heads_kv);
  p.scale = float(r.scale);
  p.softcap = float(r.softcap);
  p.accumulate = r.accumulate;
  p.deterministic = r.deterministic;
  const auto pairs = [](const TensorView& t) {
    return t.stride[0] % 2 == 0 && t.stride[1] % 2 == 0 &&
           reinterpret_cast<std::uintptr_t>(t.data) % (2 * dtype_size(t.dtype)) == 0;
  };
  p.dkv_pairs = pairs(a.dk) && pairs(a.dv);
  // 8 columns from a multiple of 8 (the dq pass's pieces, the row pass's loads) on a 16-byte
  // boundary: strides in multiples of 8 elements and the base aligned.
  const auto by8 = [](const TensorView& t) {
    return t.stride[0] % 8 == 0 && t.stride[1] % 8 == 0 &&
           reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0;
  };
  p.dq_vec = by8(a.dq);
  const int d = int(dm.head_dim);
  if (dm.num_q == 0 && dm.num_k == 0) return;

  // The key-tile work list: resident in the prepared mask (built on its first call per
  // device), or built now and uploaded behind the workspace in the per-call allocation.
  const BwdWorkspaceLayout ws = bwd_workspace_layout(dm.num_q, dm.heads_q, d);
  WorkImage img;
  if (prepared != nullptr) {
    const DeviceWork& work =
        device_work(*prepared, device, bwd_block_m(d), bwd_block_n(d), TileAxis::kKey);
    p.tiles = work.tiles(), p.pieces = work.pieces(), p.num_tiles = work.num_tiles();
    p.tickets = work.tickets();
  } else {
    img = work_image(mask, bwd_block_m(d), bwd_block_n(d), TileAxis::kKey, false);
    p.num_tiles = img.num_tiles;
  }
  // The caller's workspace (attention.cc checked its size and alignment), or one allocation
  // per call; a mask not prepared uploads its work list behind it.
  const bool own_scratch = !a.workspace.has_value();
  const std::size_t image_off = own_scratch ? align16(ws.bytes) : 0;
  StreamFree owned{nullptr, stream};
  if (own_scratch || prepared == nullptr)
    MAGI_CUDA_CHECK(cudaMallocAsync(&owned.ptr, image_off + img.bytes.size(), stream),
                    "workspace allocation");
  auto* base = static_cast<unsigned char*>(own_scratch ? owned.ptr : a.workspace->data);
  if (prepared == nullptr) {
    auto* dev = static_cast<unsigned char*>(owned.ptr) + image_off;
    MAGI_CUDA_CHECK(cudaMemcpyAsync(dev, img.bytes.data(), img.bytes.size(),
                                    cudaMemcpyHostToDevice, stream),
                    "work list upload");
    p.tiles = reinterpret_cast<const Tile*>(dev);
    p.pieces = reinterpret_cast<const Piece*>(dev + img.pieces_off);
    p.tickets = reinterpret_cast<const std::int32_t*>(dev + img.tickets_off);
  }
  p.counter = reinterpret_cast<std::int32_t*>(base);
  p.lse2 = reinterpret_cast<float*>(base + ws.lse_off);
  p.delta = reinterpret_cast<float*>(base + ws.delta_off);
  p.rows_pad = ws.rows_pad;
  p.dq_acc = reinterpret_cast<float*>(base + ws.dq_off);
  p.turns = reinterpret_cast<std::int32_t*>(base + ws.turns_off);
  p.q_bad = reinterpret_cast<unsigned long long*>(base + ws.q_bad_off);
  MAGI_CUDA_CHECK(cudaMemsetAsync(base, 0, 16, stream), "counter zeroing");
  MAGI_CUDA_CHECK(cudaMemsetAsync(p.dq_acc, 0, ws.bytes - ws.dq_off, stream),
                  "dq accumulator, turn counters and row flags zeroing");

  const auto vec16 = [&](const TensorView& t) { return dtype_size(t.dtype) == 2 && by8(t); };
  int lanes = 32;
  const bool vec = d % 8 == 0 && vec16(a.q) && vec16(a.out) && vec16(a.dout);
  if (vec)
    for (lanes = 1; lanes < d / 8;) lanes *= 2;
  const RowsArgs ra{out_type(a.out.dtype, "out"), out_type(a.dout.dtype, "dout"),
                    std::int32_t(d), vec, a.q.dtype == DType::kBF16, lanes};
  {
    const std::int64_t threads = ws.rows_pad * lanes;
    const dim3 grid(unsigned((threads + kRowThreads - 1) / kRowThreads), unsigned(dm.heads_q));
    bwd_rows<<<grid, kRowThreads, 0, stream>>>(p, ra);
    MAGI_CUDA_CHECK(cudaGetLastError(), "row pass launch");
  }
  if (dm.num_k > 0 && dm.num_q > 0) {
    const int sms = std::max(1, sm_count(device) - sm_margin);
    MAGI_CUDA_CHECK(launch.main(p, sms, std::int64_t(p.num_tiles) * dm.heads_kv, stream),
                    "kernel launch");
  } else if (dm.num_k > 0 && !r.accumulate) {  // no rows: dk = dv = 0
    for (const TensorView* t : {&a.dk, &a.dv})
      MAGI_CHECK(t->is_contiguous(), "GPU backward: ", t == &a.dk ? "dk" : "dv",
                 " must be contiguous when there are no query rows");
    const auto bytes = [](const TensorView& t) {
      return std::size_t(t.numel()) * dtype_size(t.dtype);
    };
    MAGI_CUDA_CHECK(cudaMemsetAsync(a.dk.data, 0, bytes(a.dk), stream), "dk zeroing");
    MAGI_CUDA_CHECK(cudaMemsetAsync(a.dv.data, 0, bytes(a.dv), stream), "dv zeroing");
  }
  if (dm.num_q > 0) MAGI_CUDA_CHECK(launch.dq(p, stream), "dq pass launch");
  if (a.dsink) {
    const bool ssh = r.sink_layout == SinkLayout::kSSH;
    SinkArgs sa;
    sa.sink = static_cast<const float*>(a.sink->data);
    sa.dsink = static_cast<float*>(a.dsink->data);
    sa.len = std::int32_t(dm.sink_len);
    sa.ssh = ssh;
    sa.row = ssh ? a.sink->stride[0] : 0;
    sa.s = a.sink->stride[ssh ? 1 : 0];
    sa.head = a.sink->stride[ssh ? 2 : 1];
    sa.drow = ssh ? a.dsink->stride[0] : 0;
    sa.ds = a.dsink->stride[ssh ? 1 : 0];
    sa.dhead = a.dsink->stride[ssh ? 2 : 1];
    if (ssh)
      bwd_dsink_ssh<<<unsigned(std::min<std::int64_t>(
                          (dm.num_q * dm.sink_len * dm.heads_q + 255) / 256, 65535)),
                      256, 0, stream>>>(p, sa);
    else
      bwd_dsink_sh<<<dim3(unsigned(dm.sink_len), unsigned(dm.heads_q)), 256, 0, stream>>>(p, sa);
    MAGI_CUDA_CHECK(cudaGetLastError(), "dsink launch");
  }
}

}  // namespace magi::kernels::sm90
