// magiattn._torch: the torch front's per-call forward in C++ (built where torch's headers are
// found at build time, python/CMakeLists.txt). One call takes the tensors as torch objects,
// allocates out, lse, max_logits and the GPU workspace from torch's allocator, runs the
// kernel through _C's C interface (capi.h: the one copy of the kernels and of the prepared
// masks) and, when autograd wants it, records a C++ autograd node whose backward calls the
// Python backward (torch_ops._backward_impl). It replaces, per call, what costs host time in
// Python: autograd.Function.apply, two Python allocations, five DLPack capsules and the
// range-pointer checks (bench/host_breakdown.py). The mask cache is defined in Python
// (functional.prepared_mask); `call`, the public function's common case, keeps the last few
// masks it was given by identity in front of it (RecentMasks) and asks Python on a miss.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "capi.h"

namespace nb = nanobind;

namespace magi::py {
namespace {

const CApi* g_api = nullptr;
// Python callables set once at import (set_backward, set_lookup); strong references kept for
// the life of the process (a static nb::object would be released after the interpreter is gone):
// torch_ops._backward_impl, functional.prepared_mask, and torch._C's current raw stream and
// capture state (a C++ extension built without torch's CUDA libraries cannot ask them).
PyObject* g_backward = nullptr;
PyObject* g_prepared_mask = nullptr;
PyObject* g_raw_stream = nullptr;
PyObject* g_capturing = nullptr;

[[noreturn]] void value_error(const std::string& what) { throw nb::value_error(what.c_str()); }

const at::Tensor& tensor(nb::handle h, const char* name) {
  if (!THPVariable_Check(h.ptr())) {
    value_error(std::string(name) + ": expected a torch tensor, got " +
                nb::inst_name(h).c_str());
  }
  return THPVariable_Unpack(h.ptr());
}

std::optional<at::Tensor> optional_tensor(nb::handle h, const char* name) {
  if (h.is_none()) return std::nullopt;
  return tensor(h, name);
}

// torch's own name of a dtype ("int32"), as Python prints it.
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

// The same view _C builds from DLPack (arrays.cc), from the tensor's own fields.
TensorView view(const at::Tensor& t, const char* name) {
  TensorView v;
  switch (t.scalar_type()) {
    case at::kFloat: v.dtype = DType::kF32; break;
    case at::kDouble: v.dtype = DType::kF64; break;
    case at::kBFloat16: v.dtype = DType::kBF16; break;
    case at::kHalf: v.dtype = DType::kF16; break;
    default:
      value_error(std::string(name) + ": dtype " + dtype_name(t.scalar_type()) +
                  " is not supported (expected float32, float64, bfloat16 or float16)");
  }
  if (t.is_cuda()) {
    v.device = Device::kCUDA;
    v.device_idx = t.get_device();
  } else if (!t.is_cpu()) {
    value_error(std::string(name) + ": device " + t.device().str() +
                " is not supported (expected cpu or cuda)");
  }
  if (t.dim() > TensorView::kMaxDims) {
    value_error(std::string(name) + ": " + std::to_string(t.dim()) + " dims, at most " +
                std::to_string(TensorView::kMaxDims) + " are supported");
  }
  v.ndim = int(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.stride[d] = t.stride(d);
  }
  v.data = t.data_ptr();
  return v;
}

bool is_range_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kInt || t.scalar_type() == at::kLong;
}

// The caller's CUDA range tensors, for the kernel's check against the prepared slices
// (attention.h DeviceRanges); none where the check cannot read them (another device, dtype or
// layout): the mask cache's version rule still holds for those.
std::optional<DeviceRanges> device_ranges(const at::Tensor& q_ranges, const at::Tensor& k_ranges,
                                          const std::optional<at::Tensor>& types, int device) {
  const auto readable = [device](const at::Tensor& t) {
    return t.is_cuda() && t.get_device() == device && is_range_dtype(t) && t.is_contiguous();
  };
  if (!readable(q_ranges) || !readable(k_ranges) ||
      q_ranges.scalar_type() != k_ranges.scalar_type() || (types && !readable(*types))) {
    return std::nullopt;
  }
  return DeviceRanges{q_ranges.data_ptr(), k_ranges.data_ptr(),
                      types ? types->data_ptr() : nullptr, int(q_ranges.element_size()),
                      types ? int(types->element_size()) : 4, q_ranges.size(0)};
}

// CPU range tensors the mask cache recognised by identity and version (functional.py) are
// checked here against the prepared slices on every call: a write torch's version counter
// did not see (through .numpy(), say) raises this, and the caller looks the mask up by
// content instead. O(slices) integer compares.
struct StaleRanges : std::exception {
  const char* what() const noexcept override {
    return "the CPU range tensors differ from the prepared mask they were cached with";
  }
};

bool host_ranges_match(const PreparedMask& mask, const at::Tensor& q, const at::Tensor& k,
                       const std::optional<at::Tensor>& types) {
  const auto readable = [](const at::Tensor& t, int dims) {
    return t.is_cpu() && is_range_dtype(t) && t.dim() == dims && (dims == 1 || t.size(1) == 2);
  };
  if (!readable(q, 2) || !readable(k, 2) || q.scalar_type() != k.scalar_type() ||
      q.size(0) != k.size(0) || (types && (!readable(*types, 1) || types->size(0) != q.size(0)))) {
    return false;
  }
  HostRanges r;
  r.q = q.data_ptr(), r.k = k.data_ptr();
  r.range_bytes = int(q.element_size());
  r.count = q.size(0);
  r.q_stride[0] = q.stride(0), r.q_stride[1] = q.stride(1);
  r.k_stride[0] = k.stride(0), r.k_stride[1] = k.stride(1);
  if (types) {
    r.types = types->data_ptr();
    r.type_bytes = int(types->element_size());
    r.types_stride = types->stride(0);
  }
  return g_api->same_ranges(mask, r);
}

// Everything of one call that is not a differentiable input.
struct Call {
  const PreparedMask* mask = nullptr;  // of a magiattn._C.PreparedMask the caller holds
  at::Tensor q_ranges, k_ranges;
  std::optional<at::Tensor> types;
  std::optional<double> softmax_scale;
  double softcap = 0.0;
  std::string sink_layout;
  bool deterministic = false, return_max_logits = false;
  int sm_margin = 0;
  std::uintptr_t stream = 0;
};

// out, lse, max_logits; max_logits undefined when not asked for and `bare` (an autograd node
// cannot return an undefined tensor: it records a view check on each output).
std::array<at::Tensor, 3> run_forward(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const std::optional<at::Tensor>& sink,
                                      const Call& c, bool bare) {
  if (q.dim() != 3) value_error("q: expected 3 dims, got " + std::to_string(q.dim()));
  const at::ScalarType compute = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::TensorOptions opts = q.options();
  at::Tensor out = at::empty(q.sizes(), opts);
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, opts.dtype(compute));
  at::Tensor max_logits;
  if (c.return_max_logits || !bare)
    max_logits = at::empty({c.return_max_logits ? q.size(1) : 0}, opts.dtype(compute));
  FwdArgs a;
  a.q = view(q, "q");
  a.k = view(k, "k");
  a.v = view(v, "v");
  a.out = view(out, "out");
  a.lse = view(lse, "lse");
  if (sink) a.sink = view(*sink, "sink");
  if (c.return_max_logits) a.max_logits = view(max_logits, "max_logits");
  at::Tensor workspace;  // per call from torch's caching allocator (a graph's pool in capture)
  if (q.is_cuda()) {
    if (k.dim() != 3) value_error("k: expected 3 dims, got " + std::to_string(k.dim()));
    const std::size_t bytes = g_api->forward_workspace_bytes(k.size(0), k.size(1));
    workspace = at::empty({std::int64_t(bytes)}, opts.dtype(at::kByte));
    a.workspace = Workspace{workspace.data_ptr(), bytes};
    a.device_ranges = device_ranges(c.q_ranges, c.k_ranges, c.types, q.get_device());
  }
  AttnOptions o;
  o.softmax_scale = c.softmax_scale;
  o.softcap = c.softcap;
  o.deterministic = c.deterministic;
  o.sm_margin = c.sm_margin;
  o.cuda_stream = c.stream;
  std::array<char, 2048> err{};
  CApiStatus status;
  {
    nb::gil_scoped_release release;
    status = g_api->forward(*c.mask, a, o, c.sink_layout.c_str(), err.data(), err.size());
  }
  if (status == CApiStatus::kInvalid) throw nb::value_error(err.data());
  if (status != CApiStatus::kOk) throw std::runtime_error(err.data());
  return {out, lse, max_logits};
}

nb::object wrap(const at::Tensor& t) {
  return nb::steal(THPVariable_Wrap(t));  // None for an undefined tensor
}

struct FFAFunction : torch::autograd::Function<FFAFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v,
                                                const std::optional<at::Tensor>& sink,
                                                const Call* call) {
    auto [out, lse, max_logits] = run_forward(q, k, v, sink, *call, false);
    ctx->save_for_backward({q, k, v, out, lse, call->q_ranges, call->k_ranges,
                            call->types.value_or(at::Tensor()), sink.value_or(at::Tensor())});
    ctx->saved_data["sink_layout"] = call->sink_layout;
    ctx->saved_data["softmax_scale"] = call->softmax_scale ? c10::IValue(*call->softmax_scale)
                                                           : c10::IValue();
    ctx->saved_data["softcap"] = call->softcap;
    ctx->saved_data["deterministic"] = call->deterministic;
    ctx->saved_data["sm_margin"] = call->sm_margin;
    ctx->mark_non_differentiable({lse, max_logits});
    return {out, lse, max_logits};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& d = ctx->saved_data;
    nb::gil_scoped_acquire gil;
    try {
      nb::list args;
      args.append(wrap(grads[0]));
      for (const at::Tensor& t : saved) args.append(wrap(t));
      args.append(nb::str(d.at("sink_layout").toStringRef().c_str()));
      const c10::IValue& scale = d.at("softmax_scale");
      args.append(scale.isNone() ? nb::none() : nb::cast(scale.toDouble()));
      args.append(nb::cast(d.at("softcap").toDouble()));
      args.append(nb::cast(d.at("deterministic").toBool()));
      args.append(nb::cast(d.at("sm_margin").toInt()));
      if (g_backward == nullptr) throw std::runtime_error("magiattn._torch: no backward set");
      nb::object r = nb::handle(g_backward)(*nb::tuple(args));
      // dq, dk, dv, dsink (None without a sink) and nothing for the options
      return {tensor(r[0], "dq"), tensor(r[1], "dk"), tensor(r[2], "dv"),
              r[3].is_none() ? at::Tensor() : tensor(r[3], "dsink"), at::Tensor()};
    } catch (nb::python_error& e) {
      // torch's carrier of a Python exception: the autograd engine restores it for the
      // caller of backward(), type and traceback included.
      e.restore();
      python_error carried;
      carried.persist();
      throw carried;
    }
  }
};

// out, lse, max_logits of one call on c.mask, with the autograd node when `autograd` and
// torch's grad mode ask for it (the custom op's impl passes false: its rule is registered).
// `bare`: no max_logits [0] without return_max_logits (`call`; not the custom op, whose schema
// returns a tensor, nor the autograd node).
nb::tuple run(const Call& c, const at::Tensor& tq, const at::Tensor& tk, const at::Tensor& tv,
              const std::optional<at::Tensor>& ts, bool autograd, bool bare) {
  const bool grad = autograd && c10::GradMode::is_enabled() &&
                    (tq.requires_grad() || tk.requires_grad() || tv.requires_grad() ||
                     (ts && ts->requires_grad()));
  if (grad) {
    auto r = FFAFunction::apply(tq, tk, tv, ts, &c);
    return nb::make_tuple(wrap(r[0]), wrap(r[1]), wrap(r[2]));
  }
  auto [out, lse, max_logits] = run_forward(tq, tk, tv, ts, c, bare);
  return nb::make_tuple(wrap(out), wrap(lse), wrap(max_logits));
}

// (out, lse, max_logits); differentiable in q, k, v and sink when `autograd` and torch's
// grad mode ask for it.
nb::tuple forward(nb::handle q, nb::handle k, nb::handle v, nb::handle q_ranges,
                  nb::handle k_ranges, nb::handle types, nb::handle prepared, nb::handle sink,
                  const std::string& sink_layout, std::optional<double> softmax_scale,
                  double softcap, bool deterministic, bool return_max_logits, int sm_margin,
                  std::uintptr_t stream, bool autograd, bool check_host_ranges) {
  Call c;
  c.mask = g_api->prepared(prepared.ptr());
  if (c.mask == nullptr) value_error("prepared: expected a magiattn._C.PreparedMask");
  c.q_ranges = tensor(q_ranges, "q_ranges");
  c.k_ranges = tensor(k_ranges, "k_ranges");
  c.types = optional_tensor(types, "attn_type_map");
  if (check_host_ranges && !c.q_ranges.is_cuda() &&
      !host_ranges_match(*c.mask, c.q_ranges, c.k_ranges, c.types)) {
    throw StaleRanges();
  }
  c.softmax_scale = softmax_scale;
  c.softcap = softcap;
  c.sink_layout = sink_layout;
  c.deterministic = deterministic;
  c.return_max_logits = return_max_logits;
  c.sm_margin = sm_margin;
  c.stream = stream;
  return run(c, tensor(q, "q"), tensor(k, "k"), tensor(v, "v"), optional_tensor(sink, "sink"),
             autograd, false);
}

// The last few masks `call` was given, by the identity of their range tensors: the same live
// tensors (a weak reference holds each TensorImpl's address, so no other tensor can take it)
// at the same torch version counters, with the same Nq and Nk. That is functional.py's
// identity rule, so a hit here is what a lookup there would return, without the Python
// frame. Misses, and anything during a CUDA-graph capture (where Python pins what a graph
// uses), go to functional.prepared_mask. Each entry holds its PreparedMask: the cache's bound
// grows by these entries (kSize); clear_mask_cache() empties it (forget_recent).
class RecentMasks {
 public:
  static constexpr int kSize = 8;

  // The PreparedMask of these ranges, or a null handle.
  nb::handle find(const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& t,
                  std::int64_t nq, std::int64_t nk) {
    for (int i = 0; i < kSize; ++i) {
      Entry& e = entries_[std::size_t(i)];
      if (e.prepared.is_valid() && e.matches(q, k, t, nq, nk)) {
        if (i != 0) std::swap(entries_[0], e);  // the hot mask first: one compare a call
        return entries_[0].prepared;
      }
    }
    return {};
  }

  void remember(const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& t,
                std::int64_t nq, std::int64_t nk, nb::handle prepared) {
    if (q.is_inference() || k.is_inference() || (t && t->is_inference())) return;  // no versions
    std::rotate(entries_.begin(), entries_.end() - 1, entries_.end());  // the oldest goes
    Entry& e = entries_[0];
    e.q = Slot(q), e.k = Slot(k), e.t = t ? Slot(*t) : Slot();
    e.nq = nq, e.nk = nk;
    e.prepared = nb::borrow(prepared);
  }

  void forget(const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& t,
              std::int64_t nq, std::int64_t nk) {
    for (Entry& e : entries_)
      if (e.prepared.is_valid() && e.matches(q, k, t, nq, nk)) e = Entry();
  }

  void clear() { entries_.fill(Entry()); }

 private:
  struct Slot {  // one range tensor (none for attn_type_map=None)
    Slot() = default;
    explicit Slot(const at::Tensor& x)
        : impl(x.unsafeGetTensorImpl()),
          alive(c10::weak_intrusive_ptr<c10::TensorImpl>(x.getIntrusivePtr())),
          version(x._version()) {}
    bool is(const at::Tensor* x) const {
      return x == nullptr ? impl == nullptr
                          : impl == x->unsafeGetTensorImpl() && version == x->_version();
    }
    const c10::TensorImpl* impl = nullptr;
    c10::weak_intrusive_ptr<c10::TensorImpl> alive{
        c10::weak_intrusive_ptr<c10::TensorImpl>(c10::intrusive_ptr<c10::TensorImpl>())};
    std::uint32_t version = 0;
  };
  struct Entry {
    bool matches(const at::Tensor& qr, const at::Tensor& kr, const std::optional<at::Tensor>& tr,
                 std::int64_t n_q, std::int64_t n_k) const {
      return nq == n_q && nk == n_k && q.is(&qr) && k.is(&kr) && t.is(tr ? &*tr : nullptr);
    }
    Slot q, k, t;
    std::int64_t nq = -1, nk = -1;
    nb::object prepared;
  };
  std::array<Entry, kSize> entries_{};
};

RecentMasks& recent() {  // used with the GIL held only
  static RecentMasks* masks = new RecentMasks();  // never destroyed: it holds Python objects
  return *masks;
}

bool exact_tensor(nb::handle h) { return THPVariable_CheckExact(h.ptr()); }

// Range tensors the identity rule applies to (functional.prepared_mask's `by_identity`):
// int32/int64 tensors all on the CPU or all on the GPU (the GPU only for a GPU call).
bool identity_ranges(const at::Tensor& q, const at::Tensor& qr, const at::Tensor& kr,
                     const std::optional<at::Tensor>& tr) {
  const bool cuda = qr.is_cuda();
  const auto ok = [cuda](const at::Tensor& r) {
    return is_range_dtype(r) && (cuda ? r.is_cuda() : r.is_cpu());
  };
  return ok(qr) && ok(kr) && (!tr || ok(*tr)) && (q.is_cuda() || !cuda);
}

// The public flex_flash_attn_func's common case in one call: plain torch tensors and Python
// scalars of the expected types, the mask looked up here first. (out, lse, max_logits), or
// None where anything is unusual (another type, a tensor subclass, a CUDA-graph capture, CPU
// ranges written behind torch's back): the caller then takes the Python path, which checks
// everything and names the culprit.
nb::object call(nb::handle q, nb::handle k, nb::handle v, nb::handle q_ranges,
                nb::handle k_ranges, nb::handle types, nb::handle sink, nb::handle sink_layout,
                nb::handle softmax_scale, nb::handle softcap, nb::handle deterministic,
                nb::handle return_max_logits, nb::handle sm_margin) {
  const auto number = [](nb::handle h) {
    return PyFloat_CheckExact(h.ptr()) || PyLong_CheckExact(h.ptr());
  };
  if (!exact_tensor(q) || !exact_tensor(k) || !exact_tensor(v) || !exact_tensor(q_ranges) ||
      !exact_tensor(k_ranges) || !(types.is_none() || exact_tensor(types)) ||
      !(sink.is_none() || exact_tensor(sink)) || !PyUnicode_CheckExact(sink_layout.ptr()) ||
      !(softmax_scale.is_none() || number(softmax_scale)) || !number(softcap) ||
      !PyBool_Check(deterministic.ptr()) || !PyBool_Check(return_max_logits.ptr()) ||
      !PyLong_CheckExact(sm_margin.ptr()) || g_prepared_mask == nullptr) {
    return nb::none();
  }
  const at::Tensor& tq = THPVariable_Unpack(q.ptr());
  const at::Tensor& tk = THPVariable_Unpack(k.ptr());
  const at::Tensor& tv = THPVariable_Unpack(v.ptr());
  if (tq.dim() != 3 || tk.dim() != 3 || tv.dim() != 3) return nb::none();
  Call c;
  c.q_ranges = THPVariable_Unpack(q_ranges.ptr());
  c.k_ranges = THPVariable_Unpack(k_ranges.ptr());
  if (!types.is_none()) c.types = THPVariable_Unpack(types.ptr());
  if (!identity_ranges(tq, c.q_ranges, c.k_ranges, c.types)) return nb::none();
  if (tq.is_cuda()) {
    nb::object capturing = nb::steal(PyObject_CallNoArgs(g_capturing));
    if (!capturing.is_valid()) throw nb::python_error();
    if (capturing.ptr() != Py_False) return nb::none();
    nb::object s = nb::steal(PyObject_CallOneArg(g_raw_stream, nb::int_(tq.get_device()).ptr()));
    if (!s.is_valid()) throw nb::python_error();
    c.stream = nb::cast<std::uintptr_t>(s);
  }
  const std::int64_t nq = tq.size(0), nk = tk.size(0);
  // A reference of our own: the kernel call releases the GIL, and another thread's call may
  // replace the entry meanwhile.
  nb::object pm = nb::borrow(recent().find(c.q_ranges, c.k_ranges, c.types, nq, nk));
  if (!pm.is_valid()) {
    pm = nb::handle(g_prepared_mask)(nq, nk, q_ranges, k_ranges, types,
                                     nb::arg("_cpu_by_identity") = true);
    recent().remember(c.q_ranges, c.k_ranges, c.types, nq, nk, pm);
  }
  c.mask = g_api->prepared(pm.ptr());
  if (c.mask == nullptr) value_error("prepared_mask: did not return a magiattn._C.PreparedMask");
  if (!c.q_ranges.is_cuda() && !host_ranges_match(*c.mask, c.q_ranges, c.k_ranges, c.types)) {
    recent().forget(c.q_ranges, c.k_ranges, c.types, nq, nk);
    return nb::none();  // the Python path finds the stale record and looks up by content
  }
  if (!softmax_scale.is_none()) c.softmax_scale = nb::cast<double>(softmax_scale);
  c.softcap = nb::cast<double>(softcap);
  c.sink_layout = nb::cast<std::string>(sink_layout);
  c.deterministic = deterministic.ptr() == Py_True;
  c.return_max_logits = return_max_logits.ptr() == Py_True;
  c.sm_margin = nb::cast<int>(sm_margin);
  return run(c, tq, tk, tv, optional_tensor(sink, "sink"), true, true);
}

}  // namespace
}  // namespace magi::py

NB_MODULE(_torch, m) {
  using namespace nb::literals;
  m.doc() = "magiattn's torch front in C++: the per-call forward (torch_ops.py)";
  nb::object capsule = nb::module_::import_("magiattn._C").attr("_capi");
  magi::py::g_api = static_cast<const magi::py::CApi*>(
      PyCapsule_GetPointer(capsule.ptr(), magi::py::kCApiCapsule));
  if (magi::py::g_api == nullptr) throw nb::python_error();
  if (magi::py::g_api->version != 1) {
    throw nb::import_error("magiattn._torch: magiattn._C's C interface is not version 1 "
                           "(rebuild the package)");
  }
  // torch's C++ ABI changes between releases: torch_ops.py uses this module only with the
  // torch it was compiled against.
  m.attr("built_with_torch") = MAGI_TORCH_VERSION;
  const auto keep = [](PyObject*& slot, nb::object f) {
    PyObject* old = slot;
    slot = f.release().ptr();
    Py_XDECREF(old);
  };
  m.def("set_backward", [keep](nb::object f) { keep(magi::py::g_backward, std::move(f)); },
        "backward"_a,
        "the Python function the autograd node calls: (dout, q, k, v, out, lse, q_ranges, "
        "k_ranges, attn_type_map, sink, sink_layout, softmax_scale, softcap, deterministic, "
        "sm_margin) -> (dq, dk, dv, dsink or None)");
  m.def("set_lookup", [keep](nb::object prepared_mask, nb::object raw_stream,
                             nb::object capturing) {
    keep(magi::py::g_prepared_mask, std::move(prepared_mask));
    keep(magi::py::g_raw_stream, std::move(raw_stream));
    keep(magi::py::g_capturing, std::move(capturing));
    magi::py::recent().clear();
  }, "prepared_mask"_a, "raw_stream"_a, "capturing"_a,
        "what `call` asks Python: the mask cache on a miss (functional.prepared_mask), torch's "
        "current raw stream of a device and whether the current stream is being captured");
  m.def("call", &magi::py::call, "q"_a, "k"_a, "v"_a, "q_ranges"_a, "k_ranges"_a,
        "attn_type_map"_a.none(), "sink"_a.none(), "sink_layout"_a, "softmax_scale"_a.none(),
        "softcap"_a, "deterministic"_a, "return_max_logits"_a, "sm_margin"_a,
        "(out, lse, max_logits or None) of flex_flash_attn_func's common case (plain tensors, "
        "Python scalars, no CUDA-graph capture), the mask looked up by identity here first; "
        "None where the Python path must decide");
  m.def("forget_recent", [] { magi::py::recent().clear(); },
        "drop the masks `call` keeps by identity (clear_mask_cache)");
  m.def("forward", &magi::py::forward, "q"_a, "k"_a, "v"_a, "q_ranges"_a, "k_ranges"_a,
        "attn_type_map"_a.none(), "prepared"_a, "sink"_a.none(), "sink_layout"_a,
        "softmax_scale"_a.none(), "softcap"_a, "deterministic"_a, "return_max_logits"_a,
        "sm_margin"_a, "stream"_a, "autograd"_a, "check_host_ranges"_a,
        "(out, lse, max_logits [Hq] or [0]) of a forward on `prepared` (positional; "
        "functional.flex_flash_attn_func's meaning), on the cudaStream_t `stream` for CUDA "
        "tensors; with `autograd`, records the backward when grad mode is on and q, k, v or "
        "sink requires grad; with `check_host_ranges`, CPU range tensors must hold the "
        "prepared slices (else StaleRanges)");
  nb::exception<magi::py::StaleRanges>(m, "StaleRanges", PyExc_RuntimeError);
}
