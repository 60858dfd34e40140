// MPI launch, lifetime and the setup agreement of a distributed `magiattn run`.
#include "distributed.h"

#ifdef MAGI_CLI_MPI
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include "magi/error.h"
#ifdef MAGI_CLI_NCCL
#include "magi/nccl.h"
#endif

namespace magi::cli {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

int local_ranks(int fallback) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* s = std::getenv(v)) {
      const int n = std::atoi(s);
      if (n > 0) return n;
    }
  }
  return fallback;
}

int local_rank(int fallback) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* s = std::getenv(v)) {
      char* end = nullptr;
      const long n = std::strtol(s, &end, 10);
      if (end != s && n >= 0) return int(n);
    }
  }
  return fallback;
}

[[noreturn]] void launch_ranks(int ranks) {
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(cmdline)), {});
  std::vector<std::string> args;
  for (std::size_t i = 0; i < all.size();) {
    const std::size_t end = all.find('\0', i);
    args.push_back(all.substr(i, end - i));
    i = end == std::string::npos ? all.size() : end + 1;
  }
  MAGI_CHECK(!args.empty(), "--ranks ", ranks, ": cannot read this process's arguments");
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  MAGI_CHECK(len > 0, "--ranks ", ranks, ": cannot find this executable's path");
  self[len] = '\0';
  std::vector<std::string> cmd{MAGI_MPIEXEC, "-n", std::to_string(ranks), self};
  cmd.insert(cmd.end(), args.begin() + 1, args.end());
  std::vector<char*> argv;
  for (std::string& a : cmd) argv.push_back(a.data());
  argv.push_back(nullptr);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::cout.flush();
  execv(MAGI_MPIEXEC, argv.data());
  MAGI_FAIL("--ranks ", ranks, ": could not start ", MAGI_MPIEXEC, ": ", std::strerror(errno));
}

MpiSession::MpiSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;  // MULTIPLE: the communicator's progress thread overlaps transfers
  if (!initialized) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !comm_failed) MPI_Finalize();
}

Verdict agree_on_setup(comm::Communicator& world, int code, const std::string& text) {
  std::uint32_t hash = 2166136261u;  // FNV-1a: the same on every rank and build
  for (unsigned char c : text) hash = (hash ^ c) * 16777619u;
  const int rank = world.rank(), size = world.size();
  std::vector<double> all(std::size_t(2 * size), 0.0);  // [code, hash] per rank, summed
  all[std::size_t(2 * rank)] = code;
  all[std::size_t(2 * rank + 1)] = code != 0 ? double(hash) : 0.0;
  world.all_reduce(comm::Rows{all.data(), 1, 2 * size, DType::kF64}, comm::ReduceOp::kSum)->wait();
  int highest = 0;
  for (int r = 0; r < size; ++r) highest = std::max(highest, int(all[std::size_t(2 * r)]));
  Verdict v;
  v.go_on = highest == 0;
  v.exit_code = code != 0 ? code : highest;
  v.print = code != 0 && (rank == 0 || all[0] == 0 || all[1] != double(hash));
  return v;
}

#ifdef MAGI_CLI_NCCL
std::unique_ptr<comm::Communicator> make_nccl_world(comm::Communicator& world, int device,
                                                    double timeout_s) {
  comm::nccl::UniqueId id{};
  // [ok, the id's bytes]: rank 0's share of a sum, zeros elsewhere (doubles hold bytes exactly).
  std::vector<double> shared(id.size() + 1, 0.0);
  std::string why;
  if (world.rank() == 0) {
    try {
      id = comm::nccl::make_unique_id();
      shared[0] = 1;
      std::copy(id.begin(), id.end(), shared.begin() + 1);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  world
      .all_reduce(comm::Rows{shared.data(), 1, std::int64_t(shared.size()), DType::kF64},
                  comm::ReduceOp::kSum)
      ->wait();
  if (world.rank() == 0) MAGI_CHECK(why.empty(), "--comm nccl: ", why);
  MAGI_CHECK(shared[0] == 1, "--comm nccl: rank 0 could not make the NCCL unique id");
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>(shared[i + 1]);
  return comm::nccl::make_communicator(id, world.rank(), world.size(), device,
                                       static_cast<long long>(timeout_s * 1000));
}
#endif

}  // namespace magi::cli
#endif
