// The NCCL world of a test binary run under mpirun (mpi_main.cc): NCCL bootstrapped over MPI
// (rank 0 makes the id, MPI_Bcast hands it to every rank), one GPU per rank (device = rank %
// cudaGetDeviceCount; NCCL refuses two ranks on one GPU).
#pragma once

#include <string>

#include "magi/comm.h"

namespace magi::testing {

// Made at the first call, which is collective (every rank's first call must be at the same
// point: the first test that uses it), and destroyed after the last test, before MPI_Finalize.
// nullptr where it cannot be made here, with *skip saying why: "no CUDA device" or "needs one
// CUDA device per rank"; a failure to make it with enough devices throws (NCCL missing, peers
// not arriving).
comm::Communicator* nccl_world(std::string* skip);

}  // namespace magi::testing
