// MAGI_MPI_CHECK(expr): MPI calls return codes (the communicator uses MPI_ERRORS_RETURN, so
// MPI never aborts on our behalf); a failure becomes magi::Error carrying MPI's own text.
#pragma once

#include <mpi.h>

#include <string>

#include "magi/error.h"

namespace magi::comm::mpi {

inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, std::size_t(len));
}

}  // namespace magi::comm::mpi

#define MAGI_MPI_CHECK(expr)                                                               \
  do {                                                                                     \
    const int magi_mpi_code_ = (expr);                                                     \
    if (magi_mpi_code_ != MPI_SUCCESS)                                                     \
      ::magi::detail::fail(__FILE__, __LINE__, #expr, "MPI call failed: ",                 \
                           ::magi::comm::mpi::error_string(magi_mpi_code_));               \
  } while (0)
