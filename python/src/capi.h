// The C interface magiattn._C offers the other compiled modules of the package (today
// magiattn._torch, the torch front's per-call path): a table of plain functions behind a
// capsule, so a module built against libtorch calls the one copy of the kernels and the mask
// cache objects of _C without linking the core again. Nothing crosses as a C++ exception: _C
// may link its own libstdc++ (python/CMakeLists.txt), so errors come back as text.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

#include "magi/attention.h"
#include "magi/prepared.h"

namespace magi::py {

inline constexpr const char* kCApiCapsule = "magiattn._C.capi_v1";

enum class CApiStatus : int {
  kOk = 0,
  kInvalid = 1,  // a magi::Error: the caller's input (raise ValueError)
  kFailed = 2,   // anything else (raise RuntimeError)
};

// Range tensors in host memory, as the caller holds them: q and k [count, 2], types [count]
// (null: all full), int32 or int64 elements, strides in elements.
struct HostRanges {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* types = nullptr;
  int range_bytes = 4, type_bytes = 4;
  std::int64_t count = 0;
  std::int64_t q_stride[2]{}, k_stride[2]{}, types_stride = 1;
};

struct CApi {
  int version;  // 1
  // The C++ object of a magiattn._C.PreparedMask (null if `obj` is not one). Needs the GIL.
  const PreparedMask* (*prepared)(PyObject* obj);
  // attn_forward(mask, args, opts) with opts.sink_layout taken from its name ("sh", "ssh").
  // Does not touch Python objects: call it without the GIL. The message of a failure goes to
  // err (NUL-terminated, truncated to err_len).
  CApiStatus (*forward)(const PreparedMask& mask, const FwdArgs& args, AttnOptions opts,
                        const char* sink_layout, char* err, std::size_t err_len);
  std::size_t (*forward_workspace_bytes)(std::int64_t num_k, std::int64_t heads_kv);
  // Whether `ranges` hold exactly the slices `mask` was prepared from (O(slices), no GIL).
  bool (*same_ranges)(const PreparedMask& mask, const HostRanges& ranges);
};

}  // namespace magi::py
