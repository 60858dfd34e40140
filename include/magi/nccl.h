// NCCL communicator (docs/semantics.md §3, issue 16): comm.h's Communicator on CUDA device rows,
// for one process per GPU. libnccl is loaded at run time (dlopen), so a build made with NCCL's
// header runs on a machine without NCCL until a communicator is asked for; torch's
// nvidia-nccl wheel, the CUDA toolkit's and the system's libnccl.so.2 all serve.
//
// Key decisions: every operation runs on the communicator's own high-priority stream, ordered
// after the work queued on its inputs' stream and before the work queued on its outputs' stream
// after wait() (CUDA events: wait() never blocks the host on device rows); reductions combine
// the sources in ascending rank order with our own kernels (bit-identical to comm/mpi); the NCCL
// communicator is non-blocking, and a watchdog aborts it (ncclCommAbort) when an operation
// passes the deadline or NCCL reports an asynchronous error: every later call, and the wait()
// of anything still in flight, throws magi::Error naming the operation and the peers.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "magi/comm.h"

namespace magi::comm::nccl {

// Whether libnccl can be loaded: $MAGI_NCCL_LIBRARY when set (only that file), else
// libnccl.so.2 on the loader's path (torch's nvidia-nccl wheel is found through torch's own
// load of it), else the library found at build time. On false, *why says what was tried.
bool available(std::string* why = nullptr);
// "2.28.3": the loaded library's version (throws magi::Error when none can be loaded).
std::string library_version();

// ncclUniqueId's bytes: made on one rank, handed by the caller to every rank (torch.distributed
// broadcast, MPI_Bcast).
using UniqueId = std::array<unsigned char, 128>;
UniqueId make_unique_id();

// Collective over the `size` ranks that pass the same id: a non-blocking NCCL communicator on
// CUDA device `device` (which becomes this thread's current device). Throws magi::Error when
// NCCL is missing, the arguments are bad, or the peers do not all arrive within `timeout_ms`,
// which also becomes the communicator's timeout() for every later operation (set_timeout
// changes it). Its Rows must be on `device` or in host memory (staged through the device; the
// wait() of an operation with host outputs blocks until they are written).
std::unique_ptr<Communicator> make_communicator(const UniqueId& id, int rank, int size,
                                                int device, long long timeout_ms = 300000);

}  // namespace magi::comm::nccl
