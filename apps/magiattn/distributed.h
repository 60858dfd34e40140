// `magiattn run` across MPI ranks: how it knows it was launched by mpirun, how --ranks starts
// the ranks itself, MPI's lifetime, and how ranks agree on a failure before the first
// transfer. Key decision: bad input fails every rank the same way, so rank 0 alone prints
// it and the others exit with the same code in silence; a failure that only some ranks see
// is printed by each of them ("rank 2: ..."), and no rank waits on a peer that has given up.
#pragma once

#ifdef MAGI_CLI_MPI
#include <memory>
#include <string>

#include "magi/comm.h"

namespace magi::cli {

// Under mpirun (Open MPI, MPICH/PMI, Slurm): MPI is initialised only then or with --ranks.
bool launched_by_mpi();

// Ranks sharing this host, as the launcher announces them; `fallback` when it does not.
int local_ranks(int fallback);
// This rank's index among them (it picks the rank's GPU); `fallback` when the launcher does
// not say.
int local_rank(int fallback);

// `magiattn run --ranks N` outside mpirun: replace this process by `mpiexec -n N magiattn
// <the same arguments>` (Open MPI may oversubscribe the cores and run as root, as the tests
// do). Returns only on failure.
[[noreturn]] void launch_ranks(int ranks);

// MPI_Init on construction, MPI_Finalize on destruction (after the communicator is gone),
// except after a communication failure: MPI_Finalize would wait for the dead or stuck peer,
// so the rank skips it, reports the error and exits, and mpirun ends the job.
struct MpiSession {
  bool comm_failed = false;
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// One all-reduce (under the communicator's deadline) of every rank's exit code and a hash of
// its message. `code` 0: this rank's setup succeeded. Returns whether to go on; otherwise
// `exit_code` is this rank's code (its own, else the highest), and `print` says whether this
// rank prints its message: it failed, and rank 0 either did not or failed differently.
struct Verdict {
  bool go_on = true;
  int exit_code = 0;
  bool print = false;
};
Verdict agree_on_setup(comm::Communicator& world, int code, const std::string& text);

#ifdef MAGI_CLI_NCCL
// The NCCL communicator over the ranks of `world` on CUDA device `device`: rank 0 makes the
// unique id and hands it to the others through `world` (an all-reduce under its deadline, so a
// rank 0 that cannot load libnccl fails every rank instead of leaving them waiting), then every
// rank joins within `timeout_s`, which stays the communicator's timeout.
std::unique_ptr<comm::Communicator> make_nccl_world(comm::Communicator& world, int device,
                                                    double timeout_s);
#endif

}  // namespace magi::cli
#endif
