// magiattn._dist: the distributed runtime over MPI for Python (built only where MPI is found).
// Comm is an MpiCommunicator that Python can close: the module closes every live one before
// MPI_Finalize, so no communicator (or its progress thread) outlives MPI.
#pragma once

#include <mpi.h>
#include <nanobind/nanobind.h>

#include <memory>
#include <stdexcept>

#include "mpi_communicator.h"

namespace magi::py::dist {

class Comm {
 public:
  explicit Comm(MPI_Comm comm);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  comm::mpi::MpiCommunicator& get(const char* op);  // throws once closed
  bool closed() const { return !c_; }
  void close();
  static void close_all();

 private:
  std::unique_ptr<comm::mpi::MpiCommunicator> c_;
};

// A failed or timed-out collective: RuntimeError in Python (magi::Error, which is about the
// caller's input, stays ValueError).
struct CommFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void bind_runtime(nanobind::module_& m);  // dispatch, undispatch, forward, backward, roll

}  // namespace magi::py::dist
