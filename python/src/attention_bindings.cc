// forward/backward write into caller-allocated arrays, exactly like the C++ entry points: the
// Python layer owns allocation (numpy or torch) and this layer only builds views. The GIL is
// released for the compute, so other Python threads (data loading, logging) keep running.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "magi/attention.h"
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

void backward(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
              nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, const Mask& mask,
              nb::handle sink, nb::handle dsink, std::optional<double> softmax_scale,
              double softcap, const std::string& sink_layout, bool accumulate, bool deterministic,
              int num_threads, int sm_margin) {
  const AttnOptions opts = attn_options(softmax_scale, softcap, sink_layout, accumulate,
                                        deterministic, num_threads, sm_margin);
  TensorArgs t;
  const BwdArgs a = bwd_args(t, dout, q, k, v, out, lse, dq, dk, dv, sink, dsink);
  nb::gil_scoped_release release;
  attn_backward(mask, a, opts);
}

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
  m.def("backward", &backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a,
        "dv"_a, "mask"_a, nb::kw_only(), "sink"_a.none() = nb::none(),
        "dsink"_a.none() = nb::none(), "softmax_scale"_a.none() = nb::none(),
        "softcap"_a = defaults.softcap, "sink_layout"_a = "sh",
        "accumulate"_a = defaults.accumulate, "deterministic"_a = defaults.deterministic,
        "num_threads"_a = defaults.num_threads, "sm_margin"_a = defaults.sm_margin,
        "FFA backward (docs/semantics.md §2) into dq, dk, dv (and dsink); returns None");
  m.def("fwd_flops", &attn_fwd_flops, "area"_a, "heads_q"_a, "head_dim"_a,
        "4 * area * heads_q * head_dim (docs/semantics.md §4); backward is 2.5x");
}

}  // namespace magi::py
