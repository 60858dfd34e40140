// dlopen order (include/magi/nccl.h): $MAGI_NCCL_LIBRARY alone when set (the user asked for that
// file: falling back to another would hide their mistake), else the soname, else the path CMake
// found at build time (MAGI_NCCL_BUILD_LIBRARY).
#include "nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <mutex>
#include <vector>

#include "magi/error.h"

namespace magi::comm::nccl {
namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  std::string why;
};

// Resolves every entry point from `handle`; on a missing one names it.
bool resolve(void* handle, Api& a, std::string& why) {
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    void* sym = dlsym(handle, name);
    if (!sym) {
      why += std::string(ok ? "" : ", ") + name;
      ok = false;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  get(a.GetVersion, "ncclGetVersion");
  get(a.GetUniqueId, "ncclGetUniqueId");
  get(a.CommInitRankConfig, "ncclCommInitRankConfig");
  get(a.CommGetAsyncError, "ncclCommGetAsyncError");
  get(a.CommAbort, "ncclCommAbort");
  get(a.CommFinalize, "ncclCommFinalize");
  get(a.CommDestroy, "ncclCommDestroy");
  get(a.GroupStart, "ncclGroupStart");
  get(a.GroupEnd, "ncclGroupEnd");
  get(a.Send, "ncclSend");
  get(a.Recv, "ncclRecv");
  get(a.GetErrorString, "ncclGetErrorString");
  get(a.GetLastError, "ncclGetLastError");
  return ok;
}

Loaded load() {
  Loaded l;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MAGI_NCCL_LIBRARY"); env && *env) {
    candidates.push_back(env);
  } else {
    candidates.push_back("libnccl.so.2");
#ifdef MAGI_NCCL_BUILD_LIBRARY
    if (std::string(MAGI_NCCL_BUILD_LIBRARY) != candidates[0])
      candidates.push_back(MAGI_NCCL_BUILD_LIBRARY);
#endif
  }
  std::string tried;
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + path + ": " + (e ? e : "cannot be loaded");
      continue;
    }
    std::string missing;
    if (!resolve(handle, l.api, missing)) {
      // Too old (ncclCommInitRankConfig and ncclCommFinalize are NCCL 2.14+): keep looking.
      tried += (tried.empty() ? "" : "; ") + path + " lacks " + missing + " (NCCL >= 2.14 needed)";
      dlclose(handle);
      continue;
    }
    l.api.path = path;
    l.ok = true;
    return l;
  }
  const bool from_env = std::getenv("MAGI_NCCL_LIBRARY") && *std::getenv("MAGI_NCCL_LIBRARY");
  l.why = "NCCL is not available: " + tried +
          (from_env ? " (MAGI_NCCL_LIBRARY is set, so nothing else was tried)"
                    : " (set MAGI_NCCL_LIBRARY to a libnccl.so.2)");
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe, once
  return l;
}

}  // namespace

const Api* try_api(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.api : nullptr;
}

const Api& api() {
  std::string why;
  const Api* a = try_api(&why);
  MAGI_CHECK(a != nullptr, why);
  return *a;
}

std::string describe(const Api& a, ncclResult_t r, ncclComm_t comm) {
  std::string s = a.GetErrorString(r);
  const char* last = a.GetLastError(comm);
  if (last && *last) s += std::string(" (NCCL: ") + last + ")";
  return s;
}

}  // namespace magi::comm::nccl
