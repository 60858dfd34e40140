// FFA: attention over a slice-list mask (docs/semantics.md §2). One entry point per direction; the
// public functions validate everything once (shapes, dtypes, strides, head dims, sink) and then
// hand plain views to the backend chosen by the tensors' device.
//
// Layout THD: q [Nq, Hq, D], k and v [Nk, Hkv, D], out [Nq, Hq, D], lse [Nq, Hq].
// Compute type: fp64 when q is fp64, else fp32 (bf16/fp16 inputs are widened to fp32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "magi/mask.h"
#include "magi/prepared.h"
#include "magi/tensor.h"

namespace magi {

enum class SinkLayout : std::uint8_t {
  kSH,   // [S_sink, Hq]: one set of sink logits per head
  kSSH,  // [Nq, S_sink, Hq]: per query token
};
SinkLayout sink_layout_from_name(std::string_view name);  // "sh" | "ssh"

inline constexpr int kMaxSinkLen = 8;      // sink tokens per row
inline constexpr int kMaxHeadDim = 256;    // D: any multiple of 8 up to this

struct AttnOptions {
  std::optional<double> softmax_scale;  // default 1/sqrt(D)
  double softcap = 0.0;                 // 0: off; else S = c * tanh(S * scale / c)
  SinkLayout sink_layout = SinkLayout::kSH;
  // Forward: out/lse (fp32 or fp64, the compute type) already hold a partial result over
  // other slices; merge into it by the LSE rule and max into max_logits.
  // Backward: add into dq/dk/dv/dsink instead of overwriting them.
  bool accumulate = false;
  bool deterministic = false;  // CPU: always bitwise deterministic for a fixed thread count
  int num_threads = 0;         // CPU: 0 = all hardware threads
  int sm_margin = 0;           // GPU: SMs left free for communication kernels
  std::uintptr_t cuda_stream = 0;  // GPU: the cudaStream_t to run on (0: the default stream)
};

struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// The caller's range tensors as they live in device memory (GPU calls on a prepared mask):
// q and k ranges [N, 2] and types [N] (null: all full), contiguous int32 or int64. Each call
// compares them, on the device, with the slices the mask was prepared from; any difference (a
// write the caller's cache could not see, a CUDA graph replayed after the ranges changed)
// makes every out, lse and max_logits element NaN rather than a result for stale ranges.
struct DeviceRanges {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* types = nullptr;
  int range_bytes = 4;  // element size of q and k: 4 or 8
  int type_bytes = 4;   // element size of types: 4 or 8
  std::int64_t count = 0;
};

struct FwdArgs {
  TensorView q, k, v;
  TensorView out;                // [Nq, Hq, D], any float type (compute type if accumulate)
  TensorView lse;                // [Nq, Hq], compute type
  std::optional<TensorView> sink;        // fp32 or fp64, layout per options.sink_layout
  std::optional<TensorView> max_logits;  // [Hq], compute type: max of scale*q.k (pre-softcap)
  // GPU: per-call scratch (the scheduler's counter, K/V's NaN/inf row flags) of at least
  // attn_forward_workspace_bytes(Nk, Hkv) bytes, 16-byte aligned, on q's device, not used by
  // another call in flight. Absent: allocated on the stream per call (cudaMallocAsync).
  std::optional<Workspace> workspace = std::nullopt;
  std::optional<DeviceRanges> device_ranges = std::nullopt;  // GPU + PreparedMask only
};

struct BwdArgs {
  TensorView dout, q, k, v, out, lse;  // out/lse: the final forward results (after the sink)
  TensorView dq, dk, dv;               // shapes of q, k, v; compute type if accumulate
  std::optional<TensorView> sink;
  std::optional<TensorView> dsink;  // same shape and dtype as sink
  // GPU: per-call scratch (the fp32 dq accumulator, lse and Delta rows, the scheduler's
  // counter) of at least attn_backward_workspace_bytes(Nq, Hq, D) bytes, 16-byte aligned, on
  // q's device, not used by another call in flight. Absent: allocated on the stream per call
  // (cudaMallocAsync). A mask not prepared still allocates its work list per call.
  std::optional<Workspace> workspace = std::nullopt;
};

void attn_forward(const Mask& mask, const FwdArgs& args, const AttnOptions& opts = {});
// The same call on a prepared mask: on the GPU, its work list is built and uploaded on the
// first call per device and head dim, and reused after (prepared.h). Capturable in a CUDA
// graph once prepared, with a workspace.
void attn_forward(const PreparedMask& mask, const FwdArgs& args, const AttnOptions& opts = {});
void attn_backward(const PreparedMask& mask, const BwdArgs& args, const AttnOptions& opts = {});
// Bytes of FwdArgs::workspace for a GPU forward over num_k key tokens and heads_kv kv heads.
std::size_t attn_forward_workspace_bytes(std::int64_t num_k, std::int64_t heads_kv);
// Bytes of BwdArgs::workspace for a GPU backward over num_q query tokens, heads_q q heads and
// head dim head_dim: 4 * Hq * R * (D + 2) + 12 * Hq * R / 64 + 16 with R = Nq rounded up to 64.
std::size_t attn_backward_workspace_bytes(std::int64_t num_q, std::int64_t heads_q,
                                          std::int64_t head_dim);
void attn_backward(const Mask& mask, const BwdArgs& args, const AttnOptions& opts = {});

// Every check of attn_forward / attn_backward, and nothing else: no compute, no write, no
// device work. For callers that must fail before a collective (the distributed runtime).
void validate_forward(const Mask& mask, const FwdArgs& args, const AttnOptions& opts = {});
void validate_backward(const Mask& mask, const BwdArgs& args, const AttnOptions& opts = {});

// FLOP counts of docs/semantics.md §4: fwd = 4 * area * Hq * D, bwd = 2.5 * fwd.
double attn_fwd_flops(std::int64_t area, std::int64_t num_heads_q, std::int64_t head_dim);

}  // namespace magi
