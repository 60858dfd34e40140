// dispatch / undispatch (docs/semantics.md §3 flow): global rows <-> a rank's local rows. dispatch
// is a local gather (every rank holds the global input); undispatch is one all_gather_v in the
// rank-major dispatched order followed by the plan's permutation, so it costs one collective.
#include <cstring>
#include <vector>

#include "magi/runtime.h"
#include "views.h"

namespace magi::runtime {

namespace {

void check_pair(const plan::DistPlan& plan, int rank, const comm::Rows& global,
                const comm::Rows& local) {
  MAGI_CHECK(rank >= 0 && rank < int(plan.ranks.size()), "communicator rank ", rank,
             " has no entry in a plan for cp ", plan.ranks.size());
  MAGI_CHECK(global.num_rows == plan.dispatch.total_seqlen, "global: ", global.num_rows,
             " rows, but the plan is for ", plan.dispatch.total_seqlen, " tokens");
  MAGI_CHECK(local.num_rows == plan.dispatch.rank_tokens(rank), "local: ", local.num_rows,
             " rows, but rank ", rank, " holds ", plan.dispatch.rank_tokens(rank), " tokens");
  MAGI_CHECK(global.dtype == local.dtype && global.row_elems == local.row_elems,
             "local and global rows differ: ", local.row_elems, " x ", dtype_name(local.dtype),
             " vs ", global.row_elems, " x ", dtype_name(global.dtype));
}

}  // namespace

void dispatch(const plan::DistPlan& plan, const comm::Communicator& comm, const TensorView& global,
              const TensorView& local, std::uintptr_t stream) {
  if (detail::any_on_device({&global, &local})) {
    const detail::HostCopy g(global, stream, true), l(local, stream, false);
    dispatch(plan, comm, g.view, l.view);
    return l.commit();
  }
  const comm::Rows g = detail::rows_of(global, "global"), l = detail::rows_of(local, "local");
  const int rank = comm.rank();
  check_pair(plan, rank, g, l);
  const std::int64_t row = g.row_bytes();
  auto* dst = static_cast<unsigned char*>(l.data);
  for (const Range r : plan.ranks[std::size_t(rank)].host_ranges) {
    if (r.empty()) continue;
    std::memcpy(dst, static_cast<const unsigned char*>(g.data) + r.start * row,
                std::size_t(r.size() * row));
    dst += r.size() * row;
  }
}

void undispatch(const plan::DistPlan& plan, comm::Communicator& comm, const TensorView& local,
                const TensorView& global, std::uintptr_t stream) {
  if (detail::any_on_device({&global, &local})) {
    const detail::HostCopy l(local, stream, true), g(global, stream, false);
    undispatch(plan, comm, l.view, g.view);
    return g.commit();
  }
  const comm::Rows g = detail::rows_of(global, "global"), l = detail::rows_of(local, "local");
  check_pair(plan, comm.rank(), g, l);
  const int cp = int(plan.ranks.size());
  MAGI_CHECK(comm.size() == cp, "communicator size ", comm.size(), " differs from plan cp ", cp);
  std::vector<std::int64_t> counts(plan.ranks.size());
  for (int r = 0; r < cp; ++r) counts[std::size_t(r)] = plan.dispatch.rank_tokens(r);
  const std::int64_t row = g.row_bytes();
  std::vector<unsigned char> gathered(std::size_t(g.num_rows * row));
  comm::Rows out = g;
  out.data = gathered.data();
  comm.all_gather_v(l, out, counts)->wait();
  // Row i of the gathered buffer is global token perm[i] (rank-major dispatched order).
  const std::vector<std::int64_t> perm = plan.dispatch.permutation();
  auto* dst = static_cast<unsigned char*>(g.data);
  for (std::size_t i = 0; i < perm.size(); ++i)
    std::memcpy(dst + perm[i] * row, gathered.data() + std::int64_t(i) * row, std::size_t(row));
}

void all_reduce(comm::Communicator& comm_in, const TensorView& x, comm::ReduceOp op,
                std::uintptr_t stream) {
  std::unique_ptr<comm::Communicator> staged;
  comm::Communicator& comm = detail::for_rows(comm_in, detail::any_on_device({&x}), staged);
  // One element per row (a 0-dim tensor too); the caller checked that x is contiguous.
  comm::Rows rows{x.data, x.numel(), 1, x.dtype};
  if (x.device == Device::kCUDA) rows.device = x.device_idx, rows.stream = stream;
  comm.all_reduce(rows, op)->wait();
}

}  // namespace magi::runtime
