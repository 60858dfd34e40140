// magiattn._dist: the distributed runtime for Python, built where MPI (MAGI_HAS_MPI), NCCL
// (MAGI_HAS_NCCL) or both are found. Comm is a communicator of either backend that Python can
// close: the module closes every live one at exit, before MPI_Finalize, so no communicator (or
// its progress thread, or its NCCL watchdog) outlives the library under it.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <stdexcept>

#include "magi/comm.h"

namespace magi::py::dist {

class Comm {
 public:
  // backend: "mpi" or "nccl" (a string literal: kept as a pointer).
  Comm(std::unique_ptr<comm::Communicator> c, const char* backend);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  comm::Communicator& get(const char* op);  // throws once closed
  const char* backend() const { return backend_; }
  bool closed() const { return !c_; }
  void close();
  static void close_all();

 private:
  std::unique_ptr<comm::Communicator> c_;
  const char* backend_;
};

// A failed or timed-out collective: RuntimeError in Python (magi::Error, which is about the
// caller's input, stays ValueError).
struct CommFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void bind_runtime(nanobind::module_& m);  // dispatch, undispatch, forward, backward, roll

}  // namespace magi::py::dist
