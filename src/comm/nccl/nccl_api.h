// libnccl loaded at run time (dlopen): the build needs only <nccl.h>, so a binary made with NCCL's
// header starts on a machine without NCCL and fails only when a communicator is asked for; and
// inside a torch process "libnccl.so.2" resolves to the copy torch already loaded (one NCCL per
// process, the one torch's own communicators use).
#pragma once

#include <nccl.h>

#include <string>

namespace magi::comm::nccl {

// The entry points we use, resolved from one library.
struct Api {
  std::string path;  // what was loaded (as passed to dlopen)
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);
};

// The loaded library, loaded once per process (the first call decides, later calls return the
// same answer); nullptr when none could be loaded, with *why saying what was tried.
const Api* try_api(std::string* why = nullptr);
// try_api or throw magi::Error with that explanation.
const Api& api();

// "ncclSystemError (NCCL: <last error>)": a result with NCCL's own words when it has some.
std::string describe(const Api& a, ncclResult_t r, ncclComm_t comm);

}  // namespace magi::comm::nccl
