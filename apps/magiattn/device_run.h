// `magiattn run` on a CUDA GPU: which device a run uses (--device, --comm), whether its tensors
// fit there, and their device copies. Key decision: the host Buffers stay the source of truth
// (they hold the dtype-rounded inputs the oracle reads, and receive the outputs for the
// check); the GPU sees copies, so the CPU and GPU runs share the setup and the check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "magi/attention.h"
#include "magi/device_memory.h"
#include "run_buffers.h"
#include "run_command.h"

namespace magi::cli {

// CUDA devices visible to this process (0 in a build without CUDA).
int visible_gpus();

// Resolves --device in place: f.cuda, and --dtype's default (bf16 on cuda, where the kernels
// take 16-bit inputs only). Throws naming --device when cuda is asked for and impossible.
void resolve_device(RunFlags& f);

// The rank's GPU: local_rank % visible GPUs; sets f.gpu and f.device_label.
void choose_gpu(RunFlags& f, int local_rank);

// --comm for a distributed run of `local_ranks` ranks on this host: "mpi" or "nccl"
// (auto: nccl when built, loadable and every rank of the host has its own GPU). Throws naming
// --comm when nccl is asked for and impossible. Local: other hosts may decide otherwise, so
// auto's answer is agreed across ranks by the caller.
std::string resolve_comm(const RunFlags& f, int local_ranks);

// Refuses a problem whose device tensors do not fit in the free memory of f.gpu, shared by
// `sharing` processes (ranks on one GPU). nq, nk: this process's rows; cp > 1 adds the K/V
// rows a rank may receive (the whole problem's, at most).
void require_device_memory(const RunFlags& f, std::int64_t nq, std::int64_t nk,
                           std::int64_t total_k, int cp, int sharing);

// Device copies of AttnBuffers (and the sink), on f.gpu's legacy default stream.
class DeviceBuffers {
 public:
  // upload: copy q, k, v, dout now (a distributed run's local rows arrive by dispatch);
  // the sink (replicated) is always copied.
  DeviceBuffers(AttnBuffers& host, Buffer* sink, Buffer* dsink, int device, bool upload);
  FwdArgs fwd(bool workspace) const;
  BwdArgs bwd(bool workspace) const;
  // out, lse, dq, dk, dv and dsink into the host buffers.
  void download();
  void download_dsink();
  int device() const { return device_; }

  // Device seconds of what f() queues on the stream (CUDA events around it; waits for it).
  template <typename F>
  double seconds(F&& f) const {
    device::Event start(device_), stop(device_);
    start.record(kStream);
    f();
    stop.record(kStream);
    return device::Event::seconds_between(start, stop);
  }
  void synchronize() const { device::synchronize(device_, kStream); }

  static constexpr std::uintptr_t kStream = 0;  // the legacy default stream (opts.cuda_stream)

 private:
  TensorView view(const device::Buffer& b, const Buffer& like,
                  std::initializer_list<std::int64_t> shape) const;
  std::optional<TensorView> sink_view(const device::Buffer& b) const;

  AttnBuffers& host_;
  Buffer *host_sink_, *host_dsink_;
  int device_;
  std::int64_t sink_len_;
  device::Buffer q_, k_, v_, dout_, out_, lse_, dq_, dk_, dv_, sink_, dsink_, fwd_ws_, bwd_ws_;
};

}  // namespace magi::cli
