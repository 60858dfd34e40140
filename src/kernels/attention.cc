// Public entry points of FFA: every check of docs/semantics.md §2 happens here, once, so a backend
// may assume well-formed views (backend.h). Strides are accepted as long as the last dim is
// unit-stride and outputs cannot alias themselves; anything else is rejected rather than copied, so
// a caller never pays for a hidden transpose.
#include "magi/attention.h"

#include <omp.h>

#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "backend.h"
#include "sm90/bwd_params.h"  // the forward's and the backward's workspace layouts
#include "magi/error.h"

namespace magi {
namespace {

std::string shape_str(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

bool same_shape(const TensorView& a, const TensorView& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

// An output whose elements overlap would be written by several threads at once. Sorted by
// stride, each dim must step past everything the smaller dims span.
void check_no_alias(const TensorView& t, const char* name) {
  std::array<int, TensorView::kMaxDims> order{};
  int n = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 1) continue;
    MAGI_CHECK(t.stride[d] != 0, name, ": zero stride in dim ", d, " of size ", t.shape[d],
               " makes its rows alias (", t.describe(), ")");
    order[n++] = d;
  }
  for (int i = 1; i < n; ++i)  // at most 4 dims: insertion sort by stride
    for (int j = i; j > 0 && t.stride[order[j]] < t.stride[order[j - 1]]; --j)
      std::swap(order[j], order[j - 1]);
  std::int64_t span = 1;  // elements covered by the dims placed so far
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    MAGI_CHECK(t.stride[d] >= span, name, ": stride ", t.stride[d], " of dim ", d,
               " overlaps the smaller dims, so distinct elements alias (", t.describe(), ")");
    span = t.stride[d] * (t.shape[d] - 1) + span;
  }
}

void check_view(const TensorView& t, const char* name, int ndim) {
  MAGI_CHECK(t.ndim == ndim, name, ": expected ", ndim, " dims, got ", t.ndim);
  for (int d = 0; d < ndim; ++d)
    MAGI_CHECK(t.shape[d] >= 0, name, ": negative size ", t.shape[d], " in dim ", d);
  MAGI_CHECK(t.data != nullptr || t.numel() == 0, name, ": null data with ", t.numel(),
             " elements (", t.describe(), ")");
  for (int d = 0; d < ndim; ++d)
    MAGI_CHECK(t.stride[d] >= 0, name, ": negative stride ", t.stride[d], " in dim ", d, " (",
               t.describe(), ")");
  MAGI_CHECK(t.shape[ndim - 1] <= 1 || t.stride[ndim - 1] == 1, name, ": last-dim stride ",
             t.stride[ndim - 1], " is not 1: non-contiguous strides the backend cannot honour (",
             t.describe(), ")");
}

std::string device_name(const TensorView& t) {
  return t.device == Device::kCPU ? "cpu" : "cuda:" + std::to_string(t.device_idx);
}

void check_device(const TensorView& t, const char* name, const TensorView& q) {
  MAGI_CHECK(t.device == q.device && (t.device == Device::kCPU || t.device_idx == q.device_idx),
             name, ": on ", device_name(t), " but q is on ", device_name(q));
}

bool on_gpu(const TensorView& q) { return q.device == Device::kCUDA; }

// What the sm90 kernel reads with 16-byte loads: 16-byte aligned rows and heads.
void check_gpu_input(const TensorView& t, const char* name) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 &&
                       (t.shape[0] <= 1 || t.stride[0] % 8 == 0) &&
                       (t.shape[1] <= 1 || t.stride[1] % 8 == 0);
  MAGI_CHECK(aligned, name, ": the GPU kernel needs 16-byte aligned data and row/head strides "
             "that are multiples of 8 elements, got ", t.describe());
}

void check_shape(const TensorView& t, const char* name, const TensorView& like,
                 const char* like_name) {
  MAGI_CHECK(same_shape(t, like), name, ": shape ", shape_str(t), " differs from ", like_name,
             " shape ", shape_str(like));
}

void check_dtype(const TensorView& t, const char* name, DType want, const char* why) {
  MAGI_CHECK(t.dtype == want, name, ": dtype ", dtype_name(t.dtype), " is not ", dtype_name(want),
             " (", why, ")");
}

// Checks q, k, v, the sink and the options shared by both directions; resolves the options.
kernels::Resolved resolve(const Mask& mask, const TensorView& q, const TensorView& k,
                          const TensorView& v, const std::optional<TensorView>& sink,
                          const AttnOptions& opts) {
  check_view(q, "q", 3);
  check_view(k, "k", 3);
  check_view(v, "v", 3);
  check_shape(v, "v", k, "k");
  check_device(k, "k", q);
  check_device(v, "v", q);
  check_dtype(k, "k", q.dtype, "k must match q");
  check_dtype(v, "v", q.dtype, "v must match q");
  MAGI_CHECK(q.shape[0] == mask.total_seqlen_q(), "q: ", q.shape[0],
             " tokens but the mask has total_seqlen_q ", mask.total_seqlen_q());
  MAGI_CHECK(k.shape[0] == mask.total_seqlen_k(), "k: ", k.shape[0],
             " tokens but the mask has total_seqlen_k ", mask.total_seqlen_k());
  const std::int64_t hq = q.shape[1], hkv = k.shape[1], d = q.shape[2];
  MAGI_CHECK(hq > 0, "q: no heads (shape ", shape_str(q), ")");
  MAGI_CHECK(hkv > 0, "k: no heads (shape ", shape_str(k), ")");
  MAGI_CHECK(hq % hkv == 0, "q: ", hq, " heads are not a multiple of the ", hkv,
             " heads of k and v");
  MAGI_CHECK(k.shape[2] == d, "k: head dim ", k.shape[2], " differs from q head dim ", d);
  MAGI_CHECK(d > 0 && d % 8 == 0, "q: head dim ", d, " is not a positive multiple of 8");
  MAGI_CHECK(d <= kMaxHeadDim, "q: head dim ", d, " exceeds kMaxHeadDim ", kMaxHeadDim);

  MAGI_CHECK(std::isfinite(opts.softcap) && opts.softcap >= 0, "softcap: ", opts.softcap,
             " must be finite and >= 0 (0 turns it off)");
  if (opts.softmax_scale)
    MAGI_CHECK(std::isfinite(*opts.softmax_scale) && *opts.softmax_scale != 0,
               "softmax_scale: ", *opts.softmax_scale, " must be finite and nonzero");
  MAGI_CHECK(opts.num_threads >= 0, "num_threads: ", opts.num_threads,
             " must be >= 0 (0 uses all hardware threads)");
  MAGI_CHECK(opts.sm_margin >= 0, "sm_margin: ", opts.sm_margin, " must be >= 0");

  kernels::Resolved r;
  r.compute = q.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  r.dims = {q.shape[0], k.shape[0], hq, hkv, d, 0};
  if (sink) {
    const bool sh = opts.sink_layout == SinkLayout::kSH;
    MAGI_CHECK(sink->ndim == (sh ? 2 : 3), "sink: ", sink->ndim, " dims, but layout ",
               sh ? "\"sh\" is [S_sink, Hq]" : "\"ssh\" is [Nq, S_sink, Hq]");
    check_view(*sink, "sink", sh ? 2 : 3);
    check_device(*sink, "sink", q);
    const TensorView& s = *sink;
    const std::int64_t len = s.shape[sh ? 0 : 1];
    if (sh)
      MAGI_CHECK(s.shape[1] == hq, "sink: shape ", shape_str(s), " is not [S_sink, Hq=", hq,
                 "] for layout \"sh\"");
    else
      MAGI_CHECK(s.shape[0] == q.shape[0] && s.shape[2] == hq, "sink: shape ", shape_str(s),
                 " is not [Nq=", q.shape[0], ", S_sink, Hq=", hq, "] for layout \"ssh\"");
    MAGI_CHECK(len >= 1 && len <= kMaxSinkLen, "sink: length ", len, " is not in [1, ",
               kMaxSinkLen, "] (kMaxSinkLen)");
    MAGI_CHECK(s.dtype == DType::kF32 || (s.dtype == DType::kF64 && r.compute == DType::kF64),
               "sink: dtype ", dtype_name(s.dtype), " is not fp32 (or fp64 with fp64 inputs)");
    r.dims.sink_len = len;
  }
  r.scale = opts.softmax_scale.value_or(1.0 / std::sqrt(double(d)));
  r.softcap = opts.softcap;
  r.sink_layout = opts.sink_layout;
  r.accumulate = opts.accumulate;
  r.deterministic = opts.deterministic;
  r.num_threads = opts.num_threads > 0 ? opts.num_threads : omp_get_max_threads();
  if (on_gpu(q)) {
#ifndef MAGI_HAS_SM90
    MAGI_FAIL("q: on ", device_name(q), " but this magiattn was built without CUDA "
              "(configure with nvcc and the nvidia-cutlass headers)");
#endif
    MAGI_CHECK(q.dtype == DType::kBF16 || q.dtype == DType::kF16, "q: dtype ",
               dtype_name(q.dtype), " is not bf16 or fp16 (the GPU kernels; fp32/fp64 run on CPU)");
    MAGI_CHECK(d == 64 || d == 128 || d == 192 || d == 256, "q: head dim ", d,
               " is not one of the GPU kernel's 64, 128, 192, 256");
    check_gpu_input(q, "q");
    check_gpu_input(k, "k");
    check_gpu_input(v, "v");
    MAGI_CHECK(!sink || sink->dtype == DType::kF32, "sink: must be fp32 on the GPU");
  }
  return r;
}

void check_lse(const TensorView& lse, const TensorView& q, const kernels::Resolved& r,
               bool output) {
  check_view(lse, "lse", 2);
  MAGI_CHECK(lse.shape[0] == r.dims.num_q && lse.shape[1] == r.dims.heads_q, "lse: shape ",
             shape_str(lse), " is not [Nq, Hq] of q shape ", shape_str(q));
  check_dtype(lse, "lse", r.compute, "lse is kept in the compute type");
  if (output) check_no_alias(lse, "lse");
}

// Outputs that are merged into must hold the compute type, or the merge would round twice.
void check_accumulable(const TensorView& t, const char* name, const kernels::Resolved& r) {
  if (r.accumulate) check_dtype(t, name, r.compute, "accumulate needs the compute type");
}

}  // namespace

SinkLayout sink_layout_from_name(std::string_view name) {
  if (name == "sh") return SinkLayout::kSH;
  if (name == "ssh") return SinkLayout::kSSH;
  MAGI_FAIL("sink layout '", name, "' is not \"sh\" or \"ssh\"");
}

std::size_t attn_forward_workspace_bytes(std::int64_t num_k, std::int64_t heads_kv) {
  MAGI_CHECK(num_k >= 0 && heads_kv >= 0, "attn_forward_workspace_bytes: negative Nk ", num_k,
             " or Hkv ", heads_kv);
  return kernels::sm90::fwd_workspace_layout(num_k, heads_kv).bytes;
}

std::size_t attn_backward_workspace_bytes(std::int64_t num_q, std::int64_t heads_q,
                                          std::int64_t head_dim) {
  MAGI_CHECK(num_q >= 0 && heads_q >= 0 && head_dim >= 0, "attn_backward_workspace_bytes: "
             "negative Nq ", num_q, ", Hq ", heads_q, " or D ", head_dim);
  return kernels::sm90::bwd_workspace_layout(num_q, heads_q, head_dim).bytes;
}

double attn_fwd_flops(std::int64_t area, std::int64_t num_heads_q, std::int64_t head_dim) {
  return 4.0 * double(area) * double(num_heads_q) * double(head_dim);
}

namespace {

// A caller's GPU workspace: at least `need` bytes (the call that says how many named in
// `formula`), non-null and 16-byte aligned.
template <class... Formula>
void check_workspace(const Workspace& w, std::size_t need, const Formula&... formula) {
  MAGI_CHECK(w.bytes >= need, "workspace: ", w.bytes, " bytes, but ", need, " are needed (",
             formula..., ")");
  MAGI_CHECK(reinterpret_cast<std::uintptr_t>(w.data) % 16 == 0 && w.data != nullptr,
             "workspace: the data pointer must be non-null and 16-byte aligned");
}

kernels::Resolved check_forward_args(const Mask& mask, const FwdArgs& a,
                                     const AttnOptions& opts) {
  const kernels::Resolved r = resolve(mask, a.q, a.k, a.v, a.sink, opts);
  check_view(a.out, "out", 3);
  check_device(a.out, "out", a.q);
  check_device(a.lse, "lse", a.q);
  check_shape(a.out, "out", a.q, "q");
  check_no_alias(a.out, "out");
  check_accumulable(a.out, "out", r);
  check_lse(a.lse, a.q, r, true);
  if (a.max_logits) {
    check_view(*a.max_logits, "max_logits", 1);
    MAGI_CHECK(a.max_logits->shape[0] == r.dims.heads_q, "max_logits: shape ",
               shape_str(*a.max_logits), " is not [Hq=", r.dims.heads_q, "]");
    check_no_alias(*a.max_logits, "max_logits");
    check_dtype(*a.max_logits, "max_logits", r.compute, "max_logits is kept in the compute type");
    check_device(*a.max_logits, "max_logits", a.q);
  }
  if (a.workspace && on_gpu(a.q))
    check_workspace(*a.workspace, attn_forward_workspace_bytes(r.dims.num_k, r.dims.heads_kv),
                    "attn_forward_workspace_bytes(Nk=", r.dims.num_k, ", Hkv=", r.dims.heads_kv,
                    ")");
  return r;
}

kernels::Resolved check_backward_args(const Mask& mask, const BwdArgs& a,
                                      const AttnOptions& opts) {
  const kernels::Resolved r = resolve(mask, a.q, a.k, a.v, a.sink, opts);
  if (on_gpu(a.q)) {
    check_gpu_input(a.dout, "dout");
    MAGI_CHECK(a.out.dtype != DType::kF64, "out: fp64 on the GPU");
  }
  check_view(a.dout, "dout", 3);
  check_device(a.dout, "dout", a.q);
  check_device(a.out, "out", a.q);
  check_device(a.lse, "lse", a.q);
  check_shape(a.dout, "dout", a.q, "q");
  check_dtype(a.dout, "dout", a.q.dtype, "dout must match q");
  check_view(a.out, "out", 3);
  check_shape(a.out, "out", a.q, "q");
  check_lse(a.lse, a.q, r, false);
  const std::pair<const TensorView*, const char*> grads[] = {
      {&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}};
  const TensorView* likes[] = {&a.q, &a.k, &a.v};
  const char* like_names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    check_view(*grads[i].first, grads[i].second, 3);
    check_device(*grads[i].first, grads[i].second, a.q);
    check_shape(*grads[i].first, grads[i].second, *likes[i], like_names[i]);
    check_no_alias(*grads[i].first, grads[i].second);
    check_accumulable(*grads[i].first, grads[i].second, r);
  }
  if (a.dsink) {
    MAGI_CHECK(a.sink.has_value(), "dsink: given without a sink");
    check_view(*a.dsink, "dsink", a.sink->ndim);
    check_device(*a.dsink, "dsink", a.q);
    check_shape(*a.dsink, "dsink", *a.sink, "sink");
    check_no_alias(*a.dsink, "dsink");
    check_dtype(*a.dsink, "dsink", a.sink->dtype, "dsink must match sink");
  }
  if (a.workspace && on_gpu(a.q))
    check_workspace(*a.workspace,
                    attn_backward_workspace_bytes(r.dims.num_q, r.dims.heads_q, r.dims.head_dim),
                    "attn_backward_workspace_bytes(Nq=", r.dims.num_q, ", Hq=", r.dims.heads_q,
                    ", D=", r.dims.head_dim, ")");
  return r;
}

}  // namespace

void validate_forward(const Mask& mask, const FwdArgs& a, const AttnOptions& opts) {
  check_forward_args(mask, a, opts);
}

void validate_backward(const Mask& mask, const BwdArgs& a, const AttnOptions& opts) {
  check_backward_args(mask, a, opts);
}

void attn_forward(const Mask& mask, const FwdArgs& a, const AttnOptions& opts) {
  const kernels::Resolved r = check_forward_args(mask, a, opts);
  MAGI_CHECK(!a.device_ranges, "device_ranges: only with a PreparedMask (the ranges it was "
             "prepared from are what they are checked against)");
#ifdef MAGI_HAS_SM90
  if (on_gpu(a.q))
    return kernels::sm90::forward(mask, nullptr, a, r, opts.sm_margin, opts.cuda_stream);
#endif
  kernels::cpu::forward(mask, a, r);
}

void attn_forward(const PreparedMask& pm, const FwdArgs& a, const AttnOptions& opts) {
  const kernels::Resolved r = check_forward_args(pm.mask(), a, opts);
  if (a.device_ranges) {
    const DeviceRanges& d = *a.device_ranges;
    MAGI_CHECK(d.count == std::int64_t(pm.mask().size()), "device_ranges: ", d.count,
               " slices but the prepared mask has ", pm.mask().size());
    const auto int_size = [](int b) { return b == 4 || b == 8; };
    MAGI_CHECK(int_size(d.range_bytes) && int_size(d.type_bytes),
               "device_ranges: element sizes ", d.range_bytes, " / ", d.type_bytes,
               " are not 4 or 8 bytes (int32 or int64)");
    MAGI_CHECK(d.count == 0 || (d.q != nullptr && d.k != nullptr),
               "device_ranges: null q or k ranges for ", d.count, " slices");
    MAGI_CHECK(on_gpu(a.q), "device_ranges: only for GPU calls (q is on ", device_name(a.q), ")");
  }
#ifdef MAGI_HAS_SM90
  if (on_gpu(a.q))
    return kernels::sm90::forward(pm.mask(), &pm, a, r, opts.sm_margin, opts.cuda_stream);
#endif
  kernels::cpu::forward(pm.mask(), a, r);
}

void attn_backward(const Mask& mask, const BwdArgs& a, const AttnOptions& opts) {
  const kernels::Resolved r = check_backward_args(mask, a, opts);
#ifdef MAGI_HAS_SM90
  if (on_gpu(a.q))
    return kernels::sm90::backward(mask, nullptr, a, r, opts.sm_margin, opts.cuda_stream);
#endif
  kernels::cpu::backward(mask, a, r);
}

void attn_backward(const PreparedMask& pm, const BwdArgs& a, const AttnOptions& opts) {
#ifdef MAGI_HAS_SM90
  if (on_gpu(a.q)) {
    const kernels::Resolved r = check_backward_args(pm.mask(), a, opts);
    return kernels::sm90::backward(pm.mask(), &pm, a, r, opts.sm_margin, opts.cuda_stream);
  }
#endif
  attn_backward(pm.mask(), a, opts);  // the CPU backward keeps nothing per mask
}

}  // namespace magi
