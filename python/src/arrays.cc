// ndarray <-> C++ conversions. nanobind hands us DLPack metadata whose strides are already in
// elements, which is exactly TensorView's convention, so a view is a field-by-field copy; the
// shape and stride rules themselves are checked once, by the C++ entry points.
#include "arrays.h"

#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "magi/error.h"

namespace magi::py {
namespace {

namespace dl = nb::dlpack;

std::string dtype_str(dl::dtype t) {
  const std::string bits = std::to_string(t.bits);
  switch (dl::dtype_code(t.code)) {
    case dl::dtype_code::Int:
      return "int" + bits;
    case dl::dtype_code::UInt:
      return "uint" + bits;
    case dl::dtype_code::Float:
      return "float" + bits;
    case dl::dtype_code::Bfloat:
      return "bfloat" + bits;
    case dl::dtype_code::Complex:
      return "complex" + bits;
    case dl::dtype_code::Bool:
      return "bool";
    default:
      return "code " + std::to_string(int(t.code)) + " (" + bits + " bits)";
  }
}

std::string shape_str(std::size_t ndim, const std::int64_t* shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

DType float_dtype(dl::dtype t, const char* name) {
  if (t.lanes == 1) {
    if (t.code == std::uint8_t(dl::dtype_code::Float) && t.bits == 32) return DType::kF32;
    if (t.code == std::uint8_t(dl::dtype_code::Float) && t.bits == 64) return DType::kF64;
    if (t.code == std::uint8_t(dl::dtype_code::Bfloat) && t.bits == 16) return DType::kBF16;
    if (t.code == std::uint8_t(dl::dtype_code::Float) && t.bits == 16) return DType::kF16;
  }
  MAGI_FAIL(name, ": dtype ", dtype_str(t),
            " is not supported (expected float32, float64, bfloat16 or float16)");
}

template <typename Array>
TensorView view_of(const Array& a, void* data, const char* name) {
  MAGI_CHECK(a.ndim() <= std::size_t(TensorView::kMaxDims), name, ": ", a.ndim(), " dims, at most ",
             TensorView::kMaxDims, " are supported (shape ", shape_str(a.ndim(), a.shape_ptr()),
             ")");
  TensorView t;
  t.data = data;
  t.dtype = float_dtype(a.dtype(), name);
  if (a.device_type() == nb::device::cpu::value) {
    t.device = Device::kCPU;
  } else if (a.device_type() == nb::device::cuda::value) {
    t.device = Device::kCUDA;
    t.device_idx = a.device_id();
  } else {
    MAGI_FAIL(name, ": DLPack device type ", a.device_type(),
              " is not supported (expected cpu or cuda)");
  }
  t.ndim = int(a.ndim());
  for (int d = 0; d < t.ndim; ++d) {
    t.shape[d] = a.shape_ptr()[d];
    t.stride[d] = a.stride_ptr()[d];
  }
  return t;
}

bool is_integer(dl::dtype t) {
  return t.lanes == 1 && (t.code == std::uint8_t(dl::dtype_code::Int) ||
                          t.code == std::uint8_t(dl::dtype_code::UInt) ||
                          t.code == std::uint8_t(dl::dtype_code::Bool));
}

// memcpy: DLPack data need not be aligned to its element size.
template <typename T>
std::int64_t load(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return std::int64_t(x);  // uint64 beyond 2^63 wraps negative and fails validation later
}

std::int64_t load_int(const char* p, dl::dtype t) {
  const bool is_signed = t.code == std::uint8_t(dl::dtype_code::Int);
  switch (t.bits) {
    case 8:
      return is_signed ? load<std::int8_t>(p) : load<std::uint8_t>(p);
    case 16:
      return is_signed ? load<std::int16_t>(p) : load<std::uint16_t>(p);
    case 32:
      return is_signed ? load<std::int32_t>(p) : load<std::uint32_t>(p);
    default:
      return load<std::int64_t>(p);
  }
}

// Anything that is not already an array (lists, tuples, scalars) goes through numpy.asarray;
// numpy is a runtime dependency of the package, so this costs nothing extra.
InArray as_array(nb::handle obj, const char* name) {
  InArray a;
  if (nb::try_cast(obj, a, false)) return a;
  nb::object converted;
  try {
    converted = nb::module_::import_("numpy").attr("asarray")(obj);
  } catch (const nb::python_error& e) {
    MAGI_FAIL(name, ": cannot read it as an integer array (", e.what(), ")");
  }
  MAGI_CHECK(nb::try_cast(converted, a, false), name, ": cannot read ",
             nb::str(converted.attr("dtype")).c_str(), " values as an integer array");
  return a;
}

template <typename T>
IntArrayOf<T> read_as(nb::handle obj, const char* name, int ndim) {
  const InArray a = as_array(obj, name);
  IntArrayOf<T> out;
  if (a.size() == 0 && a.ndim() != std::size_t(ndim)) {  // [] arrives as float64 of shape [0]
    out.shape.assign(std::size_t(ndim), 0);
    return out;
  }
  MAGI_CHECK(a.ndim() == std::size_t(ndim), name, ": expected ", ndim, " dims, got shape ",
             shape_str(a.ndim(), a.shape_ptr()));
  out.shape.assign(a.shape_ptr(), a.shape_ptr() + ndim);
  if (a.size() == 0) return out;
  MAGI_CHECK(a.device_type() == nb::device::cpu::value, name,
             ": must be a CPU array (DLPack device type ", a.device_type(), ")");
  MAGI_CHECK(is_integer(a.dtype()), name, ": dtype ", dtype_str(a.dtype()),
             " is not an integer type");
  out.values.resize(a.size());
  const auto* base = static_cast<const char*>(a.data());
  const std::int64_t itemsize = std::int64_t(a.itemsize());
  std::vector<std::int64_t> idx(std::size_t(ndim), 0);
  for (T& v : out.values) {  // row-major walk honouring any strides
    std::int64_t offset = 0;
    for (int d = 0; d < ndim; ++d) offset += idx[std::size_t(d)] * a.stride(std::size_t(d));
    const std::int64_t x = load_int(base + offset * itemsize, a.dtype());
    v = std::is_same_v<T, std::uint8_t> ? T(x != 0) : T(x);
    for (int d = ndim - 1; d >= 0 && ++idx[std::size_t(d)] == out.shape[std::size_t(d)]; --d)
      idx[std::size_t(d)] = 0;
  }
  return out;
}

std::string type_of(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

}  // namespace

TensorView TensorArgs::input(nb::handle obj, const char* name) {
  InArray a;
  MAGI_CHECK(nb::try_cast(obj, a, false), name, ": expected a numpy array or a DLPack tensor, got ",
             type_of(obj), " (torch: detach tensors that require grad)");
  inputs_.push_back(a);
  // Inputs are only read; the const_cast is the price of one view type for both directions.
  return view_of(a, const_cast<void*>(a.data()), name);
}

TensorView TensorArgs::output(nb::handle obj, const char* name) {
  OutArray a;
  if (!nb::try_cast(obj, a, false)) {
    InArray readonly;
    MAGI_CHECK(!nb::try_cast(obj, readonly, false), name,
               ": the array is read-only, but outputs are written in place");
    MAGI_FAIL(name, ": expected a writable numpy array or DLPack tensor, got ", type_of(obj),
              " (torch: detach tensors that require grad)");
  }
  outputs_.push_back(a);
  return view_of(a, a.data(), name);
}

std::optional<TensorView> TensorArgs::optional_input(nb::handle obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  return input(obj, name);
}

std::optional<TensorView> TensorArgs::optional_output(nb::handle obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  return output(obj, name);
}

Workspace TensorArgs::bytes(nb::handle obj, const char* name, int device) {
  OutArray a;
  MAGI_CHECK(nb::try_cast(obj, a, false), name, ": expected a writable uint8 tensor, got ",
             type_of(obj));
  const dl::dtype t = a.dtype();
  MAGI_CHECK(t.bits == 8 && t.lanes == 1 && (t.code == std::uint8_t(dl::dtype_code::UInt) ||
                                             t.code == std::uint8_t(dl::dtype_code::Int)),
             name, ": dtype ", dtype_str(t), " is not uint8 or int8");
  MAGI_CHECK(a.ndim() == 1 && (a.size() <= 1 || a.stride(0) == 1), name,
             ": expected a contiguous 1-d byte tensor");
  MAGI_CHECK(a.device_type() == nb::device::cuda::value && a.device_id() == device, name,
             ": must be a CUDA tensor on q's device cuda:", device);
  outputs_.push_back(a);
  return Workspace{a.data(), a.size()};
}

std::optional<Workspace> TensorArgs::workspace(nb::handle obj, const TensorView& q) {
  if (obj.is_none()) return std::nullopt;
  MAGI_CHECK(q.device == Device::kCUDA, "workspace: only for CUDA calls (q is on cpu)");
  return bytes(obj, "workspace", q.device_idx);
}

IntArray read_ints(nb::handle obj, const char* name, int ndim) {
  return read_as<std::int64_t>(obj, name, ndim);
}

FlagArray read_flags(nb::handle obj, const char* name, int ndim) {
  return read_as<std::uint8_t>(obj, name, ndim);
}

nb::ndarray<nb::numpy, bool> to_numpy_bool(std::vector<std::uint8_t> values,
                                           std::initializer_list<std::size_t> shape) {
  auto owned = std::make_unique<std::vector<std::uint8_t>>(std::move(values));
  bool* data = reinterpret_cast<bool*>(owned->data());
  nb::capsule owner(owned.get(),
                    [](void* p) noexcept { delete static_cast<std::vector<std::uint8_t>*>(p); });
  owned.release();
  return nb::ndarray<nb::numpy, bool>(data, shape, owner);
}

FwdArgs fwd_args(TensorArgs& t, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                 nb::handle lse, nb::handle sink, nb::handle max_logits) {
  return FwdArgs{t.input(q, "q"),         t.input(k, "k"),
                 t.input(v, "v"),         t.output(out, "out"),
                 t.output(lse, "lse"),    t.optional_input(sink, "sink"),
                 t.optional_output(max_logits, "max_logits")};
}

BwdArgs bwd_args(TensorArgs& t, nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                 nb::handle out, nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv,
                 nb::handle sink, nb::handle dsink) {
  return BwdArgs{t.input(dout, "dout"),   t.input(q, "q"),
                 t.input(k, "k"),         t.input(v, "v"),
                 t.input(out, "out"),     t.input(lse, "lse"),
                 t.output(dq, "dq"),      t.output(dk, "dk"),
                 t.output(dv, "dv"),      t.optional_input(sink, "sink"),
                 t.optional_output(dsink, "dsink")};
}

}  // namespace magi::py
