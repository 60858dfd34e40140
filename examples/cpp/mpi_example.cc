// The MPI communicator through the installed package (magiattn::mpi): every rank contributes
// rank + 1 to an all_reduce and checks the sum. Run under mpirun (CI: 2 ranks).
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "magi/runtime.h"
#include "mpi_communicator.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  {
    magi::comm::mpi::MpiCommunicator comm(MPI_COMM_WORLD);
    std::vector<float> x(4, float(comm.rank() + 1));
    comm.all_reduce(magi::comm::Rows{x.data(), 1, 4, magi::DType::kF32},
                    magi::comm::ReduceOp::kSum)->wait();
    const int n = comm.size();
    const float want = float(n * (n + 1) / 2);
    for (float v : x) status |= v != want;
    std::printf("rank %d of %d: all_reduce %g (want %g) %s\n", comm.rank(), n, x[0], want,
                status ? "FAILED" : "ok");
  }
  MPI_Finalize();
  return status;
}
