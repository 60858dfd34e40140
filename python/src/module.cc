// magiattn._C: the compiled half of the Python package. magi::Error becomes ValueError with the
// same text: every library error is about the caller's input (shapes, dtypes, ranges, files),
// and the text already names the culprit.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "magi/error.h"

NB_MODULE(_C, m) {
  m.doc() = "magiattn C++ core: slice-list masks and the FFA attention kernels";
  nanobind::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const magi::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  magi::py::bind_mask(m);
  magi::py::bind_builders(m);
  magi::py::bind_attention(m);
  magi::py::bind_plan(m);
}
