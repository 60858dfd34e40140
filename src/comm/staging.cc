// comm.h with_device_staging: device Rows over a host-only communicator through host mirrors.
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "magi/comm.h"
#include "magi/device_memory.h"
#include "magi/error.h"
#include "staging.h"

namespace magi::comm {
namespace {

// The host mirror of one Rows argument; `to` points the inner communicator at it.
struct Mirror {
  std::vector<unsigned char> bytes;
  Rows host;
};

class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, std::vector<std::shared_ptr<Mirror>> keep,
             std::vector<std::function<void()>> after)
      : inner_(std::move(inner)), keep_(std::move(keep)), after_(std::move(after)) {}
  void wait() override {
    if (inner_) inner_->wait();
    inner_.reset();
    for (auto& f : after_) f();
    after_.clear();
    keep_.clear();
  }

 private:
  WorkPtr inner_;
  std::vector<std::shared_ptr<Mirror>> keep_;  // alive until the inner operation is done
  std::vector<std::function<void()>> after_;   // copies back, in order
};

class Staging final : public Communicator {
 public:
  Staging(Communicator& inner, detail::DeviceCopies copies) : in_(inner), copy_(copies) {
    set_timeout(inner.timeout());
  }
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  bool device_rows() const override { return true; }

  WorkPtr group_cast(const Rows& input, std::span<const std::int64_t> input_split_sizes,
                     std::span<const std::vector<std::int32_t>> dst_ranks, const Rows& output,
                     std::span<const std::int64_t> output_split_sizes,
                     std::span<const std::int32_t> src_rank) override {
    Op op(*this);
    const Rows in = op.read(input), out = op.keep(output);
    op.work = in_.group_cast(in, input_split_sizes, dst_ranks, out, output_split_sizes, src_rank);
    return op.done();
  }

  WorkPtr group_reduce(const Rows& input, std::span<const std::int64_t> input_split_sizes,
                       std::span<const std::int32_t> dst_rank, const Rows& output,
                       std::span<const std::int64_t> output_split_sizes,
                       std::span<const std::vector<std::int32_t>> src_ranks,
                       ReduceOp red) override {
    Op op(*this);
    const Rows in = op.read(input), out = op.accumulate(output);
    op.work = in_.group_reduce(in, input_split_sizes, dst_rank, out, output_split_sizes,
                               src_ranks, red);
    return op.done();
  }

  WorkPtr group_reduce_lse(const Rows& input_out, const Rows& input_lse,
                           std::span<const std::int64_t> input_split_sizes,
                           std::span<const std::int32_t> dst_rank, const Rows& output_out,
                           const Rows& output_lse,
                           std::span<const std::int64_t> output_split_sizes,
                           std::span<const std::vector<std::int32_t>> src_ranks) override {
    // A merge is not a sum: it runs on snapshots of the outputs (one such reduction in flight
    // per output at a time).
    Op op(*this);
    const Rows io = op.read(input_out), il = op.read(input_lse);
    const Rows oo = op.keep(output_out), ol = op.keep(output_lse);
    op.work = in_.group_reduce_lse(io, il, input_split_sizes, dst_rank, oo, ol,
                                   output_split_sizes, src_ranks);
    return op.done();
  }

  WorkPtr all_gather_v(const Rows& input, const Rows& output,
                       std::span<const std::int64_t> counts) override {
    Op op(*this);
    const Rows in = op.read(input), out = op.keep(output);
    op.work = in_.all_gather_v(in, out, counts);
    return op.done();
  }

  WorkPtr reduce_scatter(const Rows& input, const Rows& output,
                         std::span<const std::int64_t> counts) override {
    Op op(*this);
    const Rows in = op.read(input), out = op.keep(output);
    op.work = in_.reduce_scatter(in, out, counts);
    return op.done();
  }

  WorkPtr all_reduce(const Rows& data, ReduceOp red) override {
    Op op(*this);
    const Rows d = op.keep(data);
    op.work = in_.all_reduce(d, red);
    return op.done();
  }

  void barrier() override { in_.barrier(); }

 private:
  // One operation's mirrors and copies back.
  struct Op {
    explicit Op(const Staging& s) : copy(s.copy_) {}
    const detail::DeviceCopies& copy;
    std::vector<std::shared_ptr<Mirror>> mirrors;
    std::vector<std::function<void()>> after;
    WorkPtr work;

    std::shared_ptr<Mirror> mirror(const Rows& r) {
      auto m = std::make_shared<Mirror>();
      m->bytes.resize(std::size_t(r.num_bytes()));
      m->host = r;
      m->host.data = m->bytes.data();
      m->host.device = -1;
      m->host.stream = 0;
      mirrors.push_back(m);
      return m;
    }
    // An input: its device rows copied to the host now.
    Rows read(const Rows& r) {
      if (!r.on_device()) return r;
      auto m = mirror(r);
      in(*m, r);
      return m->host;
    }
    // The copies, none for no bytes (an empty vector's data() may be null).
    void in(Mirror& m, const Rows& r) const {
      if (!m.bytes.empty()) copy.to_host(m.bytes.data(), r.data, m.bytes.size(), r.device, r.stream);
    }
    static void out(const detail::DeviceCopies& c, const Mirror& m, const Rows& r) {
      if (!m.bytes.empty()) c.to_device(r.data, m.bytes.data(), m.bytes.size(), r.device, r.stream);
    }
    // An output the operation writes part of (or updates in place): a snapshot now, all of it
    // copied back at wait().
    Rows keep_rows(const Rows& r) {
      auto m = mirror(r);
      in(*m, r);
      after.push_back([m, r, c = &copy] { out(*c, *m, r); });
      return m->host;
    }
    Rows keep(const Rows& r) { return r.on_device() ? keep_rows(r) : r; }
    // An output reduced into (sum, avg): contributions into a zeroed mirror, added to the
    // device rows as they are at wait().
    Rows accumulate(const Rows& r) {
      if (!r.on_device()) return r;
      MAGI_CHECK(r.dtype == DType::kF32 || r.dtype == DType::kF64,
                 "group_reduce: device output dtype ", dtype_name(r.dtype), " (fp32 or fp64)");
      auto m = mirror(r);  // zeros: 0.0 is all-zero bits
      if (m->bytes.empty()) return m->host;
      after.push_back([m, r, c = &copy] {
        std::vector<unsigned char> now(m->bytes.size());
        c->to_host(now.data(), r.data, now.size(), r.device, r.stream);
        const std::int64_t n = r.num_rows * r.row_elems;
        if (r.dtype == DType::kF64)
          add(reinterpret_cast<double*>(now.data()), reinterpret_cast<const double*>(m->bytes.data()), n);
        else
          add(reinterpret_cast<float*>(now.data()), reinterpret_cast<const float*>(m->bytes.data()), n);
        c->to_device(r.data, now.data(), now.size(), r.device, r.stream);
      });
      return m->host;
    }
    template <class T>
    static void add(T* acc, const T* x, std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) acc[i] += x[i];
    }
    WorkPtr done() {
      return std::make_unique<StagedWork>(std::move(work), std::move(mirrors), std::move(after));
    }
  };

  Communicator& in_;
  detail::DeviceCopies copy_;
};

}  // namespace

namespace detail {

DeviceCopies cuda_copies() { return {&device::to_host, &device::to_device}; }

std::unique_ptr<Communicator> with_device_staging(Communicator& inner, DeviceCopies copies) {
  return std::make_unique<Staging>(inner, copies);
}

}  // namespace detail

std::unique_ptr<Communicator> with_device_staging(Communicator& inner) {
  return detail::with_device_staging(inner, detail::cuda_copies());
}

}  // namespace magi::comm
