// magiattn._C: the compiled half of the Python package. magi::Error becomes ValueError with the
// same text: every library error is about the caller's input (shapes, dtypes, ranges, files),
// and the text already names the culprit.
#include <nanobind/nanobind.h>

// Not for printing: with GCC >= 13 and a statically linked libstdc++ (the GPU image's
// toolchain links it so), the stream/locale initialiser is only linked in when some object
// includes <iostream>; without it the first std::ostringstream (every error message) crashes
// inside num_put. Seen on the H200 machine (GCC 13.3, Python 3.12), 2026-11-29.
#include <iostream>

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
