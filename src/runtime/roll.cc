// roll (docs/semantics.md §3, multi-token-prediction labels): torch.roll along the GLOBAL sequence
// on dispatched local rows. Every rank derives the same row map from the plan alone: each of a
// source rank's host ranges, shifted, lands on at most two global intervals (wrap), which are cut
// by the owners' host ranges. Rows staying on a rank are copied locally; the rest move in one
// group_cast (each row has exactly one destination). Bit-exact: only bytes are moved.
#include <algorithm>
#include <cstring>
#include <vector>

#include "magi/runtime.h"
#include "views.h"

namespace magi::runtime {

namespace {

// A run of rows: src rank's local [src_off, src_off + len) -> dst rank's local [dst_off, ...).
struct Segment {
  std::int64_t src_off = 0, len = 0;
  int dst = 0;
  std::int64_t dst_off = 0;
};

// One host range of one rank: global [start, end) at local offset `off`.
struct Owned {
  std::int64_t start = 0, end = 0;
  int rank = 0;
  std::int64_t off = 0;
};

std::vector<Owned> owner_table(const plan::DistPlan& plan) {
  std::vector<Owned> t;
  for (int r = 0; r < int(plan.ranks.size()); ++r) {
    std::int64_t off = 0;
    for (const Range g : plan.ranks[std::size_t(r)].host_ranges) {
      if (!g.empty()) t.push_back({g.start, g.end, r, off});
      off += g.size();
    }
  }
  std::sort(t.begin(), t.end(), [](const Owned& a, const Owned& b) { return a.start < b.start; });
  std::int64_t covered = 0;
  for (const Owned& o : t) {
    MAGI_CHECK(o.start == covered, "roll: plan host ranges do not tile [0, ",
               plan.dispatch.total_seqlen, "): gap or overlap at token ", covered);
    covered = o.end;
  }
  MAGI_CHECK(covered == plan.dispatch.total_seqlen, "roll: plan host ranges cover ", covered,
             " of ", plan.dispatch.total_seqlen, " tokens");
  return t;
}

// Rows of source rank `src` (local [src_off, src_off + len)) landing on global [g, g + len):
// cut by the owners of the destination tokens.
void place(const std::vector<Owned>& table, std::int64_t src_off, std::int64_t g,
           std::int64_t len, std::vector<Segment>& out) {
  auto it = std::upper_bound(table.begin(), table.end(), g,
                             [](std::int64_t x, const Owned& o) { return x < o.start; });
  --it;  // the entry containing g (the table tiles [0, N) and 0 <= g < N)
  while (len > 0) {
    const std::int64_t n = std::min(len, it->end - g);
    out.push_back({src_off, n, it->rank, it->off + (g - it->start)});
    src_off += n, g += n, len -= n;
    ++it;
  }
}

// Segments of one source rank, in ascending source local order.
std::vector<Segment> segments_of(const plan::DistPlan& plan, const std::vector<Owned>& table,
                                 int src, std::int64_t shift, bool wrap) {
  const std::int64_t n = plan.dispatch.total_seqlen;
  std::vector<Segment> out;
  std::int64_t off = 0;
  for (const Range r : plan.ranks[std::size_t(src)].host_ranges) {
    const std::int64_t len = r.size();
    if (len <= 0) continue;
    if (wrap) {
      const std::int64_t d = (r.start + (shift % n + n) % n) % n;
      const std::int64_t first = std::min(len, n - d);
      place(table, off, d, first, out);
      if (first < len) place(table, off + first, 0, len - first, out);
    } else {
      // Global destinations [r.start + shift, r.end + shift) clipped to [0, n); |shift| >= n
      // places nothing (checked first, so -shift and n - shift cannot overflow).
      if (shift > -n && shift < n) {
        const std::int64_t lo = shift < 0 ? std::max(r.start, -shift) : r.start;
        const std::int64_t hi = shift > 0 ? std::min(r.end, n - shift) : r.end;
        if (lo < hi) place(table, off + (lo - r.start), lo + shift, hi - lo, out);
      }
    }
    off += len;
  }
  return out;
}

void fill_rows(unsigned char* dst, std::int64_t rows, std::int64_t row_elems, DType dtype,
               double value) {
  const std::int64_t count = rows * row_elems;
  auto fill_as = [&](auto v) {
    auto* p = reinterpret_cast<decltype(v)*>(dst);
    std::fill(p, p + count, v);
  };
  switch (dtype) {
    case DType::kF64: fill_as(value); break;
    case DType::kF32: fill_as(float(value)); break;
    case DType::kBF16: fill_as(to_bf16(float(value)).bits); break;
    case DType::kF16: fill_as(to_f16(float(value)).bits); break;
  }
}

}  // namespace

void roll(const plan::DistPlan& plan, comm::Communicator& comm, const TensorView& local_in,
          const TensorView& local_out, std::int64_t shift, std::optional<double> fill,
          std::uintptr_t stream) {
  if (detail::any_on_device({&local_in, &local_out})) {
    MAGI_CHECK(local_in.numel() == 0 || local_in.data != local_out.data,
               "roll: local_in and local_out alias");
    const detail::HostCopy in(local_in, stream, true), out(local_out, stream, false);
    roll(plan, comm, in.view, out.view, shift, fill);
    return out.commit();
  }
  const comm::Rows in = detail::rows_of(local_in, "local_in");
  const comm::Rows out = detail::rows_of(local_out, "local_out");
  const int cp = int(plan.ranks.size()), rank = comm.rank();
  MAGI_CHECK(comm.size() == cp, "communicator size ", comm.size(), " differs from plan cp ", cp);
  MAGI_CHECK(rank >= 0 && rank < cp, "communicator rank ", rank, " has no entry in the plan");
  const std::int64_t nl = plan.dispatch.rank_tokens(rank);
  MAGI_CHECK(in.num_rows == nl && out.num_rows == nl, "roll: local_in ", in.num_rows,
             " rows, local_out ", out.num_rows, " rows, but rank ", rank, " holds ", nl);
  MAGI_CHECK(in.dtype == out.dtype && in.row_elems == out.row_elems,
             "roll: local_in and local_out rows differ: ", in.row_elems, " x ",
             dtype_name(in.dtype), " vs ", out.row_elems, " x ", dtype_name(out.dtype));
  MAGI_CHECK(in.num_rows == 0 || in.data != out.data, "roll: local_in and local_out alias");
  const std::int64_t n = plan.dispatch.total_seqlen;
  if (n == 0) return;
  const bool wrap = !fill.has_value();
  const std::int64_t row = in.row_bytes();
  const std::vector<Owned> table = owner_table(plan);

  // Send side: this rank's local rows cut into consecutive splits, each to <= 1 rank.
  const std::vector<Segment> mine = segments_of(plan, table, rank, shift, wrap);
  std::vector<std::int64_t> in_sizes;
  std::vector<std::vector<std::int32_t>> dsts;
  const auto* src = static_cast<const unsigned char*>(in.data);
  auto* dst = static_cast<unsigned char*>(out.data);
  std::vector<char> written(std::size_t(wrap ? 0 : nl), 0);
  auto mark = [&](std::int64_t off, std::int64_t len) {
    if (!wrap) std::fill(written.begin() + off, written.begin() + off + len, char(1));
  };
  std::int64_t cursor = 0;
  for (const Segment& s : mine) {
    if (s.src_off > cursor) in_sizes.push_back(s.src_off - cursor), dsts.emplace_back();
    if (s.dst == rank) {
      std::memcpy(dst + s.dst_off * row, src + s.src_off * row, std::size_t(s.len * row));
      mark(s.dst_off, s.len);
      in_sizes.push_back(s.len), dsts.emplace_back();
    } else if (!dsts.empty() && !dsts.back().empty() && dsts.back()[0] == s.dst &&
               s.src_off == cursor) {
      in_sizes.back() += s.len;  // contiguous run to the same rank: one split
    } else {
      in_sizes.push_back(s.len), dsts.push_back({std::int32_t(s.dst)});
    }
    cursor = s.src_off + s.len;
  }

  // Receive side: one split per source rank, in its source split order (ascending local).
  std::vector<std::int64_t> out_sizes;
  std::vector<std::int32_t> src_ranks;
  std::vector<Segment> incoming;  // in receive-buffer order
  for (int s = 0; s < cp; ++s) {
    if (s == rank) continue;
    std::int64_t count = 0;
    for (const Segment& seg : segments_of(plan, table, s, shift, wrap))
      if (seg.dst == rank) incoming.push_back(seg), count += seg.len;
    if (count > 0) out_sizes.push_back(count), src_ranks.push_back(std::int32_t(s));
  }
  std::int64_t recv_rows = 0;
  for (const std::int64_t c : out_sizes) recv_rows += c;
  std::vector<unsigned char> recv(std::size_t(recv_rows * row));
  comm::Rows recv_rows_buf{recv.data(), recv_rows, in.row_elems, in.dtype};
  // Collective: every rank calls it, even with nothing to send or receive.
  comm.group_cast(in, in_sizes, dsts, recv_rows_buf, out_sizes, src_ranks)->wait();
  std::int64_t at = 0;
  for (const Segment& seg : incoming) {
    std::memcpy(dst + seg.dst_off * row, recv.data() + at * row, std::size_t(seg.len * row));
    mark(seg.dst_off, seg.len);
    at += seg.len;
  }
  if (!wrap)
    for (std::int64_t i = 0; i < nl;) {
      if (written[std::size_t(i)]) { ++i; continue; }
      std::int64_t j = i;
      while (j < nl && !written[std::size_t(j)]) ++j;
      fill_rows(dst + i * row, j - i, in.row_elems, in.dtype, *fill);
      i = j;
    }
}

}  // namespace magi::runtime
