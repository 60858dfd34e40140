// NcclCommunicator: comm.h's Communicator over a non-blocking NCCL communicator, one process per
// GPU (include/magi/nccl.h is the public face: make_communicator returns one of these).
//
// One operation, on the communicator's own high-priority stream:
//
//   caller's streams --event--> comm stream: [upload host mirrors, segment table]
//     pack (rows of a peer that are not one contiguous range)      copy kernel, all peers
//     ncclGroupStart; ncclRecv / ncclSend per peer (bytes); ncclGroupEnd    (self: a copy)
//     unpack (cast) | combine peer by peer in ascending rank (reduce)   our kernels
//     [download host mirrors] --done event--> wait(): the caller's streams wait on it
//
// A peer's rows that are one contiguous range of one column go out (and, for casts, come in)
// in place; everything else travels through stream-ordered temporaries (freed on the comm
// stream right after their last use). Key decision: NCCL only moves bytes, every bit of a
// reduction is decided by layout.h's ranges and row_kernels' kernels in ascending rank, so the
// results match comm/mpi's (row_kernels.h says where they can differ: exp/log1p, NaN payloads).
//
// Failure: a watchdog thread polls the done events of the operations in flight and NCCL's
// asynchronous error; past timeout() or on an error it aborts the NCCL communicator and marks
// this one broken with a reason naming the operation, its peers and the elapsed time. Every
// later call and every wait() throws magi::Error with that reason.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../layout.h"
#include "magi/comm.h"
#include "magi/nccl.h"

namespace magi::comm::nccl {

class PinnedPool;

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the `size` ranks passing `id`; `device` becomes the thread's device.
  NcclCommunicator(const UniqueId& id, int rank, int size, int device,
                   std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  bool device_rows() const override { return true; }
  bool broken() const override { return broken_.load(); }

  using Communicator::group_cast;
  using Communicator::group_reduce;
  WorkPtr group_cast(const Rows& input, std::span<const std::int64_t> input_split_sizes,
                     std::span<const std::vector<std::int32_t>> dst_ranks, const Rows& output,
                     std::span<const std::int64_t> output_split_sizes,
                     std::span<const std::int32_t> src_rank) override;
  WorkPtr group_reduce(const Rows& input, std::span<const std::int64_t> input_split_sizes,
                       std::span<const std::int32_t> dst_rank, const Rows& output,
                       std::span<const std::int64_t> output_split_sizes,
                       std::span<const std::vector<std::int32_t>> src_ranks,
                       ReduceOp op) override;
  WorkPtr group_reduce_lse(const Rows& input_out, const Rows& input_lse,
                           std::span<const std::int64_t> input_split_sizes,
                           std::span<const std::int32_t> dst_rank, const Rows& output_out,
                           const Rows& output_lse,
                           std::span<const std::int64_t> output_split_sizes,
                           std::span<const std::vector<std::int32_t>> src_ranks) override;
  WorkPtr all_gather_v(const Rows& input, const Rows& output,
                       std::span<const std::int64_t> counts) override;
  WorkPtr reduce_scatter(const Rows& input, const Rows& output,
                         std::span<const std::int64_t> counts) override;
  WorkPtr all_reduce(const Rows& data, ReduceOp op) override;
  void barrier() override;

  // Internal (the work handles).
  struct Op;
  void check_usable(const char* op) const;
  // Aborts NCCL and marks the communicator broken (the first reason wins).
  void fail(const std::string& reason);
  // fail() for `op` past its deadline.
  void expire(const Op& op);

 private:
  // One collective, in layout.h's terms (built by the public calls after validation).
  struct Exchange {
    const char* op = "";
    std::vector<Rows> in, out;  // columns; all_reduce: in == out
    ExchangeLayout layout;
    Combine how = Combine::kCopy;
    std::int64_t zero_rows = 0;  // reduce_scatter: out rows zeroed before the combine
    bool first_copies = false;   // all_reduce: rank 0's contribution is copied, then combined
  };
  WorkPtr post(const Exchange& x);
  // Posting-side NCCL: polls a non-blocking call to completion against `deadline`; on failure
  // aborts (api_mutex_ held) and throws naming `what`.
  void nccl_ok(ncclResult_t r, const std::string& what,
               std::chrono::steady_clock::time_point deadline);
  void abort_locked(const std::string& reason);
  std::string where(const char* op) const;
  void watchdog_loop();

  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the comm stream
  cudaEvent_t ready_ = nullptr;    // reused: "the caller's stream got here"
  std::shared_ptr<PinnedPool> pinned_;
  std::int64_t seq_ = 0;

  std::atomic<bool> broken_{false};
  mutable std::mutex state_mutex_;  // broken_reason_
  std::string broken_reason_;
  std::mutex api_mutex_;  // NCCL calls on comm_ (posting thread vs watchdog's abort)

  std::mutex watch_mutex_;  // in_flight_, stop_
  std::condition_variable watch_cv_;
  std::vector<std::shared_ptr<Op>> in_flight_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace magi::comm::nccl
