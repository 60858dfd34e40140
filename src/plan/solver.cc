// The static solver (docs/semantics.md §3, magi_notes §5.2): only K/V move. A rank's slices are cut
// by its host rows; the keys those rows see minus its host keys are fetched, so no row arrives
// twice or unused. Every piece of a slice is one band_to_slices() call, so localising is a shift of
// q and k, and the plan is computed from the mask alone (all ranks derive the same value).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "magi/error.h"
#include "magi/plan.h"
#include "overlap.h"

namespace magi::plan {
namespace {

using detail::StageCost;

// Chunk -> owner rank and offset in the owner's buffer; global token -> chunk by binary search
// over chunk starts (the last chunk may be short when the sequence is uneven).
struct Layout {
  std::vector<std::int64_t> chunk_start;  // [num_chunks + 1]
  std::vector<std::int32_t> owner;
  std::vector<std::int64_t> local_offset;

  std::int64_t chunk_of(std::int64_t token) const {
    return std::upper_bound(chunk_start.begin(), chunk_start.end(), token) - chunk_start.begin() -
           1;
  }
};

Layout make_layout(const Dispatch& d) {
  Layout l;
  const std::int64_t n = d.num_chunks();
  l.chunk_start.resize(n + 1);
  for (std::int64_t c = 0; c < n; ++c) {
    const Range r = d.chunk_range(c);
    MAGI_CHECK(c == 0 || r.start == l.chunk_start[c - 1] + d.chunk_range(c - 1).size(),
               "dispatch: chunk ", c, " ", to_string(r), " does not follow chunk ", c - 1);
    l.chunk_start[c] = r.start;
  }
  l.chunk_start[n] = d.total_seqlen;
  l.owner.assign(n, -1);
  l.local_offset.assign(n, 0);
  for (int r = 0; r < d.cp; ++r) {
    std::int64_t offset = 0;
    for (std::int32_t c : d.rank_chunks[r]) {
      MAGI_CHECK(c >= 0 && c < n && l.owner[c] < 0, "dispatch: chunk ", c, " of rank ", r,
                 " is out of range or owned twice");
      l.owner[c] = r;
      l.local_offset[c] = offset;
      offset += l.chunk_start[c + 1] - l.chunk_start[c];
    }
  }
  for (std::int64_t c = 0; c < n; ++c)
    MAGI_CHECK(l.owner[c] >= 0, "dispatch: chunk ", c, " has no owner");
  return l;
}

// Slices whose q range meets each chunk (CSR), so a rank visits only its own slices. A slice
// spanning all of 4M tokens at chunk 512 costs 8k entries, far below the per-rank work.
struct SliceIndex {
  std::vector<std::int64_t> begin;  // [num_chunks + 1]
  std::vector<std::int32_t> ids;
};

SliceIndex make_slice_index(const Mask& mask, const Layout& l) {
  const std::int64_t n = std::int64_t(l.owner.size());
  SliceIndex index;
  index.begin.assign(n + 1, 0);
  auto for_chunks = [&](auto&& fn) {
    for (std::size_t i = 0; i < mask.size(); ++i) {
      const Slice& s = mask[i];
      if (s.q_range.empty() || area(s) == 0) continue;
      const std::int64_t c1 = l.chunk_of(s.q_range.end - 1);
      for (std::int64_t c = l.chunk_of(s.q_range.start); c <= c1; ++c) fn(c, std::int32_t(i));
    }
  };
  for_chunks([&](std::int64_t c, std::int32_t) { ++index.begin[c + 1]; });
  std::partial_sum(index.begin.begin(), index.begin.end(), index.begin.begin());
  index.ids.resize(index.begin[n]);
  std::vector<std::int64_t> fill(index.begin.begin(), index.begin.end() - 1);
  for_chunks([&](std::int64_t c, std::int32_t i) { index.ids[fill[c]++] = i; });
  return index;
}

// A slice cut by one host Q range: its rows, the keys they see, and the q shift to local.
struct Piece {
  std::int32_t slice_idx = 0;
  Range rows, keys;
  std::int64_t q_shift = 0;
};

// Global ranges in buffer order with their buffer offsets.
struct Buffer {
  std::vector<Range> ranges;
  std::vector<std::int64_t> offset;
  std::int64_t size = 0;

  void push(Range r) {
    if (r.empty()) return;
    ranges.push_back(r);
    offset.push_back(size);
    size += r.size();
  }
  // Index of the first range that ends after `token`.
  std::size_t first_after(std::int64_t token) const {
    return std::partition_point(ranges.begin(), ranges.end(),
                                [&](Range r) { return r.end <= token; }) -
           ranges.begin();
  }
  // Positions [lo, hi) of this buffer as global ranges (a stage of the remote buffer).
  Buffer sub(std::int64_t lo, std::int64_t hi) const {
    Buffer out;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const Range pos = Range{offset[i], offset[i] + ranges[i].size()}.intersect({lo, hi});
      if (!pos.empty())
        out.push({ranges[i].start + pos.start - offset[i], ranges[i].start + pos.end - offset[i]});
    }
    return out;
  }
};

struct RankWork {
  Buffer host, remote;
  std::vector<Piece> pieces;
  std::vector<Slice> host_slices;
  std::int64_t host_area = 0;
};

// Cells of piece p against the columns of `cols`, appended as slices local to the host Q
// buffer and to `cols`; returns their area.
std::int64_t localize(const Mask& mask, const Piece& p, const Buffer& cols,
                      std::vector<Slice>& out) {
  const Slice& s = mask[p.slice_idx];
  const Band band = band_of(s);
  std::int64_t total = 0;
  for (std::size_t i = cols.first_after(p.keys.start);
       i < cols.ranges.size() && cols.ranges[i].start < p.keys.end; ++i) {
    const Range c = cols.ranges[i].intersect(p.keys);
    const std::int64_t k_shift = cols.offset[i] - cols.ranges[i].start;
    for (Slice local : band_to_slices(p.rows, c, band)) {
      const std::int64_t a = area(local);
      if (a == 0) continue;
      local.q_range = {local.q_range.start + p.q_shift, local.q_range.end + p.q_shift};
      local.k_range = {local.k_range.start + k_shift, local.k_range.end + k_shift};
      out.push_back(local);
      total += a;
    }
  }
  return total;
}

std::int64_t cells_against(const Mask& mask, const std::vector<Piece>& pieces, const Buffer& cols) {
  std::int64_t total = 0;
  for (const Piece& p : pieces) {
    const Slice& s = mask[p.slice_idx];
    for (std::size_t i = cols.first_after(p.keys.start);
         i < cols.ranges.size() && cols.ranges[i].start < p.keys.end; ++i)
      total += area(s, p.rows, cols.ranges[i]);
  }
  return total;
}

RankWork analyse_rank(const Mask& mask, const Dispatch& d, const Layout& l, const SliceIndex& index,
                      int rank) {
  RankWork w;
  for (Range h : d.host_ranges(rank)) w.host.push(h);
  std::vector<Range> needed;
  std::vector<std::int32_t> ids;
  for (std::size_t hi = 0; hi < w.host.ranges.size(); ++hi) {
    const Range h = w.host.ranges[hi];
    ids.clear();
    for (std::int64_t c = l.chunk_of(h.start), c1 = l.chunk_of(h.end - 1); c <= c1; ++c)
      ids.insert(ids.end(), index.ids.begin() + index.begin[c],
                 index.ids.begin() + index.begin[c + 1]);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (std::int32_t i : ids) {
      const Range rows = h.intersect(mask[i].q_range);
      const Range keys = keys_seen_by(mask[i], rows);
      if (rows.empty() || keys.empty()) continue;
      w.pieces.push_back({i, rows, keys, w.host.offset[hi] - h.start});
      needed.push_back(keys);
    }
  }
  for (const Piece& p : w.pieces) w.host_area += localize(mask, p, w.host, w.host_slices);
  // remote = union(needed) - host; both sorted, host disjoint.
  std::sort(needed.begin(), needed.end(), [](Range a, Range b) { return a.start < b.start; });
  std::size_t hi = 0;
  for (std::size_t i = 0; i < needed.size();) {
    Range u = needed[i++];
    while (i < needed.size() && needed[i].start <= u.end) u.end = std::max(u.end, needed[i++].end);
    std::int64_t pos = u.start;
    while (hi < w.host.ranges.size() && w.host.ranges[hi].end <= pos) ++hi;
    for (std::size_t j = hi; j < w.host.ranges.size() && w.host.ranges[j].start < u.end; ++j) {
      w.remote.push({pos, std::max(pos, w.host.ranges[j].start)});
      pos = std::max(pos, w.host.ranges[j].end);
    }
    if (pos < u.end) w.remote.push({pos, u.end});
  }
  // Merge remote ranges that touch (a gap closed by another rank's chunk between host chunks).
  Buffer merged;
  for (Range r : w.remote.ranges) {
    if (!merged.ranges.empty() && merged.ranges.back().end == r.start) {
      merged.ranges.back().end = r.end;
      merged.size += r.size();
    } else {
      merged.push(r);
    }
  }
  w.remote = std::move(merged);
  return w;
}

// Walks `ranges` chunk by chunk, calling fn(global range, owner) for each same-chunk piece.
template <typename Fn>
void for_owned_pieces(const Layout& l, const std::vector<Range>& ranges, Fn&& fn) {
  for (Range r : ranges) {
    for (std::int64_t g = r.start; g < r.end;) {
      const std::int64_t c = l.chunk_of(g);
      const std::int64_t end = std::min(r.end, l.chunk_start[c + 1]);
      fn(Range{g, end}, l.owner[c]);
      g = end;
    }
  }
}

StageCost stage_cost(const Mask& mask, const Layout& l, const RankWork& w, const Buffer& stage,
                     std::vector<std::int64_t>& stamp, std::int64_t& mark) {
  StageCost cost;
  cost.rows = stage.size;
  cost.area = cells_against(mask, w.pieces, stage);
  ++mark;
  for_owned_pieces(l, stage.ranges, [&](Range, std::int32_t src) {
    if (stamp[src] != mark) stamp[src] = mark, ++cost.messages;
  });
  return cost;
}

// One sender item: local host rows [lo, hi) go to rank dst.
struct SendItem {
  std::int64_t lo, hi;
  std::int32_t dst;
};

// Cuts the host buffer at every item edge; each elementary split carries the ranks whose items
// cover it (items arrive by ascending dst, so the lists come out sorted). Equal neighbours
// merge; a trailing split with no destination is dropped (sizes may sum below host tokens).
void fill_cast_inputs(const std::vector<SendItem>& items, GroupCollectiveArgs& args) {
  if (items.empty()) return;
  std::vector<std::int64_t> bounds{0};
  for (const SendItem& it : items) bounds.push_back(it.lo), bounds.push_back(it.hi);
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::vector<std::vector<std::int32_t>> dst(bounds.size() - 1);
  for (const SendItem& it : items) {
    const auto a = std::lower_bound(bounds.begin(), bounds.end(), it.lo) - bounds.begin();
    const auto b = std::lower_bound(bounds.begin(), bounds.end(), it.hi) - bounds.begin();
    for (auto k = a; k < b; ++k) dst[k].push_back(it.dst);
  }
  std::size_t last = dst.size();
  while (last > 0 && dst[last - 1].empty()) --last;
  for (std::size_t k = 0; k < last; ++k) {
    const std::int64_t size = bounds[k + 1] - bounds[k];
    if (!args.dst_ranks.empty() && args.dst_ranks.back() == dst[k]) {
      args.input_split_sizes.back() += size;
    } else {
      args.input_split_sizes.push_back(size);
      args.dst_ranks.push_back(std::move(dst[k]));
    }
  }
}

}  // namespace

GroupReduceArgs reduce_args(const GroupCollectiveArgs& cast) {
  GroupReduceArgs r;
  r.input_split_sizes = cast.output_split_sizes;
  r.dst_rank = cast.src_rank;
  r.output_split_sizes = cast.input_split_sizes;
  r.src_ranks = cast.dst_ranks;
  return r;
}

DistPlan make_plan(const Mask& mask, const PlanOptions& opts) {
  MAGI_CHECK(mask.total_seqlen_q() == mask.total_seqlen_k(),
             "make_plan: self-attention only, but total_seqlen_q ", mask.total_seqlen_q(),
             " != total_seqlen_k ", mask.total_seqlen_k());
  MAGI_CHECK(opts.num_stages >= 0 && opts.num_stages <= 64, "make_plan: num_stages ",
             opts.num_stages, " is outside 0..64 (0 chooses 1..", detail::kMaxAutoStages, ")");
  const CostModel& cm = opts.cost;
  MAGI_CHECK(std::isfinite(cm.seconds_per_cell) && cm.seconds_per_cell >= 0 &&
                 std::isfinite(cm.bytes_per_row) && cm.bytes_per_row >= 0 &&
                 std::isfinite(cm.bytes_per_second) && cm.bytes_per_second > 0 &&
                 std::isfinite(cm.seconds_per_message) && cm.seconds_per_message >= 0,
             "make_plan: cost model needs finite non-negative figures and bytes_per_second > 0");
  DistPlan plan;
  plan.dispatch = dispatch(mask, opts.dispatch);
  plan.cost = cm;
  const Dispatch& d = plan.dispatch;
  const int cp = d.cp;
  const Layout layout = make_layout(d);
  const SliceIndex index = make_slice_index(mask, layout);

  std::vector<RankWork> work(cp);
  for (int r = 0; r < cp; ++r) work[r] = analyse_rank(mask, d, layout, index, r);

  // Stage count: every rank runs the same number (the collective is per stage), so the
  // choice minimises the slowest rank's predicted forward.
  std::vector<std::int64_t> stamp(cp, 0);
  std::int64_t mark = 0;
  auto costs_of = [&](int r, int num_stages) {
    const RankWork& w = work[r];
    const auto cuts = detail::stage_cuts(w.remote.size, num_stages);
    std::vector<StageCost> costs;
    for (int t = 0; t < num_stages; ++t)
      costs.push_back(stage_cost(mask, layout, w, w.remote.sub(cuts[t], cuts[t + 1]), stamp, mark));
    return costs;
  };
  int num_stages = opts.num_stages;
  if (num_stages == 0) {
    std::vector<std::vector<double>> seconds(detail::kMaxAutoStages, std::vector<double>(cp));
    for (int s = 1; s <= detail::kMaxAutoStages; ++s)
      for (int r = 0; r < cp; ++r)
        seconds[s - 1][r] = detail::forward_seconds(cm, work[r].host_area, costs_of(r, s));
    num_stages = detail::choose_num_stages(seconds);
  }

  plan.ranks.resize(cp);
  std::vector<std::vector<Buffer>> stage_buf(cp);
  for (int r = 0; r < cp; ++r) {
    RankWork& w = work[r];
    RankPlan& rp = plan.ranks[r];
    rp.host_ranges = w.host.ranges;
    rp.host_slices = std::move(w.host_slices);
    rp.host_area = w.host_area;
    rp.stages.resize(num_stages);
    const auto cuts = detail::stage_cuts(w.remote.size, num_stages);
    std::vector<StageCost> costs;
    for (int t = 0; t < num_stages; ++t) {
      Buffer b = w.remote.sub(cuts[t], cuts[t + 1]);
      Stage& st = rp.stages[t];
      st.remote_k_ranges = b.ranges;
      for (const Piece& p : w.pieces) st.area += localize(mask, p, b, st.slices);
      costs.push_back(stage_cost(mask, layout, w, b, stamp, mark));
      stage_buf[r].push_back(std::move(b));
    }
    plan.predicted_seconds =
        std::max(plan.predicted_seconds, detail::forward_seconds(cm, w.host_area, costs));
  }

  // Collective arguments per stage: receivers list their segments by owner in receive-buffer
  // (ascending global) order, which is also each owner's local order, so the streams match.
  std::vector<std::vector<SendItem>> items(cp);
  for (int t = 0; t < num_stages; ++t) {
    for (auto& v : items) v.clear();
    for (int j = 0; j < cp; ++j) {
      GroupCollectiveArgs& args = plan.ranks[j].stages[t].cast;
      for_owned_pieces(layout, stage_buf[j][t].ranges, [&](Range g, std::int32_t src) {
        MAGI_DCHECK(src != j, "rank ", j, " fetches its own row ", g.start);
        if (!args.src_rank.empty() && args.src_rank.back() == src) {
          args.output_split_sizes.back() += g.size();
        } else {
          args.output_split_sizes.push_back(g.size());
          args.src_rank.push_back(src);
        }
        const std::int64_t c = layout.chunk_of(g.start);
        const std::int64_t lo = layout.local_offset[c] + g.start - layout.chunk_start[c];
        auto& v = items[src];
        if (!v.empty() && v.back().dst == j && v.back().hi == lo) {
          v.back().hi += g.size();
        } else {
          v.push_back({lo, lo + g.size(), j});
        }
      });
    }
    for (int i = 0; i < cp; ++i) fill_cast_inputs(items[i], plan.ranks[i].stages[t].cast);
  }
  return plan;
}

TrafficComparison compare_traffic(const Mask& mask, const DistPlan& plan) {
  const Dispatch& d = plan.dispatch;
  MAGI_CHECK(mask.total_seqlen_q() == d.total_seqlen, "compare_traffic: mask has ",
             mask.total_seqlen_q(), " tokens but the plan ", d.total_seqlen);
  TrafficComparison t;
  std::int64_t rows = 0;
  for (const RankPlan& rp : plan.ranks)
    for (const Stage& st : rp.stages)
      for (std::int64_t s : st.cast.output_split_sizes) rows += s;
  t.ours_bytes = double(rows) * plan.cost.bytes_per_row;
  // Ring (zigzag or not) and all-gather both bring every other rank's K/V to every rank.
  const double others = double(d.cp - 1) * double(d.total_seqlen);
  t.ring_bytes = others * plan.cost.bytes_per_row;
  t.all_gather_bytes = t.ring_bytes;
  return t;
}

}  // namespace magi::plan
