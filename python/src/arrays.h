// Python arrays to C++ and back. Float tensors cross as views with no copy and no conversion
// (numpy via the buffer protocol, torch via DLPack): a wrong dtype, device or stride is an
// error naming the argument, never a silent copy. Small integer inputs (ranges, cu_seqlens,
// block masks) are read into vectors from anything numpy can turn into an integer array.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "magi/attention.h"
#include "magi/tensor.h"

namespace magi::py {

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro>;  // read-only numpy arrays are fine for inputs
using OutArray = nb::ndarray<>;       // outputs must be writable

// Views of the tensor arguments of one call. The imported arrays are pinned here until the
// call returns, so the GIL can be released while the kernels read and write through the views.
class TensorArgs {
 public:
  TensorView input(nb::handle obj, const char* name);
  TensorView output(nb::handle obj, const char* name);
  std::optional<TensorView> optional_input(nb::handle obj, const char* name);  // None: absent
  std::optional<TensorView> optional_output(nb::handle obj, const char* name);
  // Raw writable bytes (a contiguous uint8/int8 CUDA array on device `device`): scratch
  // memory such as a workspace.
  Workspace bytes(nb::handle obj, const char* name, int device);
  // A call's optional GPU workspace ("workspace": a byte tensor on q's CUDA device); None:
  // the callee allocates its own.
  std::optional<Workspace> workspace(nb::handle obj, const TensorView& q);

 private:
  std::vector<InArray> inputs_;
  std::vector<OutArray> outputs_;
};

// FwdArgs / BwdArgs from the handles every attention binding takes (magiattn._C and
// magiattn._dist), pinned by `t`; names in errors are the Python argument names.
FwdArgs fwd_args(TensorArgs& t, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                 nb::handle lse, nb::handle sink, nb::handle max_logits);
BwdArgs bwd_args(TensorArgs& t, nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                 nb::handle out, nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv,
                 nb::handle sink, nb::handle dsink);

// An integer (or bool) array copied out of any array-like, row-major. read_flags keeps only
// "nonzero" in one byte per element: a dense [sq, sk] mask must not cost 8 bytes a cell.
template <typename T>
struct IntArrayOf {
  std::vector<T> values;
  std::vector<std::int64_t> shape;
};
using IntArray = IntArrayOf<std::int64_t>;
using FlagArray = IntArrayOf<std::uint8_t>;

// Exactly `ndim` dims are required, except that an empty input of another rank (e.g. [])
// reads as shape [0, ..., 0], so "no slices" needs no special case at the caller.
IntArray read_ints(nb::handle obj, const char* name, int ndim);
FlagArray read_flags(nb::handle obj, const char* name, int ndim);

// A fresh numpy array that owns `values` (moved into a capsule, no copy).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T> values,
                                   std::initializer_list<std::size_t> shape) {
  auto owned = std::make_unique<std::vector<T>>(std::move(values));
  T* data = owned->data();
  nb::capsule owner(owned.get(), [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  owned.release();  // the capsule owns it now
  return nb::ndarray<nb::numpy, T>(data, shape, owner);
}

// Bool arrays come from uint8 0/1 storage (std::vector<bool> has no data pointer).
nb::ndarray<nb::numpy, bool> to_numpy_bool(std::vector<std::uint8_t> values,
                                           std::initializer_list<std::size_t> shape);

}  // namespace magi::py
