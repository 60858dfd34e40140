// Include before any CUTLASS header. CuTe encodes a TMA descriptor through
// cutlass::call_cuTensorMapEncodeTiled, which by default asks the runtime for the driver's
// entry point on every call (cudaGetDriverEntryPointByVersion, tens of microseconds: three
// descriptors a launch were most of a forward call's host time at 2k tokens). With the direct
// call enabled and the name mapped here, CuTe calls encode_tiled (forward.cu), which looks the
// entry point up once per process; nothing links libcuda directly.
#pragma once

#include <cuda.h>

namespace magi::kernels::sm90 {
CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                      const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                      CUtensorMapFloatOOBfill oob);
}  // namespace magi::kernels::sm90

#ifndef CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL
#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#endif
#define cuTensorMapEncodeTiled ::magi::kernels::sm90::encode_tiled
