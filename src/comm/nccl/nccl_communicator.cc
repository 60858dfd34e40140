// NcclCommunicator (nccl_communicator.h) and include/magi/nccl.h's entry points.
#include "nccl_communicator.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <optional>
#include <type_traits>
#include <utility>

#include "magi/device_memory.h"
#include "magi/error.h"
#include "nccl_api.h"
#include "row_kernels.h"

namespace magi::comm::nccl {

using Clock = std::chrono::steady_clock;

namespace {

static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<UniqueId>, "UniqueId is ncclUniqueId's bytes");

std::int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

void cuda_ok(cudaError_t e, const std::string& what) {
  MAGI_CHECK(e == cudaSuccess, "NCCL communicator: ", what, ": ", cudaGetErrorString(e));
}

cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Makes `device` current for one call and restores the caller's (torch's current device may be
// another one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_ok(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) cuda_ok(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// The peer's rows, if they are one contiguous run of rows (adjacent ranges merge): its begin.
std::optional<std::int64_t> contiguous(std::span<const RowRange> ranges) {
  if (ranges.empty()) return std::nullopt;
  std::int64_t end = ranges[0].begin;
  for (const RowRange& r : ranges) {
    if (r.begin != end) return std::nullopt;
    end += r.count;
  }
  return ranges[0].begin;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s.empty() ? "no other rank" : (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

}  // namespace

// Page-locked host blocks reused across operations (cudaHostAlloc is slow, and the segment
// tables and host mirrors of every operation need some): power-of-two sizes, at least 4 KiB.
class PinnedPool {
 public:
  struct Block {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  Block acquire(std::size_t bytes) {
    std::size_t size = 4096;
    while (size < bytes) size *= 2;
    {
      std::lock_guard lock(mutex_);
      if (auto it = free_.find(size); it != free_.end()) {
        Block b{it->second, size};
        free_.erase(it);
        return b;
      }
    }
    Block b{nullptr, size};
    cuda_ok(cudaHostAlloc(&b.data, size, cudaHostAllocPortable),
            "cudaHostAlloc of " + std::to_string(size) + " bytes");
    return b;
  }
  void release(Block b) {
    std::lock_guard lock(mutex_);
    free_.emplace(b.bytes, b.data);
  }
  // After an abort the device may still touch blocks: never free them.
  void leak() { leak_ = true; }
  ~PinnedPool() {
    if (!leak_)
      for (auto& [size, p] : free_) cudaFreeHost(p);
  }

 private:
  std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
  std::atomic<bool> leak_{false};
};

// One operation in flight: what the watchdog and its handle need after post() returned.
struct NcclCommunicator::Op {
  std::string name;  // "group_cast"
  std::string what;  // "group_cast #3 on rank 0 of 2 (device 0) with ranks 1, 2"
  Clock::time_point start, deadline;
  cudaEvent_t done = nullptr;
  std::shared_ptr<PinnedPool> pool;
  std::vector<PinnedPool::Block> pinned;  // tables and host mirrors, until done
  struct CopyBack {
    const void* from;  // pinned, filled by the comm stream
    void* to;          // the caller's host Rows
    std::size_t bytes;
  };
  std::vector<CopyBack> back;
  ~Op() {
    if (done) cudaEventDestroy(done);
    for (const auto& b : pinned) pool->release(b);
  }
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator& comm, std::shared_ptr<NcclCommunicator::Op> op,
           std::vector<cudaStream_t> streams)
      : comm_(comm), op_(std::move(op)), streams_(std::move(streams)) {}

  // Device outputs: the callers' streams wait for the done event (the host does not). Host
  // outputs: blocks until the bytes are there (the watchdog enforces the deadline; this loop
  // checks it too, in case the watchdog has not looked yet).
  void wait() override {
    if (!op_) return;
    const std::shared_ptr<NcclCommunicator::Op> op = std::move(op_);
    comm_.check_usable(op->name.c_str());
    DeviceGuard guard(comm_.device());
    if (!op->back.empty()) {
      for (int idle = 0;; ++idle) {
        const cudaError_t e = cudaEventQuery(op->done);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
          comm_.fail(op->what + ": CUDA error " + cudaGetErrorString(e));
          break;
        }
        if (comm_.broken()) break;
        if (Clock::now() > op->deadline) comm_.expire(*op);
        if (idle < 64)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      comm_.check_usable(op->name.c_str());
      for (const auto& b : op->back) std::memcpy(b.to, b.from, b.bytes);
    }
    for (cudaStream_t s : streams_)
      cuda_ok(cudaStreamWaitEvent(s, op->done, 0), op->what + ": cudaStreamWaitEvent");
  }

 private:
  NcclCommunicator& comm_;
  std::shared_ptr<NcclCommunicator::Op> op_;
  std::vector<cudaStream_t> streams_;
};

// The kernel launches of one operation, and their segment tables in one host buffer that is
// uploaded once.
class Launches {
 public:
  struct Launch {
    bool lse = false;
    RowOp op = RowOp::kCopy;
    std::size_t offset = 0;  // into the table
    int n = 0;
    std::int64_t max = 0;  // bytes (rows) or rows (lse)
  };
  // A launch of the segments that `fill` appends (skipped when it appends none).
  template <typename S, typename Fill>
  std::optional<Launch> add(bool lse, RowOp op, Fill&& fill) {
    std::vector<S> segs;
    fill(segs);
    std::erase_if(segs, [](const S& s) {
      if constexpr (std::is_same_v<S, Segment>)
        return s.rows == 0 || s.width == 0;
      else
        return s.rows == 0;
    });
    if (segs.empty()) return std::nullopt;
    Launch l{lse, op, align(table_.size()), int(segs.size()), 0};
    for (const S& s : segs) {
      if constexpr (std::is_same_v<S, Segment>)
        l.max = std::max(l.max, s.rows * s.width);
      else
        l.max = std::max(l.max, s.rows);
    }
    table_.resize(l.offset + segs.size() * sizeof(S));
    std::memcpy(table_.data() + l.offset, segs.data(), segs.size() * sizeof(S));
    return l;
  }
  const std::vector<unsigned char>& table() const { return table_; }

 private:
  static std::size_t align(std::size_t n) { return (n + 15) / 16 * 16; }
  std::vector<unsigned char> table_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(const UniqueId& id, int rank, int size, int device,
                                   std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), device_(device), pinned_(std::make_shared<PinnedPool>()) {
  set_timeout(timeout);
  const Api& nccl = api();
  cuda_ok(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  int least = 0, greatest = 0;
  cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  cuda_ok(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
          "creating the comm stream");
  try {
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), id.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; we poll against our deadlines
    const auto deadline = Clock::now() + timeout;
    const ncclResult_t r = nccl.CommInitRankConfig(&comm_, size, uid, rank, &config);
    std::lock_guard lock(api_mutex_);
    nccl_ok(r, "ncclCommInitRankConfig (the " + std::to_string(size) +
                   " ranks must all call make_communicator with the same id)", deadline);
  } catch (...) {
    if (ready_) cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
    throw;
  }
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard lock(watch_mutex_);
    stop_ = true;
  }
  watch_cv_.notify_one();
  if (watchdog_.joinable()) watchdog_.join();
  cudaSetDevice(device_);
  if (!broken()) {
    // Finalize flushes what is still queued; a peer that never comes makes it time out, and
    // then the communicator is aborted instead (a destructor must not hang).
    std::lock_guard lock(api_mutex_);
    const Api& nccl = api();
    const auto deadline = Clock::now() + timeout();
    ncclResult_t r = nccl.CommFinalize(comm_);
    while (r == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      nccl.CommGetAsyncError(comm_, &r);
    }
    if (r == ncclSuccess) {
      nccl.CommDestroy(comm_);
      cudaStreamSynchronize(stream_);  // our kernels after the last NCCL call
    } else {
      nccl.CommAbort(comm_);
      pinned_->leak();
    }
    comm_ = nullptr;
  } else {
    pinned_->leak();
  }
  in_flight_.clear();
  cudaEventDestroy(ready_);
  cudaStreamDestroy(stream_);
}

std::string NcclCommunicator::where(const char* op) const {
  return std::string(op) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
         " (device " + std::to_string(device_) + ")";
}

void NcclCommunicator::check_usable(const char* op) const {
  if (!broken()) return;
  std::lock_guard lock(state_mutex_);
  MAGI_FAIL(op, " on rank ", rank_, ": the NCCL communicator is unusable after an earlier failure: ",
            broken_reason_);
}

void NcclCommunicator::abort_locked(const std::string& reason) {
  {
    std::lock_guard lock(state_mutex_);
    if (!broken_reason_.empty()) return;
    broken_reason_ = reason + "; the NCCL communicator was aborted";
  }
  if (comm_) api().CommAbort(comm_);
  comm_ = nullptr;
  broken_ = true;
  pinned_->leak();
}

void NcclCommunicator::fail(const std::string& reason) {
  std::lock_guard lock(api_mutex_);
  abort_locked(reason);
}

void NcclCommunicator::expire(const Op& op) {
  fail(op.what + ": not complete after " + std::to_string(ms_since(op.start)) + " ms (timeout " +
       std::to_string(timeout().count()) + " ms); a peer may have died or skipped the call");
}

void NcclCommunicator::nccl_ok(ncclResult_t r, const std::string& what, Clock::time_point deadline) {
  const Api& nccl = api();
  const auto start = Clock::now();
  for (int idle = 0; r == ncclInProgress; ++idle) {
    if (Clock::now() > deadline) {
      const std::string why = what + " on rank " + std::to_string(rank_) + " of " +
                              std::to_string(size_) + ": still in progress after " +
                              std::to_string(ms_since(start)) + " ms (timeout " +
                              std::to_string(timeout().count()) +
                              " ms); a peer may have died or not called it";
      abort_locked(why);
      MAGI_FAIL(why + "; the NCCL communicator was aborted");
    }
    if (idle < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    nccl.CommGetAsyncError(comm_, &r);
  }
  if (r != ncclSuccess) {
    const std::string why = what + " on rank " + std::to_string(rank_) + " of " +
                            std::to_string(size_) + " failed: " + describe(nccl, r, comm_);
    abort_locked(why);
    MAGI_FAIL(why + "; the NCCL communicator was aborted");
  }
}

void NcclCommunicator::watchdog_loop() {
  cudaSetDevice(device_);
  const Api& nccl = api();
  std::unique_lock lock(watch_mutex_);
  while (true) {
    watch_cv_.wait(lock, [this] { return stop_ || !in_flight_.empty(); });
    if (stop_) return;
    std::string failure;
    std::shared_ptr<Op> expired;
    std::erase_if(in_flight_, [&](const std::shared_ptr<Op>& op) {
      const cudaError_t e = cudaEventQuery(op->done);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady && failure.empty())
        failure = op->what + ": CUDA error " + cudaGetErrorString(e);
      if (!expired && Clock::now() > op->deadline) expired = op;
      return false;
    });
    // Ops in flight, oldest first: name the oldest with an asynchronous NCCL error.
    const std::shared_ptr<Op> oldest = in_flight_.empty() ? nullptr : in_flight_.front();
    lock.unlock();
    if (!failure.empty()) {
      fail(failure);
    } else if (expired) {
      expire(*expired);
    } else if (oldest && !broken()) {
      // Only between posts: the posting thread owns comm_ while it calls NCCL.
      std::unique_lock api(api_mutex_, std::try_to_lock);
      ncclResult_t r = ncclSuccess;
      if (api.owns_lock() && comm_ && nccl.CommGetAsyncError(comm_, &r) == ncclSuccess &&
          r != ncclSuccess && r != ncclInProgress)
        abort_locked(oldest->what + ": NCCL reported " + describe(nccl, r, comm_) + " after " +
                     std::to_string(ms_since(oldest->start)) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    lock.lock();
    if (broken()) in_flight_.clear();  // their wait()s throw; nothing left to watch
  }
}

WorkPtr NcclCommunicator::post(const Exchange& x) {
  check_usable(x.op);
  const auto start = Clock::now();
  DeviceGuard guard(device_);
  for (const auto* cols : {&x.in, &x.out})
    for (const Rows& r : *cols)
      MAGI_CHECK(!r.on_device() || r.device == device_, where(x.op), ": a buffer is on device ",
                 r.device, " but the communicator is on device ", device_);
  const std::int64_t in_row = message_row_bytes(x.in), out_row = message_row_bytes(x.out);
  const auto self = std::size_t(rank_);
  MAGI_CHECK(total_rows(x.layout.send[self]) * in_row == total_rows(x.layout.recv[self]) * out_row,
             where(x.op), ": sends ", total_rows(x.layout.send[self]) * in_row,
             " bytes to itself but expects ", total_rows(x.layout.recv[self]) * out_row);

  auto op = std::make_shared<Op>();
  op->pool = pinned_;
  op->name = x.op;
  std::vector<int> peers;
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && (!x.layout.send[std::size_t(p)].empty() || !x.layout.recv[std::size_t(p)].empty()))
      peers.push_back(p);
  op->what = std::string(x.op) + " #" + std::to_string(seq_++) + " on rank " +
             std::to_string(rank_) + " of " + std::to_string(size_) + " (device " +
             std::to_string(device_) + ") with " + rank_list(peers);
  const std::uintptr_t cs = reinterpret_cast<std::uintptr_t>(stream_);
  std::vector<device::Buffer> temps;  // freed on the comm stream when post returns
  auto temp = [&](std::int64_t bytes) {
    temps.emplace_back(std::size_t(bytes), device_, cs);
    return static_cast<unsigned char*>(temps.back().data());
  };
  auto pinned = [&](std::size_t bytes) {
    op->pinned.push_back(pinned_->acquire(bytes));
    return op->pinned.back().data;
  };

  // The comm stream starts after the work queued on every caller stream (inputs are read,
  // outputs read and written).
  std::vector<cudaStream_t> streams;
  for (const auto* cols : {&x.in, &x.out})
    for (const Rows& r : *cols)
      if (r.on_device() && std::find(streams.begin(), streams.end(), as_stream(r.stream)) == streams.end())
        streams.push_back(as_stream(r.stream));
  for (cudaStream_t s : streams) {
    cuda_ok(cudaEventRecord(ready_, s), where(x.op) + ": cudaEventRecord on the caller's stream");
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), where(x.op) + ": cudaStreamWaitEvent");
  }

  // Device views of the columns: host Rows get a device mirror (uploaded: outputs keep the
  // rows not written, and reductions add to them) and outputs a download at the end. One
  // mirror per host buffer (all_reduce's input is its output).
  struct Mirror {
    unsigned char* device;
    void* staging;  // pinned
  };
  std::map<const void*, Mirror> mirrors;
  auto on_device = [&](const Rows& r, bool output) {
    Rows d = r;
    if (r.on_device() || r.num_bytes() == 0) return d;
    const auto bytes = std::size_t(r.num_bytes());
    auto [it, fresh] = mirrors.try_emplace(r.data, Mirror{nullptr, nullptr});
    if (fresh) {
      it->second = {temp(r.num_bytes()), pinned(bytes)};
      std::memcpy(it->second.staging, r.data, bytes);
      cuda_ok(cudaMemcpyAsync(it->second.device, it->second.staging, bytes,
                              cudaMemcpyHostToDevice, stream_),
              where(x.op) + ": uploading a host buffer");
      if (output) op->back.push_back({it->second.staging, r.data, bytes});
    }
    d.data = it->second.device;
    d.device = device_;
    d.stream = cs;
    return d;
  };
  std::vector<Rows> in, out;  // outputs first: a buffer that is both is downloaded
  for (const Rows& r : x.out) out.push_back(on_device(r, true));
  for (const Rows& r : x.in) in.push_back(on_device(r, false));
  const bool aliased = in[0].data == out[0].data;
  auto row_ptr = [](const Rows& c, std::int64_t row) {
    return static_cast<unsigned char*>(c.data) + row * c.row_bytes();
  };

  // Per peer: where its message is read from (in place or packed) and where it lands (in
  // place for casts, else a buffer combined afterwards; self's message is its send buffer).
  std::vector<const unsigned char*> send_at(std::size_t(size_), nullptr);
  std::vector<unsigned char*> recv_at(std::size_t(size_), nullptr);
  std::vector<bool> recv_in_place(std::size_t(size_), false);
  std::vector<std::pair<unsigned char*, std::span<const RowRange>>> packs;
  for (int p = 0; p < size_; ++p) {
    const auto& send = x.layout.send[std::size_t(p)];
    const auto& recv = x.layout.recv[std::size_t(p)];
    if (!send.empty()) {
      const auto begin = contiguous(send);
      if (begin && in.size() == 1 && !(p == rank_ && aliased)) {
        send_at[std::size_t(p)] = row_ptr(in[0], *begin);
      } else {
        unsigned char* buf = temp(total_rows(send) * in_row);
        packs.emplace_back(buf, send);
        send_at[std::size_t(p)] = buf;
      }
    }
    if (!recv.empty()) {
      const auto begin = contiguous(recv);
      if (begin && out.size() == 1 && x.how == Combine::kCopy) {
        recv_at[std::size_t(p)] = row_ptr(out[0], *begin);
        recv_in_place[std::size_t(p)] = true;
      } else if (p != rank_) {
        recv_at[std::size_t(p)] = temp(total_rows(recv) * out_row);
      }
    }
  }
  recv_at[self] = recv_in_place[self] ? recv_at[self] : const_cast<unsigned char*>(send_at[self]);

  // Segments: a column's slice of message rows (pitch = message row) against buffer rows.
  auto column_segments = [](std::vector<Segment>& segs, std::span<const Rows> cols,
                            unsigned char* msg, std::span<const RowRange> ranges, bool to_msg) {
    const std::int64_t row = message_row_bytes(cols);
    std::int64_t pos = 0;
    for (const RowRange& r : ranges) {
      std::int64_t col_off = 0;
      for (const Rows& c : cols) {
        unsigned char* rows = static_cast<unsigned char*>(c.data) + r.begin * c.row_bytes();
        unsigned char* m = msg + pos * row + col_off;
        segs.push_back(to_msg ? Segment{rows, m, c.row_bytes(), row, c.row_bytes(), r.count, r.scale}
                              : Segment{m, rows, row, c.row_bytes(), c.row_bytes(), r.count, r.scale});
        col_off += c.row_bytes();
      }
      pos += r.count;
    }
  };
  Launches launches;
  std::vector<Launches::Launch> before, after;
  if (auto l = launches.add<Segment>(false, RowOp::kCopy, [&](std::vector<Segment>& s) {
        for (auto& [buf, ranges] : packs) column_segments(s, in, buf, ranges, true);
      }))
    before.push_back(*l);
  if (x.how == Combine::kCopy) {  // unpack every peer's rows at once: they are disjoint
    if (auto l = launches.add<Segment>(false, RowOp::kCopy, [&](std::vector<Segment>& s) {
          for (int p = 0; p < size_; ++p)
            if (!recv_in_place[std::size_t(p)] && recv_at[std::size_t(p)])
              column_segments(s, out, recv_at[std::size_t(p)], x.layout.recv[std::size_t(p)], false);
        }))
      after.push_back(*l);
  } else {  // combine peer by peer in ascending rank: layout.cc's order
    for (int p = 0; p < size_; ++p) {
      unsigned char* msg = recv_at[std::size_t(p)];
      const auto& ranges = x.layout.recv[std::size_t(p)];
      if (!msg) continue;
      std::optional<Launches::Launch> l;
      if (x.how == Combine::kLseMerge) {
        l = launches.add<LseSegment>(true, RowOp::kCopy, [&](std::vector<LseSegment>& s) {
          std::int64_t pos = 0;
          for (const RowRange& r : ranges) {
            s.push_back({msg + pos * out_row, row_ptr(out[0], r.begin), row_ptr(out[1], r.begin),
                         out_row, r.count});
            pos += r.count;
          }
        });
      } else {
        const RowOp rop = x.first_copies && p == 0 ? RowOp::kCopy
                          : x.how == Combine::kMax ? RowOp::kMax
                                                   : RowOp::kSum;
        l = launches.add<Segment>(false, rop, [&](std::vector<Segment>& s) {
          column_segments(s, out, msg, ranges, false);
        });
      }
      if (l) after.push_back(*l);
    }
  }

  // Everything is decided: queue it.
  unsigned char* table = nullptr;
  if (!launches.table().empty()) {
    const std::size_t bytes = launches.table().size();
    void* staging = pinned(bytes);
    std::memcpy(staging, launches.table().data(), bytes);
    table = temp(std::int64_t(bytes));
    cuda_ok(cudaMemcpyAsync(table, staging, bytes, cudaMemcpyHostToDevice, stream_),
            where(x.op) + ": uploading the segment table");
  }
  auto run = [&](const std::vector<Launches::Launch>& ls) {
    for (const auto& l : ls) {
      if (l.lse) {
        const std::int64_t heads = out[1].row_elems;
        launch_lse_merge(out[0].dtype, reinterpret_cast<const LseSegment*>(table + l.offset), l.n,
                         l.max, heads, out[0].row_elems / heads, stream_);
      } else {
        launch_rows(l.op, out[0].dtype, reinterpret_cast<const Segment*>(table + l.offset), l.n,
                    l.max, stream_);
      }
    }
  };
  if (x.zero_rows > 0)
    cuda_ok(cudaMemsetAsync(out[0].data, 0, std::size_t(x.zero_rows * out[0].row_bytes()), stream_),
            where(x.op) + ": zeroing the output");
  run(before);
  // Self traffic: a device copy where it lands in place, else combined from its send buffer.
  const std::int64_t self_bytes = total_rows(x.layout.recv[self]) * out_row;
  if (recv_in_place[self] && self_bytes > 0 && recv_at[self] != send_at[self])
    cuda_ok(cudaMemcpyAsync(recv_at[self], send_at[self], std::size_t(self_bytes),
                            cudaMemcpyDeviceToDevice, stream_),
            where(x.op) + ": the copy to itself");
  if (!peers.empty()) {
    const Api& nccl = api();
    std::lock_guard lock(api_mutex_);
    check_usable(x.op);  // the watchdog may have aborted meanwhile
    const auto deadline = start + timeout();
    nccl_ok(nccl.GroupStart(), op->what + ": ncclGroupStart", deadline);
    // A failed send or receive is reported after ncclGroupEnd: the thread's group must close
    // (torch's NCCL calls on this thread would otherwise land in it).
    ncclResult_t first = ncclSuccess;
    std::string failed;
    auto note = [&](ncclResult_t r, const char* what, std::int64_t bytes, int p) {
      if (r == ncclSuccess || first != ncclSuccess) return;
      first = r;
      failed = op->what + ": " + what + " of " + std::to_string(bytes) + " bytes with rank " +
               std::to_string(p);
    };
    for (int p : peers) {
      const std::int64_t rb = total_rows(x.layout.recv[std::size_t(p)]) * out_row;
      const std::int64_t sb = total_rows(x.layout.send[std::size_t(p)]) * in_row;
      if (rb > 0)
        note(nccl.Recv(recv_at[std::size_t(p)], std::size_t(rb), ncclUint8, p, comm_, stream_),
             "ncclRecv", rb, p);
      if (sb > 0)
        note(nccl.Send(send_at[std::size_t(p)], std::size_t(sb), ncclUint8, p, comm_, stream_),
             "ncclSend", sb, p);
    }
    const ncclResult_t end = nccl.GroupEnd();
    if (first != ncclSuccess) nccl_ok(first, failed, deadline);
    nccl_ok(end, op->what + ": ncclGroupEnd", deadline);
  }
  run(after);
  for (const auto& b : op->back)
    cuda_ok(cudaMemcpyAsync(const_cast<void*>(b.from), mirrors.at(b.to).device, b.bytes,
                            cudaMemcpyDeviceToHost, stream_),
            where(x.op) + ": downloading a host buffer");
  cuda_ok(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming), "cudaEventCreate");
  cuda_ok(cudaEventRecord(op->done, stream_), where(x.op) + ": cudaEventRecord");
  op->start = start;
  op->deadline = start + timeout();
  {
    std::lock_guard lock(watch_mutex_);
    in_flight_.push_back(op);
  }
  watch_cv_.notify_one();
  return std::make_unique<NcclWork>(*this, std::move(op), std::move(streams));
}

WorkPtr NcclCommunicator::group_cast(const Rows& input,
                                     std::span<const std::int64_t> input_split_sizes,
                                     std::span<const std::vector<std::int32_t>> dst_ranks,
                                     const Rows& output,
                                     std::span<const std::int64_t> output_split_sizes,
                                     std::span<const std::int32_t> src_rank) {
  check_usable("group_cast");
  Exchange x;
  x.op = "group_cast";
  x.in = {input};
  x.out = {output};
  x.layout = group_cast_layout("group_cast", rank_, size_, input, input_split_sizes, dst_ranks,
                               output, output_split_sizes, src_rank);
  return post(x);
}

WorkPtr NcclCommunicator::group_reduce(const Rows& input,
                                       std::span<const std::int64_t> input_split_sizes,
                                       std::span<const std::int32_t> dst_rank, const Rows& output,
                                       std::span<const std::int64_t> output_split_sizes,
                                       std::span<const std::vector<std::int32_t>> src_ranks,
                                       ReduceOp op) {
  check_usable("group_reduce");
  Exchange x;
  x.op = "group_reduce";
  x.in = {input};
  x.out = {output};
  x.how = Combine::kSum;  // kAvg: the layout's scales
  x.layout = group_reduce_layout(rank_, size_, input, input_split_sizes, dst_rank, output,
                                 output_split_sizes, src_ranks, op);
  return post(x);
}

WorkPtr NcclCommunicator::group_reduce_lse(const Rows& input_out, const Rows& input_lse,
                                           std::span<const std::int64_t> input_split_sizes,
                                           std::span<const std::int32_t> dst_rank,
                                           const Rows& output_out, const Rows& output_lse,
                                           std::span<const std::int64_t> output_split_sizes,
                                           std::span<const std::vector<std::int32_t>> src_ranks) {
  check_usable("group_reduce_lse");
  Exchange x;
  x.op = "group_reduce_lse";
  x.in = {input_out, input_lse};
  x.out = {output_out, output_lse};
  x.how = Combine::kLseMerge;
  x.layout = group_reduce_lse_layout(rank_, size_, std::span<const Rows, 2>(x.in.data(), 2),
                                     input_split_sizes, dst_rank,
                                     std::span<const Rows, 2>(x.out.data(), 2),
                                     output_split_sizes, src_ranks);
  return post(x);
}

WorkPtr NcclCommunicator::all_gather_v(const Rows& input, const Rows& output,
                                       std::span<const std::int64_t> counts) {
  check_usable("all_gather_v");
  Exchange x;
  x.op = "all_gather_v";
  x.in = {input};
  x.out = {output};
  x.layout = all_gather_v_layout(rank_, size_, input, output, counts);
  return post(x);
}

WorkPtr NcclCommunicator::reduce_scatter(const Rows& input, const Rows& output,
                                         std::span<const std::int64_t> counts) {
  check_usable("reduce_scatter");
  Exchange x;
  x.op = "reduce_scatter";
  x.in = {input};
  x.out = {output};
  x.how = Combine::kSum;
  x.layout = reduce_scatter_layout(rank_, size_, input, output, counts);
  x.zero_rows = counts[std::size_t(rank_)];  // as comm/mpi: 0 + c0 + c1 ... (-0.0 differs)
  return post(x);
}

WorkPtr NcclCommunicator::all_reduce(const Rows& data, ReduceOp op) {
  check_usable("all_reduce");
  check_all_reduce(data, op);
  // As comm/mpi: every rank receives every contribution and folds them in rank order (rank 0's
  // copied, the others combined), so all ranks hold the same bits; bytes move P times.
  Exchange x;
  x.op = "all_reduce";
  x.in = {data};
  x.out = {data};
  x.how = op == ReduceOp::kSum ? Combine::kSum : Combine::kMax;
  x.first_copies = true;
  const std::vector<RowRange> whole{{0, data.num_rows}};
  x.layout.send.assign(std::size_t(size_), data.num_rows > 0 ? whole : std::vector<RowRange>{});
  x.layout.recv = x.layout.send;
  return post(x);
}

void NcclCommunicator::barrier() {
  float token = 0;  // a host all_reduce: its wait() blocks until every rank has joined
  all_reduce(Rows{&token, 1, 1, DType::kF32}, ReduceOp::kSum)->wait();
}

// include/magi/nccl.h

bool available(std::string* why) { return try_api(why) != nullptr; }

std::string library_version() {
  const Api& nccl = api();
  int v = 0;
  const ncclResult_t r = nccl.GetVersion(&v);
  MAGI_CHECK(r == ncclSuccess, "ncclGetVersion (", nccl.path, "): ", nccl.GetErrorString(r));
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9 (X * 1000 + Y * 100 + Z before).
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

UniqueId make_unique_id() {
  const Api& nccl = api();
  ncclUniqueId id;
  const ncclResult_t r = nccl.GetUniqueId(&id);
  MAGI_CHECK(r == ncclSuccess, "ncclGetUniqueId (", nccl.path, "): ", describe(nccl, r, nullptr));
  UniqueId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

std::unique_ptr<Communicator> make_communicator(const UniqueId& id, int rank, int size, int device,
                                                long long timeout_ms) {
  MAGI_CHECK(size >= 1, "nccl::make_communicator: world size ", size, " (at least 1)");
  MAGI_CHECK(rank >= 0 && rank < size, "nccl::make_communicator: rank ", rank, " outside [0, ",
             size, ")");
  MAGI_CHECK(timeout_ms > 0, "nccl::make_communicator: timeout ", timeout_ms, " ms (positive)");
  api();  // names the library when NCCL is missing
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  MAGI_CHECK(e == cudaSuccess, "nccl::make_communicator: no CUDA device: ", cudaGetErrorString(e));
  MAGI_CHECK(device >= 0 && device < count, "nccl::make_communicator: device ", device,
             " outside [0, ", count, ") on rank ", rank);
  return std::make_unique<NcclCommunicator>(id, rank, size, device,
                                            std::chrono::milliseconds(timeout_ms));
}

}  // namespace magi::comm::nccl
