#include "nccl_env.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "dist_env.h"
#include "magi/error.h"
#include "magi/nccl.h"

namespace magi::testing {
namespace {

std::unique_ptr<comm::Communicator> g_nccl;
std::string g_skip;
bool g_tried = false;

// Destroys the communicator inside RUN_ALL_TESTS (after the last test), while MPI and the CUDA
// runtime are still up.
class NcclWorldEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { g_nccl.reset(); }
};
[[maybe_unused]] const auto* const g_env =
    ::testing::AddGlobalTestEnvironment(new NcclWorldEnvironment);

}  // namespace

comm::Communicator* nccl_world(std::string* skip) {
  if (!g_tried) {
    g_tried = true;
    const int rank = world().rank(), size = world().size();
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (count == 0) {
      g_skip = "no CUDA device";
    } else if (count < size) {
      g_skip = "needs one CUDA device per rank: " + std::to_string(size) + " ranks, " +
               std::to_string(count) + " CUDA devices (NCCL refuses two ranks on one GPU)";
    } else {
      comm::nccl::UniqueId id{};
      if (rank == 0) id = comm::nccl::make_unique_id();
      MPI_Bcast(id.data(), int(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
      g_nccl = comm::nccl::make_communicator(id, rank, size, rank % count, 60000);
      // Tests finish in well under a second per call; 20 s turns a hang into a named error.
      g_nccl->set_timeout(std::chrono::seconds(20));
    }
  }
  if (skip) *skip = g_skip;
  return g_nccl.get();
}

}  // namespace magi::testing
