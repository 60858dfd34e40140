// Communicator over MPI for CPU ranks (docs/semantics.md §3 "MPI for CPU ranks"). Each collective
// is one non-blocking all-to-all-v built from MPI_Isend/MPI_Irecv, one message per peer holding all
// the splits for that peer packed in split order; self traffic is a local copy:
//
//   rank r input  [ s0 | s1 | s2 ]  s0 -> {1}, s1 -> {1,2}, s2 -> {0}
//      pack per peer:  to 0: [s2]   to 1: [s0 s1]   to 2: [s1]        (s1 copied twice)
//      Isend(tag = seq) ------------> peers      Irecv(tag = seq) <---- every source
//   wait(): poll MPI_Testsome until all done or the deadline passes; then unpack
//      (cast: copy into output splits) or combine peer by peer in ascending rank (reduce).
//
// Key decision: a wait that passes the deadline throws magi::Error naming the peers still
// pending, cancels its receives and marks the communicator broken (later calls throw); it never
// calls MPI_Abort, so the caller reports and exits. Tags are per-call sequence numbers, so a
// late message from a failed call can never be matched by a later one.
//
// Progress: MPI moves a large message (rendezvous) only while both sides are inside an MPI
// call, so a rank busy computing would stall its peers' transfers until its next wait(). When
// MPI runs at MPI_THREAD_MULTIPLE, a progress thread polls MPI (MPI_Iprobe) while operations
// are in flight and sleeps on a condition variable otherwise; below that level there is none
// and transfers advance only inside wait() (initialise with MPI_Init_thread(MULTIPLE)).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "magi/comm.h"

namespace magi::comm::mpi {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (so our tags never meet the caller's) and sets MPI_ERRORS_RETURN on it.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool broken() const override { return !broken_reason_.empty(); }
  bool has_progress_thread() const { return progress_.joinable(); }

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

  // Internal (used by the work handles).
  MPI_Comm mpi_comm() const { return comm_; }
  void mark_broken(const std::string& reason);
  void check_usable(const char* op) const;
  int next_tag();
  void keep_alive(std::vector<std::vector<std::byte>> buffers);
  void work_started();   // an operation was posted: the progress thread polls
  void work_finished();  // it completed or was abandoned

 private:
  void progress_loop();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::int64_t seq_ = 0;
  int tag_ub_ = 32767;
  std::string broken_reason_;
  // Buffers of sends abandoned by a failed wait: MPI may still read them, so they live as long
  // as the communicator.
  std::vector<std::vector<std::byte>> orphans_;
  // Progress thread state: in_flight_ counts posted, unfinished operations.
  std::mutex progress_mutex_;
  std::condition_variable progress_cv_;
  int in_flight_ = 0;
  bool stop_ = false;
  std::thread progress_;
};

}  // namespace magi::comm::mpi
