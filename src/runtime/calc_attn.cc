// calc_attn forward/backward: the stage loop of one rank, on host tensors or on one CUDA device's
// (kernels on opts.cuda_stream, scratch rows beside the tensors, a host-only communicator
// behind host staging). The K/V casts of stage s+1 are in
// flight while stage s computes, so only the first fetch (overlapped with the host stage) and
// compute-starved stages show communication. The backward also returns partial dK/dV of the
// fetched rows to their owners, waiting for stage s-1's reduce only after stage s computed.
//
//   comm   | cast K,V[0] | cast K,V[1] | cast K,V[2] |             |
//   compute|    host     |   stage 0   |   stage 1   |   stage 2   |
//   (bwd)  |             |             | reduce dKV0 | reduce dKV1 | reduce dKV2
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "magi/device_memory.h"
#include "magi/runtime.h"
#include "views.h"

namespace magi::runtime {

namespace {

// A contiguous view of `data` shaped like t with `rows` rows (and `dtype`).
TensorView shaped_like(const TensorView& t, std::int64_t rows, void* data, DType dtype) {
  TensorView v = t;
  v.data = data;
  v.dtype = dtype;
  v.shape[0] = rows;
  std::int64_t s = 1;
  for (int d = v.ndim - 1; d >= 0; --d) v.stride[d] = s, s *= v.shape[d];
  return v;
}

// One stage's K/V receive buffers (beside k and v: host or device) and the casts filling them.
struct Fetch {
  detail::Scratch k_bytes, v_bytes;
  TensorView k, v;
  comm::WorkPtr k_work, v_work;

  void wait() {
    if (k_work) k_work->wait();
    if (v_work) v_work->wait();
    k_work.reset();
    v_work.reset();
  }
};

std::int64_t num_rows(const std::vector<Range>& ranges) {
  std::int64_t n = 0;
  for (const Range r : ranges) n += r.size();
  return n;
}

DType compute_type(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

// The parts of calc_attn's workspace (runtime.h calc_attn_workspace_bytes), each 256-byte
// aligned: the kernel's workspace, then two slots (stage s uses slot s % 2) of K and V receive
// rows, then (backward) two slots of partial dK and dV. Stage s's slot is reused by stage s + 2,
// whose fetch is posted after stage s's kernels were queued on the stream, and whose partials
// are zeroed after stage s's reduces were waited for.
class Layout {
 public:
  enum Part { kK, kV, kDk, kDv };
  Layout() = default;  // no parts
  Layout(const plan::RankPlan& rp, std::int64_t nl, std::int64_t hq, std::int64_t hkv,
         std::int64_t d, DType dtype, bool backward) {
    std::int64_t rows = 0;
    for (const plan::Stage& st : rp.stages) rows = std::max(rows, num_rows(st.remote_k_ranges));
    kernel_ = align(backward ? attn_backward_workspace_bytes(nl, hq, d)
                             : attn_forward_workspace_bytes(std::max(nl, rows), hkv));
    kv_ = align(std::size_t(rows * hkv * d * dtype_size(dtype)));
    part_ = backward ? align(std::size_t(rows * hkv * d * dtype_size(compute_type(dtype)))) : 0;
  }
  std::size_t kernel_bytes() const { return kernel_; }
  std::size_t bytes() const { return kernel_ + 4 * kv_ + 4 * part_; }
  std::size_t offset(Part p, std::size_t stage) const {
    const std::size_t slot = stage % 2;
    if (p == kK || p == kV) return kernel_ + (2 * slot + (p == kV)) * kv_;
    return kernel_ + 4 * kv_ + (2 * slot + (p == kDv)) * part_;
  }

 private:
  static std::size_t align(std::size_t b) { return (b + 255) / 256 * 256; }
  std::size_t kernel_ = 0, kv_ = 0, part_ = 0;
};

// Where a call's device scratch lives: in the caller's workspace, carved by the Layout, or
// (host tensors, or no workspace given) allocated per use beside `like`.
class Arena {
 public:
  Arena() = default;  // no workspace: every part allocated per use
  Arena(const plan::RankPlan& rp, std::int64_t nl, const TensorView& q, const TensorView& k,
        bool backward, const std::optional<Workspace>& ws)
      : layout_(rp, nl, q.ndim == 3 ? q.shape[1] : 0, k.ndim == 3 ? k.shape[1] : 0,
                k.ndim == 3 ? k.shape[2] : 0, q.dtype, backward) {
    if (!ws || q.device != Device::kCUDA) return;
    MAGI_CHECK(ws->bytes >= layout_.bytes(), "workspace: ", ws->bytes, " bytes, but ",
               layout_.bytes(), " are needed (calc_attn_workspace_bytes(..., backward=",
               backward ? "true" : "false", "))");
    MAGI_CHECK(ws->data != nullptr && reinterpret_cast<std::uintptr_t>(ws->data) % 256 == 0,
               "workspace: the data pointer must be non-null and 256-byte aligned");
    base_ = static_cast<unsigned char*>(ws->data);
  }
  // The kernels' workspace: the first part of the caller's, else none (they allocate).
  std::optional<Workspace> kernel() const {
    if (base_ == nullptr) return std::nullopt;
    return Workspace{base_, layout_.kernel_bytes()};
  }
  // `bytes` for stage s's `part`, in its slot or else in `own` (optionally zeroed on `stream`).
  void* rows(Layout::Part part, std::size_t s, std::size_t bytes, const TensorView& like,
             std::uintptr_t stream, bool zeroed, detail::Scratch& own) const {
    if (base_ == nullptr) {
      own = detail::Scratch(bytes, like, stream, zeroed);
      return own.data();
    }
    void* p = base_ + layout_.offset(part, s);
    if (zeroed && bytes > 0) device::zero(p, bytes, like.device_idx, stream);
    return p;
  }

 private:
  Layout layout_;
  unsigned char* base_ = nullptr;
};

Fetch post_fetch(comm::Communicator& comm, const plan::Stage& st, std::size_t s,
                 const Arena& arena, const TensorView& k, const TensorView& v,
                 std::uintptr_t stream) {
  const std::int64_t nr = num_rows(st.remote_k_ranges);
  const comm::Rows k_rows = detail::rows_of(k, "k", stream), v_rows = detail::rows_of(v, "v", stream);
  Fetch f;
  f.k = shaped_like(k, nr,
                    arena.rows(Layout::kK, s, std::size_t(nr * k_rows.row_bytes()), k, stream,
                               false, f.k_bytes),
                    k.dtype);
  f.v = shaped_like(v, nr,
                    arena.rows(Layout::kV, s, std::size_t(nr * v_rows.row_bytes()), v, stream,
                               false, f.v_bytes),
                    v.dtype);
  f.k_work = comm.group_cast(k_rows, detail::rows_of(f.k, "k receive buffer", stream), st.cast);
  f.v_work = comm.group_cast(v_rows, detail::rows_of(f.v, "v receive buffer", stream), st.cast);
  return f;
}

const plan::RankPlan& rank_plan(const plan::DistPlan& plan, const comm::Communicator& comm) {
  const int cp = int(plan.ranks.size());
  MAGI_CHECK(comm.size() == cp, "communicator size ", comm.size(), " differs from plan cp ", cp);
  return plan.ranks[std::size_t(comm.rank())];
}


// Every check that could fail on one rank only runs before the first collective, so a bad
// argument throws on that rank instead of leaving its peers waiting for a timeout.
void check_local(const plan::DistPlan& plan, const comm::Communicator& comm, const TensorView& q,
                 const TensorView& k, const TensorView& v, const AttnOptions& opts) {
  MAGI_CHECK(!opts.accumulate, "accumulate: not supported by calc_attn (the runtime merges "
                               "stages itself; outputs are overwritten)");
  const std::int64_t nl = plan.dispatch.rank_tokens(comm.rank());
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    detail::rows_of(*t, name);
    MAGI_CHECK(t->shape[0] == nl, name, ": ", t->shape[0], " rows, but rank ", comm.rank(),
               " holds ", nl, " tokens");
  }
}

void check_compute(const TensorView& t, const char* name, DType compute) {
  detail::rows_of(t, name);
  MAGI_CHECK(t.dtype == compute, name, ": dtype ", dtype_name(t.dtype),
             " must be the compute type ", dtype_name(compute), " (stages merge into it)");
}

// t (fp32 / fp64, small: max_logits, dsink) filled with x, on the host or through a host copy.
void fill(const TensorView& t, double x, std::uintptr_t stream) {
  const detail::HostCopy h(t, stream, false);
  const std::int64_t n = t.numel();
  if (t.dtype == DType::kF64)
    for (std::int64_t i = 0; i < n; ++i) h.view.ptr<double>()[i] = x;
  else
    for (std::int64_t i = 0; i < n; ++i) h.view.ptr<float>()[i] = float(x);
  h.commit();
}

// Adds the seconds `fn` takes to *into (comm_only_seconds: host clocks around blocking work).
template <class Fn>
void timed(double* into, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  *into += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Where one calc_attn call's time went (CalcStats), when asked. Host tensors: clocks around the
// kernel calls and the waits. Device tensors: the kernels run asynchronously and a wait() only
// queues the compute stream's dependency on the communication, so CUDA events on the compute
// stream around each kernel call, read once at the end: a call's compute time is the stream's
// time inside its kernels, its wait the stream's time since the previous call's kernels ended
// (the communication they did not hide; after the last kernels, the remaining reductions).
class Timeline {
 public:
  Timeline(CalcStats* stats, const TensorView& q, std::uintptr_t stream)
      : stats_(stats), device_(q.device == Device::kCUDA ? q.device_idx : -1), stream_(stream) {
    if (stats_ == nullptr) return;
    *stats_ = CalcStats{};
    if (device_ >= 0) events_.emplace_back(device_), events_.back().record(stream_);
  }

  template <class Fn>
  void compute(Fn&& fn) {
    if (stats_ == nullptr) return fn();
    if (device_ >= 0) {
      events_.emplace_back(device_), events_.back().record(stream_);
      fn();
      events_.emplace_back(device_), events_.back().record(stream_);
      return;
    }
    double t = 0;
    timed(&t, fn);
    stats_->stage_compute_s.push_back(t);
    stats_->stage_wait_s.push_back(pending_wait_);
    stats_->compute_s += t;
    pending_wait_ = 0;
  }

  template <class Fn>
  void wait(Fn&& fn) {
    if (stats_ == nullptr || device_ >= 0) return fn();
    timed(&pending_wait_, fn);  // counted into wait_s at finish, with the trailing waits
  }

  // After the call's last wait: the device timeline read back (one synchronisation, only
  // when stats were asked for).
  void finish() {
    if (stats_ == nullptr) return;
    if (device_ < 0) {
      stats_->wait_s = pending_wait_;
      for (double w : stats_->stage_wait_s) stats_->wait_s += w;
      return;
    }
    events_.emplace_back(device_), events_.back().record(stream_);
    const std::size_t n = events_.size();
    for (std::size_t i = 1; i + 1 < n; i += 2) {
      stats_->stage_wait_s.push_back(device::Event::seconds_between(events_[i - 1], events_[i]));
      stats_->stage_compute_s.push_back(
          device::Event::seconds_between(events_[i], events_[i + 1]));
      stats_->compute_s += stats_->stage_compute_s.back();
      stats_->wait_s += stats_->stage_wait_s.back();
    }
    stats_->wait_s += device::Event::seconds_between(events_[n - 2], events_[n - 1]);
  }

 private:
  CalcStats* stats_;
  int device_;
  std::uintptr_t stream_;
  std::vector<device::Event> events_;  // start, then before / after of each kernel call, end
  double pending_wait_ = 0;            // host: waits since the last kernel call
};

// The caller's PreparedRank, checked against the plan, or one built for this call.
const PreparedRank& prepared_for(const plan::DistPlan& plan, const comm::Communicator& comm,
                                 const PreparedRank* given, std::optional<PreparedRank>& own) {
  if (given != nullptr) {
    given->check_matches(plan, comm.rank());
    return *given;
  }
  return own.emplace(plan, comm.rank());
}

}  // namespace

PreparedRank::PreparedRank(const plan::DistPlan& plan, int rank) : rank_(rank) {
  MAGI_CHECK(rank >= 0 && rank < int(plan.ranks.size()), "PreparedRank: rank ", rank,
             " is not in a plan for cp ", plan.ranks.size());
  const plan::RankPlan& rp = plan.ranks[std::size_t(rank)];
  const std::int64_t nl = plan.dispatch.rank_tokens(rank);
  host_ = std::make_unique<PreparedMask>(Mask(nl, nl, rp.host_slices));
  for (const plan::Stage& st : rp.stages)
    stages_.push_back(
        std::make_unique<PreparedMask>(Mask(nl, num_rows(st.remote_k_ranges), st.slices)));
}

void PreparedRank::check_matches(const plan::DistPlan& plan, int rank) const {
  MAGI_CHECK(rank == rank_, "prepared: made for rank ", rank_, ", used on rank ", rank);
  MAGI_CHECK(rank >= 0 && rank < int(plan.ranks.size()), "prepared: rank ", rank,
             " is not in a plan for cp ", plan.ranks.size());
  const plan::RankPlan& rp = plan.ranks[std::size_t(rank)];
  bool same = rp.stages.size() == stages_.size() && rp.host_slices == host_->mask().slices() &&
              host_->mask().total_seqlen_q() == plan.dispatch.rank_tokens(rank);
  for (std::size_t s = 0; same && s < stages_.size(); ++s)
    same = rp.stages[s].slices == stages_[s]->mask().slices() &&
           num_rows(rp.stages[s].remote_k_ranges) == stages_[s]->mask().total_seqlen_k();
  MAGI_CHECK(same, "prepared: its masks are not this plan's (prepared from another plan)");
}

std::size_t calc_attn_workspace_bytes(const plan::DistPlan& plan, int rank, std::int64_t heads_q,
                                      std::int64_t heads_kv, std::int64_t head_dim, DType dtype,
                                      bool backward) {
  MAGI_CHECK(rank >= 0 && rank < int(plan.ranks.size()), "calc_attn_workspace_bytes: rank ", rank,
             " is not in a plan for cp ", plan.ranks.size());
  MAGI_CHECK(heads_q > 0 && heads_kv > 0 && head_dim > 0, "calc_attn_workspace_bytes: heads_q ",
             heads_q, ", heads_kv ", heads_kv, " and head_dim ", head_dim, " must be positive");
  return Layout(plan.ranks[std::size_t(rank)], plan.dispatch.rank_tokens(rank), heads_q, heads_kv,
                head_dim, dtype, backward)
      .bytes();
}

void calc_attn_forward(const plan::DistPlan& plan, comm::Communicator& comm_in, const FwdArgs& a,
                       const AttnOptions& opts, CalcStats* stats, const PreparedRank* given) {
  std::unique_ptr<comm::Communicator> staged;
  comm::Communicator& comm = detail::for_rows(
      comm_in, detail::any_on_device({&a.q, &a.k, &a.v, &a.out, &a.lse}), staged);
  const std::uintptr_t stream = opts.cuda_stream;
  const plan::RankPlan& rp = rank_plan(plan, comm);
  check_local(plan, comm, a.q, a.k, a.v, opts);
  const DType compute = compute_type(a.q.dtype);
  check_compute(a.out, "out", compute);
  check_compute(a.lse, "lse", compute);
  if (a.max_logits) check_compute(*a.max_logits, "max_logits", compute);
  const std::int64_t nl = a.q.shape[0];
  const Arena arena(rp, nl, a.q, a.k, false, a.workspace);
  FwdArgs own = a;  // the kernels' workspace is the first part of the call's
  own.workspace = arena.kernel();
  // The kernel's own checks (dtype, head dim, sink) before the first collective.
  validate_forward(Mask(nl, nl, {}), own, opts);
  std::optional<PreparedRank> own_prepared;
  const PreparedRank& pr = prepared_for(plan, comm, given, own_prepared);

  Timeline tl(stats, a.q, stream);
  Fetch next;
  if (!rp.stages.empty()) next = post_fetch(comm, rp.stages[0], 0, arena, a.k, a.v, stream);
  if (nl > 0) {
    tl.compute([&] { attn_forward(pr.host(), own, opts); });
  } else if (a.max_logits) {
    fill(*a.max_logits, -std::numeric_limits<double>::infinity(), stream);
  }
  AttnOptions acc = opts;
  acc.accumulate = true;
  for (std::size_t s = 0; s < rp.stages.size(); ++s) {
    Fetch cur = std::move(next);
    tl.wait([&] { cur.wait(); });
    if (s + 1 < rp.stages.size())
      next = post_fetch(comm, rp.stages[s + 1], s + 1, arena, a.k, a.v, stream);
    const plan::Stage& st = rp.stages[s];
    if (st.slices.empty()) continue;
    FwdArgs sa = own;
    sa.k = cur.k;
    sa.v = cur.v;
    sa.sink.reset();  // the sink joins each row's normaliser once, at the host stage
    tl.compute([&] { attn_forward(pr.stage(s), sa, acc); });
  }
  if (a.max_logits) {
    comm::WorkPtr w = comm.all_reduce(detail::rows_of(*a.max_logits, "max_logits", stream),
                                      comm::ReduceOp::kMax);
    tl.wait([&] { w->wait(); });
  }
  tl.finish();
}

void calc_attn_backward(const plan::DistPlan& plan, comm::Communicator& comm_in, const BwdArgs& a,
                        const AttnOptions& opts, CalcStats* stats, const PreparedRank* given) {
  std::unique_ptr<comm::Communicator> staged;
  comm::Communicator& comm = detail::for_rows(
      comm_in, detail::any_on_device({&a.q, &a.k, &a.v, &a.dq, &a.dk, &a.dv}), staged);
  const std::uintptr_t stream = opts.cuda_stream;
  const plan::RankPlan& rp = rank_plan(plan, comm);
  check_local(plan, comm, a.q, a.k, a.v, opts);
  const DType compute = compute_type(a.q.dtype);
  check_compute(a.dq, "dq", compute);
  check_compute(a.dk, "dk", compute);
  check_compute(a.dv, "dv", compute);
  if (a.dsink) MAGI_CHECK(a.dsink->is_contiguous(), "dsink: must be contiguous, got ",
                          a.dsink->describe());
  const std::int64_t nl = a.q.shape[0];
  const comm::Rows dk_rows = detail::rows_of(a.dk, "dk", stream);
  const comm::Rows dv_rows = detail::rows_of(a.dv, "dv", stream);
  const Arena arena(rp, nl, a.q, a.k, true, a.workspace);
  BwdArgs own = a;  // the kernels' workspace is the first part of the call's
  own.workspace = arena.kernel();
  validate_backward(Mask(nl, nl, {}), own, opts);  // before the first collective, as forward
  std::optional<PreparedRank> own_prepared;
  const PreparedRank& pr = prepared_for(plan, comm, given, own_prepared);

  Timeline tl(stats, a.q, stream);
  Fetch next;
  if (!rp.stages.empty()) next = post_fetch(comm, rp.stages[0], 0, arena, a.k, a.v, stream);
  if (nl > 0) {
    tl.compute([&] { attn_backward(pr.host(), own, opts); });
  } else if (a.dsink) {
    fill(*a.dsink, 0.0, stream);
  }
  AttnOptions acc = opts;
  acc.accumulate = true;
  // Partial dK/dV of the previous stage stay alive until its reduce is waited on.
  detail::Scratch prev_dk, prev_dv;
  comm::WorkPtr prev_dk_work, prev_dv_work;
  for (std::size_t s = 0; s < rp.stages.size(); ++s) {
    Fetch cur = std::move(next);
    tl.wait([&] { cur.wait(); });
    if (s + 1 < rp.stages.size())
      next = post_fetch(comm, rp.stages[s + 1], s + 1, arena, a.k, a.v, stream);
    const plan::Stage& st = rp.stages[s];
    const std::int64_t nr = cur.k.shape[0];
    const std::size_t part_bytes = std::size_t(nr * detail::row_elems(a.dk) * dtype_size(compute));
    detail::Scratch dk_part, dv_part;
    const TensorView pdk = shaped_like(
        a.dk, nr, arena.rows(Layout::kDk, s, part_bytes, a.dk, stream, true, dk_part), compute);
    const TensorView pdv = shaped_like(
        a.dv, nr, arena.rows(Layout::kDv, s, part_bytes, a.dv, stream, true, dv_part), compute);
    if (!st.slices.empty()) {
      BwdArgs sa = own;
      sa.k = cur.k;
      sa.v = cur.v;
      sa.dk = pdk;
      sa.dv = pdv;
      sa.sink.reset();  // dsink is a host-stage term only (as the sink is in the forward)
      sa.dsink.reset();
      tl.compute([&] { attn_backward(pr.stage(s), sa, acc); });
    }
    const plan::GroupReduceArgs ra = plan::reduce_args(st.cast);
    comm::WorkPtr dk_work = comm.group_reduce(detail::rows_of(pdk, "dk partial", stream), dk_rows,
                                              ra, comm::ReduceOp::kSum);
    comm::WorkPtr dv_work = comm.group_reduce(detail::rows_of(pdv, "dv partial", stream), dv_rows,
                                              ra, comm::ReduceOp::kSum);
    tl.wait([&] {
      if (prev_dk_work) prev_dk_work->wait();
      if (prev_dv_work) prev_dv_work->wait();
    });
    prev_dk = std::move(dk_part);
    prev_dv = std::move(dv_part);
    prev_dk_work = std::move(dk_work);
    prev_dv_work = std::move(dv_work);
  }
  tl.wait([&] {
    if (prev_dk_work) prev_dk_work->wait();
    if (prev_dv_work) prev_dv_work->wait();
  });
  tl.finish();
}

double comm_only_seconds(const plan::DistPlan& plan, comm::Communicator& comm_in,
                         const TensorView& k, const TensorView& v, bool backward) {
  std::unique_ptr<comm::Communicator> staged;
  comm::Communicator& comm = detail::for_rows(comm_in, detail::any_on_device({&k, &v}), staged);
  const plan::RankPlan& rp = rank_plan(plan, comm);
  const std::int64_t nl = plan.dispatch.rank_tokens(comm.rank());
  MAGI_CHECK(k.shape[0] == nl && v.shape[0] == nl, "comm_only_seconds: k/v have ", k.shape[0],
             "/", v.shape[0], " rows, but rank ", comm.rank(), " holds ", nl, " tokens");
  const DType compute = compute_type(k.dtype);
  const std::int64_t row = detail::row_elems(k);
  detail::Scratch owner(std::size_t(nl * row * dtype_size(compute)), k, 0, true);
  const Arena no_workspace;
  const comm::Rows owner_rows =
      detail::rows_of(shaped_like(k, nl, owner.data(), compute), "dk owner rows");
  double seconds = 0;
  for (const plan::Stage& st : rp.stages) {
    timed(&seconds, [&] {
      Fetch f = post_fetch(comm, st, 0, no_workspace, k, v, 0);
      f.wait();
      if (!backward) return;
      detail::Scratch part(std::size_t(f.k.shape[0] * row * dtype_size(compute)), k, 0, true);
      const comm::Rows part_rows =
          detail::rows_of(shaped_like(k, f.k.shape[0], part.data(), compute), "dk partial");
      const plan::GroupReduceArgs ra = plan::reduce_args(st.cast);
      comm::WorkPtr dk = comm.group_reduce(part_rows, owner_rows, ra, comm::ReduceOp::kSum);
      comm::WorkPtr dv = comm.group_reduce(part_rows, owner_rows, ra, comm::ReduceOp::kSum);
      dk->wait();
      dv->wait();
    });
  }
  return seconds;
}

}  // namespace magi::runtime
