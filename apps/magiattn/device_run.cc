// `magiattn run` on a CUDA GPU (device_run.h): --device, --comm, the device memory check and
// the device copies of the run's tensors.
#include "device_run.h"

#include <sstream>
#include <string>
#include <vector>

#include "checks.h"
#include "magi/build_info.h"
#include "magi/error.h"

#ifdef MAGI_CLI_NCCL
#include "magi/nccl.h"
#endif

namespace magi::cli {
namespace {

// build_info() asks the CUDA runtime for its devices: once per process is enough.
const BuildInfo& info() {
  static const BuildInfo b = build_info();
  return b;
}

bool cuda_dtype(const std::string& dtype) { return dtype == "bf16" || dtype == "fp16"; }

// Whether the build has the sm90 kernel for (dtype, head dim): "bf16/128" in sm90_forward.
bool variant_built(const std::string& dtype, std::int64_t head_dim) {
  std::istringstream built(info().sm90_forward);
  const std::string want = dtype + "/" + std::to_string(head_dim);
  for (std::string v; built >> v;)
    if (v == want) return true;
  return false;
}

// Why this run cannot use the GPU with `dtype`, or "" when it can. The sm90 kernels are built
// for sm_90a only, which no other architecture runs.
std::string why_not_cuda(const RunFlags& f, const std::string& dtype) {
  const BuildInfo& b = info();
  if (!b.cuda)
    return "this build of magiattn has no GPU kernels (built with MAGI_CUDA_KERNELS=none)";
  if (b.gpus.empty()) {
    return "no CUDA device is visible" + (b.gpu_error.empty() ? "" : " (" + b.gpu_error + ")");
  }
  if (b.gpus[0].major != 9) {
    return "cuda:0 " + b.gpus[0].name + " is sm_" + std::to_string(b.gpus[0].major) +
           std::to_string(b.gpus[0].minor) + "; the kernels are built for Hopper (sm_90a)";
  }
  if (!cuda_dtype(dtype)) return "--dtype " + dtype + ": the GPU kernels take bf16 or fp16";
  if (!variant_built(dtype, f.head_dim)) {
    return "no kernel for " + dtype + "/" + std::to_string(f.head_dim) +
           " in this build (built: " + b.sm90_forward + "; see MAGI_CUDA_KERNELS)";
  }
  return "";
}

}  // namespace

int visible_gpus() { return int(info().gpus.size()); }

void resolve_device(RunFlags& f) {
  // Without --dtype a GPU run is bf16 (the kernels' main variant), a CPU run fp32.
  const std::string dtype = f.dtype_given ? f.dtype : "bf16";
  if (f.device == "cpu") {
    f.cuda = false;
  } else {
    const std::string why = why_not_cuda(f, dtype);
    MAGI_CHECK(f.device != "cuda" || why.empty(), "--device cuda: ", why);
    f.cuda = why.empty();
  }
  if (f.cuda) f.dtype = dtype;
  MAGI_CHECK(f.comm != "nccl" || f.cuda,
             "--comm nccl: NCCL moves GPU rows, but this run is on "
             "the cpu (",
             f.device == "cpu" ? "--device cpu" : why_not_cuda(f, dtype), ")");
}

void choose_gpu(RunFlags& f, int local_rank) {
  if (!f.cuda) return;
  f.gpu = local_rank % visible_gpus();
  f.device_label = "cuda:" + std::to_string(f.gpu) + " " + info().gpus[std::size_t(f.gpu)].name;
}

std::string resolve_comm(const RunFlags& f, int local_ranks) {
  if (f.comm == "mpi" || !f.cuda) return "mpi";
  const bool asked = f.comm == "nccl";
#ifdef MAGI_CLI_NCCL
  const int gpus = visible_gpus();
  // NCCL refuses two ranks on one device; MPI stages device rows through the host instead.
  if (local_ranks > gpus) {
    MAGI_CHECK(!asked, "--comm nccl: NCCL needs one GPU per rank: ", local_ranks, " ranks, ", gpus,
               " GPUs (use --comm mpi)");
    return "mpi";
  }
  std::string why;
  if (!comm::nccl::available(&why)) {
    MAGI_CHECK(!asked, "--comm nccl: cannot load libnccl: ", why);
    return "mpi";
  }
  return "nccl";
#else
  (void)local_ranks;
  MAGI_CHECK(!asked,
             "--comm nccl: this build of magiattn has no NCCL communicator (nccl.h was "
             "not found at build time)");
  return "mpi";
#endif
}

void require_device_memory(const RunFlags& f, std::int64_t nq, std::int64_t nk,
                           std::int64_t total_k, int cp, int sharing) {
  if (!f.cuda || f.mask.no_memory_check) return;
  const double in = double(dtype_size(dtype_from_name(f.dtype))), compute = 4;  // fp32 outputs
  const double hq = double(f.heads_q), hkv = double(f.heads_kv), d = double(f.head_dim);
  const double q = double(nq) * hq * d, kv = double(nk) * hkv * d;
  double bytes = in * (2 * q + 2 * kv) + compute * (2 * q + double(nq) * hq + 2 * kv) +
                 double(attn_backward_workspace_bytes(nq, f.heads_q, f.head_dim)) +
                 double(attn_forward_workspace_bytes(nk, f.heads_kv));
  // A rank may receive every other rank's K/V and send back as many dK/dV partials.
  if (cp > 1) bytes += (2 * in + 2 * compute) * double(total_k) * hkv * d;
  const double free_share = double(device::free_bytes(f.gpu)) / sharing;
  MAGI_CHECK(bytes <= free_share, "run needs about ", readable_bytes(bytes), " of GPU memory on ",
             f.device_label, " but ", readable_bytes(free_share), " is free",
             sharing > 1 ? " per rank (" + std::to_string(sharing) + " ranks share it)" : "",
             "; lower --seqlen, --heads-q, --heads-kv or --head-dim (or pass --no-memory-check)");
}

DeviceBuffers::DeviceBuffers(AttnBuffers& host, Buffer* sink, Buffer* dsink, int device,
                             bool upload)
    : host_(host),
      host_sink_(sink),
      host_dsink_(dsink),
      device_(device),
      sink_len_(sink != nullptr ? std::int64_t(sink->numel()) / host.hq : 0) {
  const auto alloc = [&](device::Buffer& d, Buffer& h, bool copy) {
    d = device::Buffer(h.bytes(), device_, kStream);
    if (copy) device::to_device(d.data(), h.data(), h.bytes(), device_, kStream);
  };
  alloc(q_, host.q, upload), alloc(k_, host.k, upload), alloc(v_, host.v, upload);
  alloc(dout_, host.dout, upload);
  alloc(out_, host.out, false), alloc(lse_, host.lse, false), alloc(dq_, host.dq, false);
  alloc(dk_, host.dk, false), alloc(dv_, host.dv, false);
  if (sink_len_ > 0) alloc(sink_, *sink, true), alloc(dsink_, *dsink, false);
  fwd_ws_ = device::Buffer(attn_forward_workspace_bytes(host.nk, host.hkv), device_, kStream);
  bwd_ws_ =
      device::Buffer(attn_backward_workspace_bytes(host.nq, host.hq, host.d), device_, kStream);
}

TensorView DeviceBuffers::view(const device::Buffer& b, const Buffer& like,
                               std::initializer_list<std::int64_t> shape) const {
  TensorView v = make_view(b.data(), like.dtype(), shape, Device::kCUDA);
  v.device_idx = device_;
  return v;
}

std::optional<TensorView> DeviceBuffers::sink_view(const device::Buffer& b) const {
  if (sink_len_ == 0) return std::nullopt;
  return view(b, *host_sink_, {sink_len_, host_.hq});
}

FwdArgs DeviceBuffers::fwd(bool workspace) const {
  const AttnBuffers& h = host_;
  FwdArgs a{view(q_, h.q, {h.nq, h.hq, h.d}),
            view(k_, h.k, {h.nk, h.hkv, h.d}),
            view(v_, h.v, {h.nk, h.hkv, h.d}),
            view(out_, h.out, {h.nq, h.hq, h.d}),
            view(lse_, h.lse, {h.nq, h.hq}),
            sink_view(sink_),
            std::nullopt};
  if (workspace) a.workspace = Workspace{fwd_ws_.data(), fwd_ws_.bytes()};
  return a;
}

BwdArgs DeviceBuffers::bwd(bool workspace) const {
  const AttnBuffers& h = host_;
  BwdArgs a{view(dout_, h.dout, {h.nq, h.hq, h.d}),
            view(q_, h.q, {h.nq, h.hq, h.d}),
            view(k_, h.k, {h.nk, h.hkv, h.d}),
            view(v_, h.v, {h.nk, h.hkv, h.d}),
            view(out_, h.out, {h.nq, h.hq, h.d}),
            view(lse_, h.lse, {h.nq, h.hq}),
            view(dq_, h.dq, {h.nq, h.hq, h.d}),
            view(dk_, h.dk, {h.nk, h.hkv, h.d}),
            view(dv_, h.dv, {h.nk, h.hkv, h.d}),
            sink_view(sink_),
            sink_view(dsink_)};
  if (workspace) a.workspace = Workspace{bwd_ws_.data(), bwd_ws_.bytes()};
  return a;
}

void DeviceBuffers::download() {
  const auto get = [&](Buffer& h, const device::Buffer& d) {
    device::to_host(h.data(), d.data(), h.bytes(), device_, kStream);
  };
  get(host_.out, out_), get(host_.lse, lse_), get(host_.dq, dq_), get(host_.dk, dk_);
  get(host_.dv, dv_);
  download_dsink();
}

void DeviceBuffers::download_dsink() {
  if (sink_len_ > 0)
    device::to_host(host_dsink_->data(), dsink_.data(), host_dsink_->bytes(), device_, kStream);
}

}  // namespace magi::cli
