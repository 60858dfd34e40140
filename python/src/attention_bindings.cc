// forward/backward write into caller-allocated arrays, exactly like the C++ entry points: the
// Python layer owns allocation (numpy or torch) and this layer only builds views. The GIL is
// released for the compute, so other Python threads (data loading, logging) keep running.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <string>
#include <tuple>

#include "arrays.h"
#include "bindings.h"
#include "capi.h"
#include "magi/attention.h"
#include "magi/build_info.h"
#include "magi/error.h"
#include "options.h"

namespace magi::py {
namespace {

using namespace nb::literals;

void forward(nb::handle q, nb::handle k, nb::handle v, const Mask& mask, nb::handle out,
             nb::handle lse, nb::handle sink, nb::handle max_logits,
             std::optional<double> softmax_scale, double softcap, const std::string& sink_layout,
             bool accumulate, bool deterministic, int num_threads, int sm_margin,
             std::uintptr_t cuda_stream) {
  AttnOptions opts = attn_options(softmax_scale, softcap, sink_layout, accumulate, deterministic,
                                  num_threads, sm_margin);
  opts.cuda_stream = cuda_stream;
  TensorArgs t;  // pins the arrays until after the GIL is back
  const FwdArgs a = fwd_args(t, q, k, v, out, lse, sink, max_logits);
  nb::gil_scoped_release release;
  attn_forward(mask, a, opts);
}

// On a Mask or a PreparedMask (the GPU backward keeps its work list in the latter).
template <class M>
void backward(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
              nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, const M& mask,
              nb::handle sink, nb::handle dsink, std::optional<double> softmax_scale,
              double softcap, const std::string& sink_layout, bool accumulate, bool deterministic,
              int num_threads, int sm_margin, std::uintptr_t cuda_stream, nb::handle workspace) {
  AttnOptions opts = attn_options(softmax_scale, softcap, sink_layout, accumulate,
                                  deterministic, num_threads, sm_margin);
  opts.cuda_stream = cuda_stream;
  TensorArgs t;
  BwdArgs a = bwd_args(t, dout, q, k, v, out, lse, dq, dk, dv, sink, dsink);
  a.workspace = t.workspace(workspace, a.q);
  nb::gil_scoped_release release;
  attn_backward(mask, a, opts);
}

// (q, k, types data pointers (types 0: none), range element bytes, type element bytes, count)
using RangePointers =
    std::tuple<std::uintptr_t, std::uintptr_t, std::uintptr_t, int, int, std::int64_t>;

// The per-call path of the torch front (functional.py's cache hit): positional arguments, the
// tensors as DLPack capsules, the workspace as a uint8 CUDA tensor (torch's caching allocator).
void forward_prepared(nb::handle q, nb::handle k, nb::handle v, const PreparedMask& mask,
                      nb::handle out, nb::handle lse, nb::handle workspace, nb::handle sink,
                      nb::handle max_logits, std::optional<double> softmax_scale, double softcap,
                      const std::string& sink_layout, bool deterministic, int sm_margin,
                      std::uintptr_t cuda_stream, const std::optional<RangePointers>& ranges) {
  AttnOptions opts = attn_options(softmax_scale, softcap, sink_layout, false, deterministic, 0,
                                  sm_margin);
  opts.cuda_stream = cuda_stream;
  TensorArgs t;
  FwdArgs a = fwd_args(t, q, k, v, out, lse, sink, max_logits);
  a.workspace = t.workspace(workspace, a.q);
  if (ranges) {
    const auto& [q_ptr, k_ptr, types_ptr, range_bytes, type_bytes, count] = *ranges;
    a.device_ranges = DeviceRanges{reinterpret_cast<const void*>(q_ptr),
                                   reinterpret_cast<const void*>(k_ptr),
                                   reinterpret_cast<const void*>(types_ptr), range_bytes,
                                   type_bytes, count};
  }
  nb::gil_scoped_release release;
  attn_forward(mask, a, opts);
}

void copy_message(const char* what, char* err, std::size_t err_len) {
  if (err_len == 0) return;
  std::strncpy(err, what, err_len - 1);
  err[err_len - 1] = '\0';
}

CApiStatus capi_forward(const PreparedMask& mask, const FwdArgs& args, AttnOptions opts,
                        const char* sink_layout, char* err, std::size_t err_len) {
  try {
    opts.sink_layout = sink_layout_from_name(sink_layout);
    attn_forward(mask, args, opts);
    return CApiStatus::kOk;
  } catch (const Error& e) {
    copy_message(e.what(), err, err_len);
    return CApiStatus::kInvalid;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, err_len);
    return CApiStatus::kFailed;
  }
}

const PreparedMask* capi_prepared(PyObject* obj) {
  nb::handle h(obj);
  return nb::isinstance<PreparedMask>(h) ? nb::inst_ptr<PreparedMask>(h) : nullptr;
}

std::int64_t load(const void* base, int bytes, std::int64_t index) {
  return bytes == 8 ? static_cast<const std::int64_t*>(base)[index]
                    : static_cast<const std::int32_t*>(base)[index];
}

bool capi_same_ranges(const PreparedMask& mask, const HostRanges& r) {
  const std::vector<Slice>& slices = mask.mask().slices();
  if (r.count != std::int64_t(slices.size())) return false;
  for (std::int64_t i = 0; i < r.count; ++i) {
    const Slice& s = slices[std::size_t(i)];
    const std::int64_t type =
        r.types == nullptr ? 0 : load(r.types, r.type_bytes, i * r.types_stride);
    if (load(r.q, r.range_bytes, i * r.q_stride[0]) != s.q_range.start ||
        load(r.q, r.range_bytes, i * r.q_stride[0] + r.q_stride[1]) != s.q_range.end ||
        load(r.k, r.range_bytes, i * r.k_stride[0]) != s.k_range.start ||
        load(r.k, r.range_bytes, i * r.k_stride[0] + r.k_stride[1]) != s.k_range.end ||
        type != std::int64_t(s.type)) {
      return false;
    }
  }
  return true;
}

const CApi kCApi{1, &capi_prepared, &capi_forward, &attn_forward_workspace_bytes,
                 &capi_same_ranges};

}  // namespace

void bind_attention(nb::module_& m) {
  const AttnOptions defaults;
  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "mask"_a, "out"_a, "lse"_a, nb::kw_only(),
        "sink"_a.none() = nb::none(), "max_logits"_a.none() = nb::none(),
        "softmax_scale"_a.none() = nb::none(), "softcap"_a = defaults.softcap,
        "sink_layout"_a = "sh", "accumulate"_a = defaults.accumulate,
        "deterministic"_a = defaults.deterministic, "num_threads"_a = defaults.num_threads,
        "sm_margin"_a = defaults.sm_margin, "cuda_stream"_a = 0,
        "FFA forward (docs/semantics.md §2) into out [Nq, Hq, D] and lse [Nq, Hq]; returns None. CUDA "
        "tensors run on cuda_stream (a cudaStream_t as an int; 0: the default stream) and "
        "leave sm_margin SMs free; the CPU ignores sm_margin (it must still be >= 0)");
  nb::class_<PreparedMask>(m, "PreparedMask",
                           "A Mask with its GPU work lists, built on first use per device and "
                           "head dim and reused by every call (forward_prepared)")
      .def(nb::init<Mask>(), "mask"_a)
      .def_prop_ro("mask", &PreparedMask::mask, nb::rv_policy::reference_internal)
      .def_prop_ro("device_bytes", &PreparedMask::device_bytes,
                   "device memory held by its work lists")
      .def_prop_ro("num_states", &PreparedMask::num_states,
                   "(device, tile shape) work lists built so far");
  m.def("forward_prepared", &forward_prepared, "q"_a, "k"_a, "v"_a, "mask"_a, "out"_a, "lse"_a,
        "workspace"_a.none(), "sink"_a.none(), "max_logits"_a.none(), "softmax_scale"_a.none(),
        "softcap"_a, "sink_layout"_a, "deterministic"_a, "sm_margin"_a, "cuda_stream"_a,
        "device_ranges"_a.none() = nb::none(),
        "forward on a PreparedMask (positional; see forward); workspace: None or a uint8 "
        "tensor of forward_workspace_bytes(Nk, Hkv) bytes on q's device; device_ranges: None "
        "or (q_ranges ptr, k_ranges ptr, types ptr or 0, range bytes, type bytes, count) of "
        "the caller's CUDA range tensors, compared on the device with the prepared ones (a "
        "difference makes out and lse NaN)");
  m.attr("_capi") = nb::capsule(&kCApi, kCApiCapsule);  // for magiattn._torch (capi.h)
  m.def("forward_workspace_bytes", &attn_forward_workspace_bytes, "num_k"_a, "heads_kv"_a,
        "bytes of the GPU forward's per-call workspace");
  m.def("backward_workspace_bytes", &attn_backward_workspace_bytes, "num_q"_a, "heads_q"_a,
        "head_dim"_a, "bytes of the GPU backward's per-call workspace");
  auto def_backward = [&](auto fn) {
    m.def("backward", fn, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a,
          "dv"_a, "mask"_a, nb::kw_only(), "sink"_a.none() = nb::none(),
          "dsink"_a.none() = nb::none(), "softmax_scale"_a.none() = nb::none(),
          "softcap"_a = defaults.softcap, "sink_layout"_a = "sh",
          "accumulate"_a = defaults.accumulate, "deterministic"_a = defaults.deterministic,
          "num_threads"_a = defaults.num_threads, "sm_margin"_a = defaults.sm_margin,
          "cuda_stream"_a = 0, "workspace"_a.none() = nb::none(),
          "FFA backward (docs/semantics.md §2) into dq, dk, dv (and dsink) on a Mask or a "
          "PreparedMask; returns None. CUDA tensors run on cuda_stream (a cudaStream_t as an "
          "int; 0: the default stream); workspace: None (allocated per call) or a uint8 tensor "
          "of backward_workspace_bytes(Nq, Hq, D) bytes on q's device");
  };
  def_backward(&backward<Mask>);
  def_backward(&backward<PreparedMask>);
  m.def("build_info", [] {
    const BuildInfo b = build_info();
    nb::list gpus;
    for (const GpuInfo& g : b.gpus) {
      nb::dict d;
      d["index"] = g.index;
      d["name"] = g.name;
      d["compute_capability"] = std::to_string(g.major) + "." + std::to_string(g.minor);
      d["sms"] = g.sms;
      gpus.append(d);
    }
    nb::dict d;
    d["version"] = b.version;
    d["cpu_isa"] = b.cpu_isa;
    d["cpu_kernels"] = b.cpu_kernels;
    d["cpu_features"] = b.cpu_features;
    d["cuda"] = b.cuda;
    d["cuda_version"] = b.cuda_version;
    d["sm90_forward"] = b.sm90_forward;
    d["gpus"] = gpus;
    d["gpu_error"] = b.gpu_error;
    return d;
  }, "what this build has (CPU ISA, CUDA, sm90 kernel variants) and the GPUs it sees");
  m.def("fwd_flops", &attn_fwd_flops, "area"_a, "heads_q"_a, "head_dim"_a,
        "4 * area * heads_q * head_dim (docs/semantics.md §4); backward is 2.5x");
}

}  // namespace magi::py
