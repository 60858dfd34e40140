// Communication interface (docs/semantics.md §3, magi_notes §5.5): group_cast / group_reduce and
// the few dense collectives that dispatch needs, on raw row buffers, non-blocking with a wait
// handle. Key decision: every wait has a deadline (Communicator::timeout()); an expired or failed
// wait throws magi::Error naming the peers it was waiting for, and the communicator is then
// "broken" (every later call throws) instead of calling MPI_Abort: the caller decides to exit.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "magi/dtype.h"
#include "magi/plan.h"

namespace magi::comm {

// A contiguous row-major [num_rows, row_elems] buffer of `dtype`; rows are the unit that
// splits count. Cast only moves bytes (any dtype); reductions need fp32 or fp64. In host
// memory (device -1) or on CUDA device `device`, where `stream` (a cudaStream_t as an integer)
// orders the buffer's producers and consumers: a communicator reads it after the work queued
// there and makes its results visible to the work queued after.
struct Rows {
  void* data = nullptr;
  std::int64_t num_rows = 0;
  std::int64_t row_elems = 0;
  DType dtype = DType::kF32;
  int device = -1;
  std::uintptr_t stream = 0;

  std::int64_t row_bytes() const { return row_elems * dtype_size(dtype); }
  std::int64_t num_bytes() const { return num_rows * row_bytes(); }
  bool on_device() const { return device >= 0; }
};

enum class ReduceOp : std::uint8_t {
  kSum,       // acc += sum of contributions
  kAvg,       // acc += mean of contributions (sum / number of source ranks of the split)
  kMax,       // all_reduce only
  kLseMerge,  // partial attention outputs: see group_reduce_lse
};

// Handle of an operation in flight. wait() blocks until it is complete (and post-processed
// into the output) or the communicator's timeout expires; both failures throw magi::Error.
// Buffers passed to the operation must stay alive and untouched until wait() returns.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkPtr = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Whether its operations take Rows on a device (NCCL: yes; MPI: no, with_device_staging
  // below wraps it).
  virtual bool device_rows() const { return false; }
  // True once a failure (timeout, dead peer, backend error) made it unusable: every later call
  // throws, and the caller should stop.
  virtual bool broken() const { return false; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // Split i of `input` (input_split_sizes[i] rows) goes to every rank in dst_ranks[i];
  // output split j comes from src_rank[j]. Splits from one source arrive in that source's
  // split order. Unused rows (sums below num_rows) are neither sent nor written.
  virtual WorkPtr group_cast(const Rows& input, std::span<const std::int64_t> input_split_sizes,
                             std::span<const std::vector<std::int32_t>> dst_ranks,
                             const Rows& output, std::span<const std::int64_t> output_split_sizes,
                             std::span<const std::int32_t> src_rank) = 0;
  WorkPtr group_cast(const Rows& input, const Rows& output,
                     const plan::GroupCollectiveArgs& args) {
    return group_cast(input, args.input_split_sizes, args.dst_ranks, output,
                      args.output_split_sizes, args.src_rank);
  }

  // The transpose of group_cast: input split i goes to dst_rank[i]; output split j is
  // accumulated (op kSum or kAvg) from every rank in src_ranks[j], in ascending source-rank
  // order, so the result is bit-for-bit reproducible.
  virtual WorkPtr group_reduce(const Rows& input, std::span<const std::int64_t> input_split_sizes,
                               std::span<const std::int32_t> dst_rank, const Rows& output,
                               std::span<const std::int64_t> output_split_sizes,
                               std::span<const std::vector<std::int32_t>> src_ranks,
                               ReduceOp op) = 0;
  WorkPtr group_reduce(const Rows& input, const Rows& output, const plan::GroupReduceArgs& args,
                       ReduceOp op) {
    return group_reduce(input, args.input_split_sizes, args.dst_rank, output,
                        args.output_split_sizes, args.src_ranks, op);
  }

  // group_reduce with op lse-merge of partial attention outputs: out rows are [heads, d],
  // lse rows are [heads] (same dtype, fp32 or fp64, same row counts as out). Per row and head,
  // contributions k (the existing output first, then sources in ascending rank) merge into
  // lse = logsumexp_k lse_k, out = sum_k exp(lse_k - lse) out_k; all -inf leaves out as is.
  virtual WorkPtr group_reduce_lse(const Rows& input_out, const Rows& input_lse,
                                   std::span<const std::int64_t> input_split_sizes,
                                   std::span<const std::int32_t> dst_rank, const Rows& output_out,
                                   const Rows& output_lse,
                                   std::span<const std::int64_t> output_split_sizes,
                                   std::span<const std::vector<std::int32_t>> src_ranks) = 0;

  // Rank r contributes `input` (counts[r] rows); output holds all ranks' rows in rank order.
  virtual WorkPtr all_gather_v(const Rows& input, const Rows& output,
                               std::span<const std::int64_t> counts) = 0;
  // Sum over ranks of `input` (sum(counts) rows); rank r keeps rows of block r in `output`.
  virtual WorkPtr reduce_scatter(const Rows& input, const Rows& output,
                                 std::span<const std::int64_t> counts) = 0;
  // In place, op kSum or kMax; fp32/fp64. Sums in ascending rank order (deterministic); a
  // NaN on any rank makes the max NaN (max_logits of a head that saw a NaN, docs/numerics.md).
  virtual WorkPtr all_reduce(const Rows& data, ReduceOp op) = 0;
  virtual void barrier() = 0;

 protected:
  std::chrono::milliseconds timeout_{std::chrono::seconds(300)};
};

std::string reduce_op_name(ReduceOp op);

// A communicator for Rows on a device over one that takes host Rows only (MPI): each operation
// copies its device inputs to host mirrors (after the work queued on their stream), runs on the
// mirrors, and its wait() copies the results back (queued on the output's stream). Sums and
// averages into a device output are received into zeroed mirrors and added to the output at
// wait(), so that several reductions into one output may be in flight (the runtime's dK / dV
// of consecutive stages); casts, gathers and scatters keep the rows they do not write. Host
// Rows go straight through. `inner` must outlive the result.
std::unique_ptr<Communicator> with_device_staging(Communicator& inner);

// Collective: throws magi::Error on every rank, naming the groups of ranks that agree, unless
// all ranks pass the same fingerprint of `what` (e.g. "the key's mask, plan and config").
void check_agree(Communicator& comm, std::uint64_t fingerprint, std::string_view what);
// 64-bit FNV-1a of bytes: stable across processes and machines (std::hash is not).
std::uint64_t fingerprint(std::span<const std::byte> bytes, std::uint64_t seed = 0);

}  // namespace magi::comm
