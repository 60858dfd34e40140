// GoogleTest main for tests run under mpirun: every rank runs every test; rank 0 prints the
// normal report, other ranks print only their failures (prefixed with the rank), and the exit
// code is the worst over all ranks, so a failure on any rank fails the CTest case.
#include <mpi.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "dist_env.h"

namespace magi::testing {
namespace {

std::unique_ptr<comm::mpi::MpiCommunicator> g_world;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

comm::mpi::MpiCommunicator& world() { return *g_world; }

}  // namespace magi::testing

int main(int argc, char** argv) {
  int provided = 0;  // MULTIPLE: the communicator's progress thread
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new magi::testing::RankFailurePrinter(rank));
  }
  int result = 0;
  {
    magi::testing::g_world = std::make_unique<magi::comm::mpi::MpiCommunicator>();
    // Tests finish in well under a second per call; 20 s turns a hang into a named error.
    magi::testing::g_world->set_timeout(std::chrono::seconds(20));
    result = RUN_ALL_TESTS();
    magi::testing::g_world.reset();
  }
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
