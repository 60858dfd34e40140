// The distributed runtime (docs/semantics.md §3): executes a DistPlan on one rank. It decides
// nothing: the plan says which rows a rank holds, what it fetches per stage and which slices it
// computes; the runtime moves rows with the Communicator and calls attn_forward / attn_backward.
// Key decision: out/lse/dq/dk/dv are kept in the compute type (fp32/fp64) on every rank, so the
// per-stage LSE merges and gradient sums round once, as in the single-process kernel.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "magi/attention.h"
#include "magi/comm.h"
#include "magi/plan.h"
#include "magi/prepared.h"
#include "magi/tensor.h"

namespace magi::runtime {

// Tensors may be on the host or on one CUDA device, where `stream` (opts.cuda_stream for
// calc_attn) orders their producers and consumers. dispatch, undispatch and roll move device
// rows through host copies (one copy in, one back; no kernels).

// Global [N, ...] rows (every rank holds all of them) -> this rank's local rows, in the
// plan's local order. Both views contiguous, same dtype and trailing shape. No communication.
void dispatch(const plan::DistPlan& plan, const comm::Communicator& comm, const TensorView& global,
              const TensorView& local, std::uintptr_t stream = 0);
// This rank's local rows -> the global [N, ...] rows on every rank (all_gather_v). Collective.
void undispatch(const plan::DistPlan& plan, comm::Communicator& comm, const TensorView& local,
                const TensorView& global, std::uintptr_t stream = 0);
// In place over the ranks (op sum or max), a contiguous fp32 / fp64 tensor (any shape) on the
// host or a device (there through host staging when the communicator takes host rows only).
// Collective.
void all_reduce(comm::Communicator& comm, const TensorView& x, comm::ReduceOp op,
                std::uintptr_t stream = 0);

// Where one rank's calc_attn time went (optional output; docs/semantics.md §4's "hidden comm").
// Host tensors: host clocks. CUDA tensors: CUDA events on the compute stream (the kernels and
// the communication run asynchronously; the call then synchronises once, at its end, to read
// them): compute_s is the stream's time inside the attention kernels, wait_s its time between
// them and after the last (communication that compute did not hide). Per kernel call, in order
// (the host stage first, then each remote stage with slices): its compute time and the wait
// just before it. With comm_only_seconds: hidden fraction = 1 - wait_s / comm_only_seconds.
struct CalcStats {
  double compute_s = 0;
  double wait_s = 0;
  std::vector<double> stage_compute_s, stage_wait_s;
};

// One rank's masks of a plan (the host stage's slices and each remote stage's), validated and
// prepared once (prepared.h): the calc_attn calls of a training step, every layer, forward
// and backward, reuse them instead of building a Mask per stage per call, and on a GPU their
// work lists stay on the device. A call given none builds its own.
class PreparedRank {
 public:
  PreparedRank(const plan::DistPlan& plan, int rank);
  int rank() const { return rank_; }
  const PreparedMask& host() const { return *host_; }
  const PreparedMask& stage(std::size_t s) const { return *stages_[s]; }
  std::size_t num_stages() const { return stages_.size(); }
  // Throws unless this was prepared from `plan`'s stages for `rank` (the same slices).
  void check_matches(const plan::DistPlan& plan, int rank) const;

 private:
  int rank_;
  std::unique_ptr<PreparedMask> host_;
  std::vector<std::unique_ptr<PreparedMask>> stages_;
};

// Bytes of the workspace (FwdArgs / BwdArgs::workspace, on the tensors' device) with which a
// calc_attn call on CUDA tensors allocates no device memory of its own: two stages' remote K
// and V rows (the stage computing and the next in flight), in the backward also their partial
// dK and dV in the compute type, and the largest kernel workspace of the call. Per rank, with
// R = the most remote rows of any of its stages, Hkv, D, s = the input element size and c =
// the compute type's (4 for bf16/fp16/fp32):
//   forward:  2 * R * 2 * Hkv * D * s             + attn_forward_workspace_bytes(max(N_l, R), Hkv)
//   backward: 2 * R * 2 * Hkv * D * (s + c)       + attn_backward_workspace_bytes(N_l, Hq, D)
// (plus 256-byte alignment of each part). dtype: q's. Host tensors need none.
std::size_t calc_attn_workspace_bytes(const plan::DistPlan& plan, int rank, std::int64_t heads_q,
                                      std::int64_t heads_kv, std::int64_t head_dim, DType dtype,
                                      bool backward);

// Forward on local tensors (contiguous; out, lse, max_logits in the compute type). Collective.
// The sink (if any) enters once, at the host stage; max_logits is reduced (max) over ranks.
// opts.accumulate must be false. local.workspace (CUDA tensors; optional): at least
// calc_attn_workspace_bytes(..., backward=false) bytes, not used by another call in flight;
// without it the call allocates its scratch on the stream (cudaMallocAsync).
void calc_attn_forward(const plan::DistPlan& plan, comm::Communicator& comm, const FwdArgs& local,
                       const AttnOptions& opts = {}, CalcStats* stats = nullptr,
                       const PreparedRank* prepared = nullptr);
// Backward on local tensors (contiguous; dq, dk, dv in the compute type). Collective.
// dk/dv of rows fetched by other ranks are summed back to their owners (group_reduce).
// dsink is this rank's partial (its own query rows): the caller sums it over ranks, like any
// replicated parameter's gradient. local.workspace: as the forward's, of
// calc_attn_workspace_bytes(..., backward=true) bytes.
void calc_attn_backward(const plan::DistPlan& plan, comm::Communicator& comm,
                        const BwdArgs& local, const AttnOptions& opts = {},
                        CalcStats* stats = nullptr, const PreparedRank* prepared = nullptr);

// The communication of calc_attn alone, stage after stage with nothing to hide it behind:
// the K/V casts of the forward (and, with `backward`, the dK/dV reduces of zero partials into
// scratch rows). Seconds on this rank; with CalcStats::wait_s it gives the hidden fraction
// 1 - wait_s / comm_only_seconds. k, v: this rank's local rows. Collective.
double comm_only_seconds(const plan::DistPlan& plan, comm::Communicator& comm, const TensorView& k,
                         const TensorView& v, bool backward);

// torch.roll along the GLOBAL token order on dispatched local rows (docs/semantics.md §3: shifted
// labels for multi-token prediction). fill empty (torch.roll): out[g] = in[(g - shift) mod N], any
// shift (negative, > N). fill set (a shift without wrap): out[g] = in[g - shift] where 0 <= g -
// shift < N, else every element of row g is *fill (converted to the dtype). Both views contiguous
// [rank_tokens(rank), ...], same dtype and trailing shape, not aliased. Rows a rank keeps are
// copied locally; the rest move in one group_cast. Collective; bit-exact.
void roll(const plan::DistPlan& plan, comm::Communicator& comm, const TensorView& local_in,
          const TensorView& local_out, std::int64_t shift,
          std::optional<double> fill = std::nullopt, std::uintptr_t stream = 0);

}  // namespace magi::runtime
