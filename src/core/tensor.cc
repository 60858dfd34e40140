#include "magi/tensor.h"

#include <sstream>

#include "magi/error.h"

namespace magi {

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  std::int64_t expect = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << "] " << dtype_name(dtype) << " strides (";
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << stride[d];
  os << ") " << (device == Device::kCPU ? "cpu" : "cuda");
  return os.str();
}

TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     Device device) {
  MAGI_CHECK(shape.size() <= TensorView::kMaxDims, "make_view: ", shape.size(),
             " dims, at most ", TensorView::kMaxDims, " supported");
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = int(shape.size());
  int d = 0;
  for (std::int64_t s : shape) {
    MAGI_CHECK(s >= 0, "make_view: negative size ", s, " in dim ", d);
    t.shape[d++] = s;
  }
  std::int64_t stride = 1;
  for (d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

}  // namespace magi
