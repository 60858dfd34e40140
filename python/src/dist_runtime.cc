// The runtime calls for Python: arrays in, runtime::* on this rank, GIL released while it runs.
// Key decision: forward/backward first run the attention kernel on an EMPTY mask over the
// same local arrays. That validates every argument (dtypes, heads, head dim, sink, options)
// with the kernels' own checks and messages before the first message is posted; a check that
// failed after the first K/V cast was posted would abandon it and leave the communicator
// broken. The dry run only writes outputs (zeros, -inf lse), which the runtime overwrites.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "arrays.h"
#include "dist.h"
#include "magi/error.h"
#include "magi/runtime.h"
#include "options.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace magi::py::dist {
namespace {

using plan::DistPlan;

// Runs a collective with the GIL released; a failure that left the communicator broken
// (timeout, dead peer, MPI or NCCL error) becomes CommFailure, anything else stays magi::Error.
template <typename F>
void collective(Comm& c, const char* op, F&& f) {
  comm::Communicator& mc = c.get(op);
  try {
    nb::gil_scoped_release release;
    f(mc);
  } catch (const Error& e) {
    if (!mc.broken()) throw;
    throw CommFailure(std::string(op) + ": communication failed and the communicator is now " +
                      "unusable (every rank should stop): " + e.what());
  }
}

// The checks of runtime::calc_attn_* that must precede the dry run (its mask is local-sized).
void check_local_rows(const DistPlan& p, const comm::Communicator& c,
                      std::initializer_list<std::pair<const TensorView*, const char*>> ts) {
  MAGI_CHECK(c.size() == int(p.ranks.size()), "the key's plan is for cp ", p.ranks.size(),
             " but the communicator has ", c.size(), " ranks");
  const std::int64_t nl = p.dispatch.rank_tokens(c.rank());
  for (const auto& [t, name] : ts)
    MAGI_CHECK(t->ndim >= 1 && t->shape[0] == nl, name, ": ", t->describe(), " has ",
               t->ndim ? t->shape[0] : 0, " rows, but rank ", c.rank(), " holds ", nl, " tokens");
}

// cuda_stream (every call): the CUDA stream, as an integer, that orders device arrays'
// producers and consumers (torch's current stream); 0 for host arrays.
void dispatch(const DistPlan& p, Comm& c, nb::handle global, nb::handle local,
              std::uintptr_t cuda_stream) {
  TensorArgs t;
  const TensorView g = t.input(global, "x"), l = t.output(local, "local");
  collective(c, "dispatch",
             [&](comm::Communicator& mc) { runtime::dispatch(p, mc, g, l, cuda_stream); });
}

void undispatch(const DistPlan& p, Comm& c, nb::handle local, nb::handle global,
                std::uintptr_t cuda_stream) {
  TensorArgs t;
  const TensorView l = t.input(local, "x"), g = t.output(global, "global");
  collective(c, "undispatch",
             [&](comm::Communicator& mc) { runtime::undispatch(p, mc, l, g, cuda_stream); });
}

void roll(const DistPlan& p, Comm& c, nb::handle local_in, nb::handle local_out,
          std::int64_t shift, std::uintptr_t cuda_stream) {
  TensorArgs t;
  const TensorView in = t.input(local_in, "x"), out = t.output(local_out, "out");
  collective(c, "roll", [&](comm::Communicator& mc) {
    runtime::roll(p, mc, in, out, shift, std::nullopt, cuda_stream);
  });
}

void forward(const DistPlan& p, Comm& c, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
             nb::handle lse, nb::handle sink, nb::handle max_logits,
             std::optional<double> softmax_scale, double softcap, int num_threads,
             const runtime::PreparedRank* prepared, std::uintptr_t cuda_stream,
             nb::handle workspace, int sm_margin) {
  AttnOptions opts = attn_options(softmax_scale, softcap, "sh", false, false, num_threads);
  opts.cuda_stream = cuda_stream;
  opts.sm_margin = sm_margin;
  TensorArgs t;
  FwdArgs a = fwd_args(t, q, k, v, out, lse, sink, max_logits);
  a.workspace = t.workspace(workspace, a.q);
  collective(c, "calc_attn", [&](comm::Communicator& mc) {
    check_local_rows(p, mc, {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}});
    runtime::calc_attn_forward(p, mc, a, opts, nullptr, prepared);  // validates first
  });
}

void backward(const DistPlan& p, Comm& c, nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
              nb::handle out, nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv,
              nb::handle sink, nb::handle dsink, std::optional<double> softmax_scale,
              double softcap, int num_threads, const runtime::PreparedRank* prepared,
              std::uintptr_t cuda_stream, nb::handle workspace, int sm_margin) {
  AttnOptions opts = attn_options(softmax_scale, softcap, "sh", false, false, num_threads);
  opts.cuda_stream = cuda_stream;
  opts.sm_margin = sm_margin;
  TensorArgs t;
  BwdArgs a = bwd_args(t, dout, q, k, v, out, lse, dq, dk, dv, sink, dsink);
  a.workspace = t.workspace(workspace, a.q);
  collective(c, "calc_attn backward", [&](comm::Communicator& mc) {
    check_local_rows(p, mc, {{&a.dout, "dout"}, {&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}});
    runtime::calc_attn_backward(p, mc, a, opts, nullptr, prepared);  // validates first
  });
}

void all_reduce(Comm& c, nb::handle data, const std::string& op, std::uintptr_t cuda_stream) {
  MAGI_CHECK(op == "sum" || op == "max", "all_reduce: op '", op, "' is not \"sum\" or \"max\"");
  TensorArgs t;
  const TensorView x = t.output(data, "x");
  MAGI_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kF64,
             "x: all_reduce needs float32 or float64, got ", dtype_name(x.dtype));
  MAGI_CHECK(x.is_contiguous(), "x: must be contiguous, got ", x.describe());
  collective(c, "all_reduce", [&](comm::Communicator& mc) {
    runtime::all_reduce(mc, x, op == "sum" ? comm::ReduceOp::kSum : comm::ReduceOp::kMax,
                        cuda_stream);
  });
}

// The key's bytes (mask, plan, config, heads: whatever must be equal on every rank) hashed here
// with comm::fingerprint, so the Python key and any C++ caller use one definition.
void check_agree(Comm& c, nb::bytes key, const std::string& what) {
  const auto* b = static_cast<const std::byte*>(key.data());
  const std::uint64_t fp = comm::fingerprint({b, key.size()});
  collective(c, "key check", [&](comm::Communicator& mc) { comm::check_agree(mc, fp, what); });
}

void barrier(Comm& c) {
  collective(c, "barrier", [](comm::Communicator& mc) { mc.barrier(); });
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::class_<runtime::PreparedRank>(m, "PreparedRank",
                                    "One rank's stage masks of a plan, validated and prepared "
                                    "once (for forward/backward's `prepared`)")
      .def(nb::init<const DistPlan&, int>(), "plan"_a, "rank"_a)
      .def_prop_ro("rank", &runtime::PreparedRank::rank)
      .def_prop_ro("num_stages", &runtime::PreparedRank::num_stages);
  m.def("dispatch", &dispatch, "plan"_a, "comm"_a, "x"_a, "local"_a, "cuda_stream"_a = 0,
        "This rank's rows of global x into `local` (no communication)");
  m.def("undispatch", &undispatch, "plan"_a, "comm"_a, "x"_a, "global_"_a, "cuda_stream"_a = 0,
        "Every rank's local rows into `global_` in the global order (all_gather_v)");
  m.def("roll", &roll, "plan"_a, "comm"_a, "x"_a, "out"_a, "shift"_a, "cuda_stream"_a = 0,
        "torch.roll by `shift` along the global token order, on local rows");
  m.def("forward", &forward, "plan"_a, "comm"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a,
        nb::kw_only(), "sink"_a.none() = nb::none(), "max_logits"_a.none() = nb::none(),
        "softmax_scale"_a.none() = nb::none(), "softcap"_a = 0.0, "num_threads"_a = 0,
        "prepared"_a.none() = nb::none(), "cuda_stream"_a = 0,
        "workspace"_a.none() = nb::none(), "sm_margin"_a = 0,
        "calc_attn forward on local rows (out, lse, max_logits in the compute type); prepared: "
        "this rank's PreparedRank of the plan (else its masks are built per call); workspace: "
        "CUDA bytes of workspace_bytes(..., backward=False) (else allocated per call)");
  m.def("backward", &backward, "plan"_a, "comm"_a, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a,
        "dq"_a, "dk"_a, "dv"_a, nb::kw_only(), "sink"_a.none() = nb::none(),
        "dsink"_a.none() = nb::none(), "softmax_scale"_a.none() = nb::none(), "softcap"_a = 0.0,
        "num_threads"_a = 0, "prepared"_a.none() = nb::none(), "cuda_stream"_a = 0,
        "workspace"_a.none() = nb::none(), "sm_margin"_a = 0,
        "calc_attn backward on local rows (dq, dk, dv in the compute type; dsink partial)");
  m.def(
      "workspace_bytes",
      [](const DistPlan& p, int rank, std::int64_t heads_q, std::int64_t heads_kv,
         std::int64_t head_dim, const std::string& dtype, bool backward) {
        return runtime::calc_attn_workspace_bytes(p, rank, heads_q, heads_kv, head_dim,
                                                  dtype_from_name(dtype), backward);
      },
      "plan"_a, "rank"_a, "heads_q"_a, "heads_kv"_a, "head_dim"_a, "dtype"_a, "backward"_a,
      "Bytes of forward/backward's CUDA workspace on `rank` (runtime.h's formula); dtype: "
      "q's ('bf16', 'fp16', 'fp32', 'fp64')");
  m.def("all_reduce", &all_reduce, "comm"_a, "x"_a, "op"_a = "sum", "cuda_stream"_a = 0,
        "In-place sum or max over ranks of a contiguous float32/float64 array");
  m.def("check_agree", &check_agree, "comm"_a, "key"_a, "what"_a,
        "ValueError on every rank, naming the groups of ranks that agree, unless every rank "
        "passes the same bytes");
  m.def("barrier", &barrier, "comm"_a);
}

}  // namespace magi::py::dist
