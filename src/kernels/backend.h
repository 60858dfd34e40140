// The internal contract between the public entry points (attention.cc, which validates) and
// a backend (cpu/, later sm90/). Everything here is already checked: shapes agree, strides of
// the last dim are 1, dtypes are supported, the mask fits the sequence lengths.
#pragma once

#include <cstdint>

#include "magi/attention.h"

namespace magi::kernels {

struct Dims {
  std::int64_t num_q = 0, num_k = 0;  // tokens
  std::int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  std::int64_t sink_len = 0;  // 0 when there is no sink
};

struct Resolved {
  Dims dims;
  double scale = 0;    // softmax scale, resolved from options
  double softcap = 0;  // 0: off
  SinkLayout sink_layout = SinkLayout::kSH;
  bool accumulate = false;
  bool deterministic = false;
  int num_threads = 0;  // resolved: >= 1
  DType compute = DType::kF32;  // kF32 or kF64
};

namespace cpu {  // the compilation that fits this CPU (cpu/dispatch.cc, cpu/isa.h)
void forward(const Mask& mask, const FwdArgs& args, const Resolved& r);
void backward(const Mask& mask, const BwdArgs& args, const Resolved& r);
const char* isa_in_use();  // which one runs here, for build_info
}  // namespace cpu

// Hopper (built when CUDA is enabled, MAGI_HAS_SM90): bf16/fp16 inputs, fp32 lse. With a
// prepared mask (the same mask), the work list comes from it; without, it is built per call.
namespace sm90 {
void forward(const Mask& mask, const PreparedMask* prepared, const FwdArgs& args,
             const Resolved& r, int sm_margin, std::uintptr_t stream);
// Head dims 64, 128, 192, 256 (the forward's).
void backward(const Mask& mask, const PreparedMask* prepared, const BwdArgs& args,
              const Resolved& r, int sm_margin, std::uintptr_t stream);
}  // namespace sm90

}  // namespace magi::kernels
