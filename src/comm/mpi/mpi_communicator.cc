// MPI backend: one packed message per peer, posted with MPI_Irecv/MPI_Isend and completed by
// polling MPI_Testsome against a deadline (MPI has no timed wait). Polling backs off to 50 us
// sleeps so that 8 oversubscribed ranks on 2 cores still make progress.
#include "mpi_communicator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include "../layout.h"
#include "mpi_check.h"

namespace magi::comm::mpi {
namespace {

using Buffers = std::vector<std::vector<std::byte>>;
using Clock = std::chrono::steady_clock;

// One collective in flight: per-peer receive buffers, the send buffers it keeps alive, and
// `finish`, which turns the received buffers (self included) into the output.
class ExchangeWork final : public Work {
 public:
  ExchangeWork(MpiCommunicator& comm, std::string op, Buffers send,
               std::vector<std::int64_t> recv_bytes, std::function<void(Buffers&)> finish)
      : comm_(comm), op_(std::move(op)), send_(std::move(send)), finish_(std::move(finish)) {
    const int self = comm.rank();
    tag_ = comm.next_tag();
    recv_.resize(std::size_t(comm.size()));
    const auto self_bytes = std::int64_t(send_[std::size_t(self)].size());
    MAGI_CHECK(self_bytes == recv_bytes[std::size_t(self)], op_, " on rank ", self, ": sends ",
               self_bytes, " bytes to itself but expects ", recv_bytes[std::size_t(self)],
               " from itself");
    recv_[std::size_t(self)] = std::move(send_[std::size_t(self)]);
    // Receives first, so that a peer's eager message finds its buffer posted.
    for (int p = 0; p < comm.size(); ++p)
      if (p != self && recv_bytes[std::size_t(p)] > 0) {
        recv_[std::size_t(p)].resize(std::size_t(recv_bytes[std::size_t(p)]));
        post(p, true, recv_[std::size_t(p)]);
      }
    for (int p = 0; p < comm.size(); ++p)
      if (p != self && !send_[std::size_t(p)].empty()) post(p, false, send_[std::size_t(p)]);
    if (!requests_.empty()) track();
  }

  // A request-only operation (barrier): `what` names what it waits for.
  ExchangeWork(MpiCommunicator& comm, std::string op, MPI_Request request, std::string what)
      : comm_(comm), op_(std::move(op)) {
    requests_.push_back(request);
    pending_.push_back({-1, false, 0, std::move(what)});
    track();
  }

  ~ExchangeWork() override {
    if (!done_ && live() > 0) abandon("a " + op_ + " handle was destroyed before wait()");
    untrack();
  }

  void wait() override {
    if (done_) return;
    const auto timeout = comm_.timeout();
    const auto deadline = Clock::now() + timeout;
    std::vector<int> indices(requests_.size());
    std::vector<MPI_Status> statuses(requests_.size());
    for (int idle = 0; live() > 0;) {
      int count = 0;
      const int rc = MPI_Testsome(int(requests_.size()), requests_.data(), &count, indices.data(),
                                  statuses.data());
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) fail_with(error_string(rc));
      if (count == MPI_UNDEFINED) break;
      for (int k = 0; k < count; ++k) finish_request(indices[std::size_t(k)], statuses[std::size_t(k)], rc);
      if (count > 0) {
        idle = 0;
        continue;
      }
      if (Clock::now() > deadline) time_out(timeout);
      if (++idle > 64)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else
        std::this_thread::yield();
    }
    done_ = true;
    untrack();
    if (finish_) finish_(recv_);
  }

 private:
  struct Pending {
    int peer;  // -1: not one peer (barrier)
    bool is_recv;
    std::int64_t bytes;
    std::string what;
  };

  void post(int peer, bool is_recv, std::vector<std::byte>& buffer) {
    MAGI_CHECK(buffer.size() <= std::size_t(INT_MAX), op_, " on rank ", comm_.rank(), ": ",
               buffer.size(), " bytes for rank ", peer,
               " exceed one MPI message (2 GiB); split the call");
    MPI_Request request = MPI_REQUEST_NULL;
    if (is_recv)
      MAGI_MPI_CHECK(MPI_Irecv(buffer.data(), int(buffer.size()), MPI_BYTE, peer, tag_,
                               comm_.mpi_comm(), &request));
    else
      MAGI_MPI_CHECK(MPI_Isend(buffer.data(), int(buffer.size()), MPI_BYTE, peer, tag_,
                               comm_.mpi_comm(), &request));
    requests_.push_back(request);
    pending_.push_back({peer, is_recv, std::int64_t(buffer.size()), ""});
  }

  void track() {
    tracked_ = true;
    comm_.work_started();
  }
  void untrack() {
    if (tracked_) comm_.work_finished();
    tracked_ = false;
  }

  std::size_t live() const {
    return std::size_t(std::count_if(requests_.begin(), requests_.end(),
                                     [](MPI_Request r) { return r != MPI_REQUEST_NULL; }));
  }

  std::string describe(const Pending& p) const {
    if (p.peer < 0) return p.what;
    return "rank " + std::to_string(p.peer) + " (" + (p.is_recv ? "receive of " : "send of ") +
           std::to_string(p.bytes) + " bytes)";
  }

  std::string where() const {
    return op_ + " (tag " + std::to_string(tag_) + ") on rank " + std::to_string(comm_.rank()) +
           " of " + std::to_string(comm_.size());
  }

  void finish_request(int idx, const MPI_Status& status, int rc) {
    const Pending& p = pending_[std::size_t(idx)];
    if (rc == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS)
      fail_with(describe(p) + " failed: " + error_string(status.MPI_ERROR));
    if (!p.is_recv || p.peer < 0) return;
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got != p.bytes)
      fail_with("received " + std::to_string(got) + " bytes from rank " + std::to_string(p.peer) +
                " but expected " + std::to_string(p.bytes) +
                ": the ranks disagree on split sizes");
  }

  [[noreturn]] void time_out(std::chrono::milliseconds timeout) {
    std::string peers;
    for (std::size_t i = 0; i < requests_.size(); ++i)
      if (requests_[i] != MPI_REQUEST_NULL) peers += (peers.empty() ? "" : ", ") + describe(pending_[i]);
    fail_with("timed out after " + std::to_string(timeout.count()) + " ms waiting for " + peers +
              "; that rank may have died or skipped the call");
  }

  [[noreturn]] void fail_with(const std::string& why) {
    const std::string message = where() + ": " + why;
    abandon(message);
    MAGI_FAIL(message);
  }

  // Give up on the pending requests: receives are cancelled, sends released; MPI may still
  // touch their buffers, so the communicator keeps them, and refuses further calls.
  void abandon(const std::string& reason) {
    done_ = true;
    untrack();
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      // A non-blocking collective (barrier) may be neither cancelled nor freed: leave it.
      if (pending_[i].peer < 0) continue;
      if (pending_[i].is_recv) MPI_Cancel(&requests_[i]);
      MPI_Request_free(&requests_[i]);
    }
    comm_.keep_alive(std::move(send_));
    comm_.keep_alive(std::move(recv_));
    comm_.mark_broken(reason);
  }

  MpiCommunicator& comm_;
  std::string op_;
  int tag_ = 0;
  Buffers send_, recv_;
  std::function<void(Buffers&)> finish_;
  std::vector<MPI_Request> requests_;
  std::vector<Pending> pending_;
  bool done_ = false;
  bool tracked_ = false;
};

// Message sizes and packed buffers of one exchange from its layout.
struct Messages {
  Buffers send;
  std::vector<std::int64_t> recv_bytes;
};

Messages pack_messages(const ExchangeLayout& layout, std::span<const Rows> in_columns,
                       std::span<const Rows> out_columns) {
  Messages m;
  const std::int64_t out_row = message_row_bytes(out_columns);
  for (std::size_t p = 0; p < layout.send.size(); ++p) {
    m.send.push_back(pack(in_columns, layout.send[p]));
    m.recv_bytes.push_back(total_rows(layout.recv[p]) * out_row);
  }
  return m;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  MAGI_CHECK(initialized, "MpiCommunicator: call MPI_Init before creating a communicator");
  MAGI_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MAGI_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MAGI_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MAGI_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  void* ub = nullptr;
  int found = 0;
  MAGI_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found));
  if (found) tag_ub_ = *static_cast<int*>(ub);
  int level = MPI_THREAD_SINGLE;
  MAGI_MPI_CHECK(MPI_Query_thread(&level));
  if (level == MPI_THREAD_MULTIPLE) progress_ = std::thread([this] { progress_loop(); });
}

void MpiCommunicator::work_started() {
  if (!progress_.joinable()) return;
  {
    std::lock_guard lock(progress_mutex_);
    ++in_flight_;
  }
  progress_cv_.notify_one();
}

void MpiCommunicator::work_finished() {
  if (!progress_.joinable()) return;
  std::lock_guard lock(progress_mutex_);
  --in_flight_;
}

void MpiCommunicator::progress_loop() {
  std::unique_lock lock(progress_mutex_);
  while (true) {
    progress_cv_.wait(lock, [this] { return stop_ || in_flight_ > 0; });
    if (stop_) return;
    lock.unlock();
    // Any MPI call runs the progress engine; Iprobe consumes nothing. Errors (a dead peer)
    // are the waiting thread's to report.
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    lock.lock();
  }
}

MpiCommunicator::~MpiCommunicator() {
  if (progress_.joinable()) {
    {
      std::lock_guard lock(progress_mutex_);
      stop_ = true;
    }
    progress_cv_.notify_one();
    progress_.join();
  }
  // A broken communicator may still have messages in flight that reference it; leave it to
  // MPI_Finalize rather than free it under them.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!broken() && !finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::mark_broken(const std::string& reason) {
  if (broken_reason_.empty()) broken_reason_ = reason;
}

void MpiCommunicator::check_usable(const char* op) const {
  MAGI_CHECK(broken_reason_.empty(), op, " on rank ", rank_,
             ": communicator is unusable after an earlier failure: ", broken_reason_);
}

int MpiCommunicator::next_tag() { return int(seq_++ % (std::int64_t(tag_ub_) + 1)); }

void MpiCommunicator::keep_alive(Buffers buffers) {
  for (auto& b : buffers)
    if (!b.empty()) orphans_.push_back(std::move(b));
}

namespace {

// A group_cast's messages posted (group_cast, all_gather_v): copies land in `output`.
WorkPtr post_cast(MpiCommunicator& c, const ExchangeLayout& layout, const char* op,
                  const Rows& input, const Rows& output) {
  Messages m = pack_messages(layout, {&input, 1}, {&output, 1});
  return std::make_unique<ExchangeWork>(
      c, op, std::move(m.send), std::move(m.recv_bytes),
      [output, recv = layout.recv](Buffers& got) {
        for (std::size_t p = 0; p < got.size(); ++p)
          combine({&output, 1}, got[p], recv[p], Combine::kCopy);
      });
}

}  // namespace

WorkPtr MpiCommunicator::group_cast(const Rows& input,
                                    std::span<const std::int64_t> input_split_sizes,
                                    std::span<const std::vector<std::int32_t>> dst_ranks,
                                    const Rows& output,
                                    std::span<const std::int64_t> output_split_sizes,
                                    std::span<const std::int32_t> src_rank) {
  check_usable("group_cast");
  return post_cast(*this,
                   group_cast_layout("group_cast", rank_, size_, input, input_split_sizes,
                                     dst_ranks, output, output_split_sizes, src_rank),
                   "group_cast", input, output);
}

WorkPtr MpiCommunicator::group_reduce(const Rows& input,
                                      std::span<const std::int64_t> input_split_sizes,
                                      std::span<const std::int32_t> dst_rank, const Rows& output,
                                      std::span<const std::int64_t> output_split_sizes,
                                      std::span<const std::vector<std::int32_t>> src_ranks,
                                      ReduceOp op) {
  check_usable("group_reduce");
  const ExchangeLayout layout =
      group_reduce_layout(rank_, size_, input, input_split_sizes, dst_rank, output,
                          output_split_sizes, src_ranks, op);
  Messages m = pack_messages(layout, {&input, 1}, {&output, 1});
  return std::make_unique<ExchangeWork>(
      *this, "group_reduce", std::move(m.send), std::move(m.recv_bytes),
      [output, recv = layout.recv](Buffers& got) {
        for (std::size_t p = 0; p < got.size(); ++p)
          combine({&output, 1}, got[p], recv[p], Combine::kSum);
      });
}

WorkPtr MpiCommunicator::group_reduce_lse(const Rows& input_out, const Rows& input_lse,
                                          std::span<const std::int64_t> input_split_sizes,
                                          std::span<const std::int32_t> dst_rank,
                                          const Rows& output_out, const Rows& output_lse,
                                          std::span<const std::int64_t> output_split_sizes,
                                          std::span<const std::vector<std::int32_t>> src_ranks) {
  check_usable("group_reduce_lse");
  const Rows in[2] = {input_out, input_lse};
  const std::array<Rows, 2> out = {output_out, output_lse};
  const ExchangeLayout layout = group_reduce_lse_layout(
      rank_, size_, std::span<const Rows, 2>(in), input_split_sizes, dst_rank, out,
      output_split_sizes, src_ranks);
  Messages m = pack_messages(layout, in, out);
  return std::make_unique<ExchangeWork>(
      *this, "group_reduce_lse", std::move(m.send), std::move(m.recv_bytes),
      [out, recv = layout.recv](Buffers& got) {
        for (std::size_t p = 0; p < got.size(); ++p)
          combine(out, got[p], recv[p], Combine::kLseMerge);
      });
}

WorkPtr MpiCommunicator::all_gather_v(const Rows& input, const Rows& output,
                                      std::span<const std::int64_t> counts) {
  check_usable("all_gather_v");
  return post_cast(*this, all_gather_v_layout(rank_, size_, input, output, counts),
                   "all_gather_v", input, output);
}

WorkPtr MpiCommunicator::reduce_scatter(const Rows& input, const Rows& output,
                                        std::span<const std::int64_t> counts) {
  check_usable("reduce_scatter");
  const ExchangeLayout layout = reduce_scatter_layout(rank_, size_, input, output, counts);
  const std::int64_t mine = counts[std::size_t(rank_)];
  Messages m = pack_messages(layout, {&input, 1}, {&output, 1});
  return std::make_unique<ExchangeWork>(
      *this, "reduce_scatter", std::move(m.send), std::move(m.recv_bytes),
      [output, mine, recv = layout.recv](Buffers& got) {
        if (mine > 0) std::memset(output.data, 0, std::size_t(mine * output.row_bytes()));
        for (std::size_t p = 0; p < got.size(); ++p)
          combine({&output, 1}, got[p], recv[p], Combine::kSum);
      });
}

WorkPtr MpiCommunicator::all_reduce(const Rows& data, ReduceOp op) {
  check_usable("all_reduce");
  check_all_reduce(data, op);
  // Every rank gathers all contributions and folds them in rank order, so all ranks hold the
  // same bits (a tree would differ by rank). Bytes move P times; fine at dispatch sizes.
  const std::vector<RowRange> whole{{0, data.num_rows}};
  Buffers send(std::size_t(size_), pack({&data, 1}, whole));
  std::vector<std::int64_t> recv_bytes(std::size_t(size_), data.num_bytes());
  const Combine how = op == ReduceOp::kSum ? Combine::kSum : Combine::kMax;
  return std::make_unique<ExchangeWork>(
      *this, "all_reduce", std::move(send), std::move(recv_bytes),
      [data, whole, how](Buffers& got) {
        combine({&data, 1}, got[0], whole, Combine::kCopy);
        for (std::size_t p = 1; p < got.size(); ++p) combine({&data, 1}, got[p], whole, how);
      });
}

void MpiCommunicator::barrier() {
  check_usable("barrier");
  MPI_Request request = MPI_REQUEST_NULL;
  MAGI_MPI_CHECK(MPI_Ibarrier(comm_, &request));
  ExchangeWork(*this, "barrier", request, "the other ranks to enter the barrier").wait();
}

}  // namespace magi::comm::mpi
