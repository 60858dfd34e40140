// Shared state of the MPI test binary: the world communicator (created once in main, because
// creating one is collective and a per-test dup would hang every rank if one test diverged).
#pragma once

#include "mpi_communicator.h"

namespace magi::testing {

comm::mpi::MpiCommunicator& world();

}  // namespace magi::testing
