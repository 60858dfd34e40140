// Fault test: the last rank exits (without MPI_Finalize) in the middle of a group_cast; every
// survivor must get a magi::Error naming it within the timeout. Survivors print
// "fault-test rank R: PASS ..." and exit without MPI_Finalize too (finalize would wait on the
// dead rank); run_fault.cmake checks that every survivor printed its PASS line.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "magi/error.h"
#include "mpi_communicator.h"

int main(int argc, char** argv) {
  int provided = 0;  // MULTIPLE: the communicator's progress thread
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  magi::comm::mpi::MpiCommunicator comm;
  comm.set_timeout(std::chrono::milliseconds(1500));
  const int size = comm.size(), rank = comm.rank(), victim = size - 1;
  const auto n = static_cast<std::size_t>(size);
  std::vector<double> in(n, double(rank)), out(n);
  std::vector<std::int64_t> ones(n, 1);
  std::vector<std::vector<std::int32_t>> dst;
  std::vector<std::int32_t> src;
  for (int r = 0; r < size; ++r) {
    dst.push_back({r});
    src.push_back(r);
  }
  const magi::comm::Rows in_rows{in.data(), size, 1, magi::DType::kF64};
  const magi::comm::Rows out_rows{out.data(), size, 1, magi::DType::kF64};
  comm.group_cast(in_rows, ones, dst, out_rows, ones, src)->wait();  // a healthy call first
  comm.barrier();
  if (rank == victim) {
    auto work = comm.group_cast(in_rows, ones, dst, out_rows, ones, src);
    std::fflush(stdout);
    std::_Exit(0);  // dies with its receives posted and the call unfinished
  }
  const auto start = std::chrono::steady_clock::now();
  int code = 1;
  try {
    // The victim never sends this call's message, so every survivor waits on it.
    comm.group_cast(in_rows, ones, dst, out_rows, ones, src)->wait();
    comm.group_cast(in_rows, ones, dst, out_rows, ones, src)->wait();
    std::printf("fault-test rank %d: FAIL no error although rank %d died\n", rank, victim);
  } catch (const magi::Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = e.what();
    const bool named = what.find("rank " + std::to_string(victim)) != std::string::npos;
    code = named && s < 10 ? 0 : 1;
    std::printf("fault-test rank %d: %s after %.2f s: %s\n", rank, code == 0 ? "PASS" : "FAIL", s,
                what.c_str());
  }
  std::fflush(stdout);
  std::_Exit(code);
}
