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
  world.all_reduce(comm::Rows{all.data(), 1, 2 * size, DType::kF64}, comm::ReduceOp::kSum)
      ->wait();
  int highest = 0;
  for (int r = 0; r < size; ++r) highest = std::max(highest, int(all[std::size_t(2 * r)]));
  Verdict v;
  v.go_on = highest == 0;
  v.exit_code = code != 0 ? code : highest;
  v.print = code != 0 && (rank == 0 || all[0] == 0 || all[1] != double(hash));
  return v;
}

}  // namespace magi::cli
#endif
