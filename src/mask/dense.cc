// Dense boolean masks <-> slices. from_dense is exact for any matrix: each row is cut into
// maximal runs of visible keys, and a run extends the slice that owned the run above it when
// both edges moved by the slice's step (0 or +1 each: FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL).
// Runs of one row are separated by a gap, so at most one run above can match: the greedy
// pass has no choices to make and runs in O(sq * sk).
#include <algorithm>
#include <vector>

#include "magi/error.h"
#include "magi/mask_builders.h"

namespace magi::masks {
namespace {

// A slice under construction: rows [q_start, q_start + num_rows), run `first` on its first
// row, `last` on its last; the step (ds, de) is fixed once it has two rows.
struct OpenSlice {
  std::int64_t q_start = 0;
  std::int64_t num_rows = 0;
  Range first, last;
  std::int64_t ds = 0, de = 0;
};

bool extends(const OpenSlice& o, Range run) {
  const std::int64_t ds = run.start - o.last.start, de = run.end - o.last.end;
  if (ds < 0 || ds > 1 || de < 0 || de > 1) return false;
  return o.num_rows == 1 || (ds == o.ds && de == o.de);
}

// With every row non-empty, the k_range [first.start, last.end) and the step pick the type:
// e.g. CAUSAL row i sees up to first.end - 1 + i, which is i + (sk - sq) in local terms.
Slice to_slice(const OpenSlice& o) {
  MaskType t = MaskType::kFull;
  if (o.num_rows > 1) {
    if (o.ds == 0 && o.de == 1) t = MaskType::kCausal;
    if (o.ds == 1 && o.de == 0) t = MaskType::kInvCausal;
    if (o.ds == 1 && o.de == 1) t = MaskType::kBiCausal;
  }
  return {{o.q_start, o.q_start + o.num_rows}, {o.first.start, o.last.end}, t};
}

}  // namespace

Mask from_dense(std::span<const std::uint8_t> dense, std::int64_t seqlen_q, std::int64_t seqlen_k) {
  MAGI_CHECK(seqlen_q >= 0, "seqlen_q is negative (", seqlen_q, ")");
  MAGI_CHECK(seqlen_k >= 0, "seqlen_k is negative (", seqlen_k, ")");
  const auto size = static_cast<std::int64_t>(dense.size());
  MAGI_CHECK((seqlen_k == 0 ? size == 0 : size % seqlen_k == 0 && size / seqlen_k == seqlen_q),
             "dense mask has ", size, " entries but seqlen_q x seqlen_k is ", seqlen_q, " x ",
             seqlen_k);
  std::vector<Slice> slices;
  std::vector<OpenSlice> open, next;
  std::vector<Range> runs;
  for (std::int64_t q = 0; q < seqlen_q; ++q) {
    const std::uint8_t* row = dense.data() + q * seqlen_k;
    runs.clear();
    for (std::int64_t k = 0; k < seqlen_k;) {
      if (!row[k]) {
        ++k;
        continue;
      }
      const std::int64_t start = k;
      while (k < seqlen_k && row[k]) ++k;
      runs.push_back({start, k});
    }
    // open is sorted by last.start; an open slice whose run starts more than one key left of
    // the current run can match neither it nor any later run.
    next.clear();
    std::size_t p = 0;
    for (Range run : runs) {
      while (p < open.size() && open[p].last.start < run.start - 1)
        slices.push_back(to_slice(open[p++]));
      if (p < open.size() && extends(open[p], run)) {
        OpenSlice o = open[p++];
        if (o.num_rows == 1) {
          o.ds = run.start - o.last.start;
          o.de = run.end - o.last.end;
        }
        o.last = run;
        ++o.num_rows;
        next.push_back(o);
        continue;
      }
      while (p < open.size() && open[p].last.start <= run.start)
        slices.push_back(to_slice(open[p++]));
      next.push_back({q, 1, run, run, 0, 0});
    }
    while (p < open.size()) slices.push_back(to_slice(open[p++]));
    std::swap(open, next);
  }
  for (const OpenSlice& o : open) slices.push_back(to_slice(o));
  std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
    return a.q_range.start != b.q_range.start ? a.q_range.start < b.q_range.start
                                              : a.k_range.start < b.k_range.start;
  });
  return Mask(seqlen_q, seqlen_k, std::move(slices));
}

std::vector<std::uint8_t> to_dense(const Mask& mask) {
  const std::int64_t sq = mask.total_seqlen_q(), sk = mask.total_seqlen_k();
  MAGI_CHECK(sk == 0 || sq <= (std::int64_t{1} << 40) / sk, "to_dense: ", sq, " x ", sk,
             " cells is too large to materialise");
  std::vector<std::uint8_t> dense(static_cast<std::size_t>(sq * sk), 0);
  for (const Slice& s : mask.slices()) {
    for (std::int64_t q = s.q_range.start; q < s.q_range.end; ++q) {
      const Range keys = visible_keys(s, q);
      if (keys.empty()) continue;
      std::fill(dense.begin() + q * sk + keys.start, dense.begin() + q * sk + keys.end, 1);
    }
  }
  return dense;
}

}  // namespace magi::masks
