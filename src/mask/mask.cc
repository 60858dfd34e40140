// Mask semantics, counted exactly. Every slice is (rectangle) ∩ (diagonal band lo <= k - q <=
// hi); intersections of slices keep that shape, so areas, tile classes and overlap checks are
// all one O(1) primitive: band_cells() below.
#include "magi/mask.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "magi/error.h"

namespace magi {
namespace {

// sum_{t=0}^{n-1} max(0, v0 + slope * t) for slope in {-1, 0, 1}.
std::int64_t sum_positive_linear(std::int64_t n, std::int64_t v0, int slope) {
  if (n <= 0) return 0;
  if (slope == 0) return v0 > 0 ? n * v0 : 0;
  std::int64_t first_t, last_t;
  if (slope > 0) {
    first_t = std::max<std::int64_t>(0, 1 - v0);
    last_t = n - 1;
  } else {
    first_t = 0;
    last_t = std::min(n - 1, v0 - 1);
  }
  if (last_t < first_t) return 0;
  const std::int64_t m = last_t - first_t + 1;
  const std::int64_t first = v0 + slope * first_t, last = v0 + slope * last_t;
  return m * (first + last) / 2;  // first + last and m never both odd: exact
}

// Cells (q, k) with q in rows, k in cols and lo <= k - q <= hi. Row q sees
// [max(c, q + lo), min(d, q + hi + 1)); its length is piecewise linear in q with breakpoints
// q1 (right edge stops following the diagonal) and q2 (left edge starts following it).
std::int64_t band_cells(Range rows, Range cols, Band band) {
  if (rows.empty() || cols.empty() || band.hi < band.lo) return 0;
  const std::int64_t a = rows.start, b = rows.end, c = cols.start, d = cols.end;
  const std::int64_t q1 = std::clamp(d - band.hi - 1, a, b);
  const std::int64_t q2 = std::clamp(c - band.lo, a, b);
  std::int64_t total = 0;
  // Pieces in q order; each is [from, to) with a linear length.
  const std::int64_t lo_mid = std::min(q1, q2), hi_mid = std::max(q1, q2);
  // q < min(q1, q2): length q + hi + 1 - c, slope +1.
  total += sum_positive_linear(lo_mid - a, a + band.hi + 1 - c, 1);
  if (q1 < q2) {  // q1 <= q < q2: length d - c
    total += sum_positive_linear(hi_mid - lo_mid, d - c, 0);
  } else {  // q2 <= q < q1: length hi - lo + 1
    total += sum_positive_linear(hi_mid - lo_mid, band.hi - band.lo + 1, 0);
  }
  // q >= max(q1, q2): length d - q - lo, slope -1.
  total += sum_positive_linear(b - hi_mid, d - hi_mid - band.lo, -1);
  return total;
}

Band intersect(Band x, Band y) { return Band{std::max(x.lo, y.lo), std::min(x.hi, y.hi)}; }

std::string slice_name(std::size_t idx) { return "slice " + std::to_string(idx); }

void check_range(const Range& r, std::int64_t total, std::size_t idx, const char* which,
                 const char* total_name) {
  MAGI_CHECK(r.start <= r.end, slice_name(idx), ": ", which, " ", to_string(r), " is reversed");
  MAGI_CHECK(r.start >= 0, slice_name(idx), ": ", which, " ", to_string(r), " starts before 0");
  MAGI_CHECK(r.end <= total, slice_name(idx), ": ", which, " ", to_string(r), " lies beyond ",
             total_name, " ", total);
}

}  // namespace

std::string to_string(Range r) {
  std::ostringstream os;  // not operator+ chains: GCC 12 -O3 flags them with a false -Wrestrict
  os << '[' << r.start << ", " << r.end << ')';
  return os.str();
}

std::string_view mask_type_name(MaskType t) {
  switch (t) {
    case MaskType::kFull: return "full";
    case MaskType::kCausal: return "causal";
    case MaskType::kInvCausal: return "inv_causal";
    case MaskType::kBiCausal: return "bi_causal";
  }
  return "unknown";
}

MaskType mask_type_from_int(std::int64_t v, std::string_view what) {
  MAGI_CHECK(v >= 0 && v <= 3, what, ": unknown mask type ", v,
             " (expected 0 full, 1 causal, 2 inv_causal, 3 bi_causal)");
  return static_cast<MaskType>(v);
}

MaskType mask_type_from_name(std::string_view name, std::string_view what) {
  std::string s(name);
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  for (int v = 0; v <= 3; ++v) {
    const auto t = static_cast<MaskType>(v);
    if (s == mask_type_name(t) || s == std::to_string(v)) return t;
  }
  MAGI_FAIL(what, ": unknown mask type '", name,
             "' (expected full, causal, inv_causal, bi_causal or 0..3)");
}

std::string to_string(const Slice& s) {
  return "q " + to_string(s.q_range) + " k " + to_string(s.k_range) + " " +
         std::string(mask_type_name(s.type));
}

Band band_of(const Slice& s) {
  const auto bits = static_cast<unsigned>(s.type);
  Band b;
  if (bits & 2u) b.lo = s.k_range.start - s.q_range.start;  // INV_CAUSAL edge: j >= i
  if (bits & 1u) b.hi = s.k_range.end - s.q_range.end;      // CAUSAL edge: j <= i + sk - sq
  return b;
}

Range visible_keys(const Slice& s, std::int64_t q) {
  if (!s.q_range.contains(q)) return Range{s.k_range.start, s.k_range.start};
  const Band b = band_of(s);
  // kNone keeps q + lo and q + hi + 1 far from overflow for any real sequence length.
  const std::int64_t lo = std::max(s.k_range.start, q + b.lo);
  const std::int64_t hi = std::min(s.k_range.end, q + b.hi + 1);
  return hi > lo ? Range{lo, hi} : Range{lo, lo};
}

bool visible(const Slice& s, std::int64_t q, std::int64_t k) {
  return visible_keys(s, q).contains(k);
}

// Row q of s sees [max(k_start, q + lo), min(k_end, q + hi + 1)), non-empty exactly for q in
// [k_start - hi, k_end - lo) when lo <= hi; both edges grow with q, so the union over rows
// [a, b) of visible rows runs from row a's left edge to row (b - 1)'s right edge. The same
// argument on columns gives rows_seeing. Band::kNone keeps these sums from overflowing.
Range keys_seen_by(const Slice& s, Range rows) {
  const Band b = band_of(s);
  rows = rows.intersect(s.q_range).intersect(Range{s.k_range.start - b.hi, s.k_range.end - b.lo});
  if (rows.empty() || b.hi < b.lo) return Range{s.k_range.start, s.k_range.start};
  return s.k_range.intersect(Range{rows.start + b.lo, rows.end + b.hi});
}

Range rows_seeing(const Slice& s, Range keys) {
  const Band b = band_of(s);
  keys = keys.intersect(s.k_range).intersect(Range{s.q_range.start + b.lo, s.q_range.end + b.hi});
  if (keys.empty() || b.hi < b.lo) return Range{s.q_range.start, s.q_range.start};
  return s.q_range.intersect(Range{keys.start - b.hi, keys.end - b.lo});
}

std::vector<Slice> band_to_slices(Range rows, Range cols, Band band) {
  std::vector<Slice> out;
  if (band.hi < band.lo || cols.empty()) return out;
  // Rows with a visible key, then the breakpoints where the left edge starts stepping (q2)
  // and where the right edge stops stepping (q1), as in band_cells.
  rows = rows.intersect(Range{cols.start - band.hi, cols.end - band.lo});
  if (rows.empty()) return out;
  const std::int64_t q1 = std::clamp(cols.end - band.hi - 1, rows.start, rows.end);
  const std::int64_t q2 = std::clamp(cols.start - band.lo, rows.start, rows.end);
  const std::int64_t cuts[] = {rows.start, std::min(q1, q2), std::max(q1, q2), rows.end};
  for (int p = 0; p < 3; ++p) {
    const Range piece{cuts[p], cuts[p + 1]};
    if (piece.empty()) continue;
    const bool left_steps = piece.start >= q2;  // left edge q + lo, else cols.start
    const bool right_steps = piece.end <= q1;   // right edge q + hi + 1, else cols.end
    const std::int64_t k0 = left_steps ? piece.start + band.lo : cols.start;
    const std::int64_t k1 = right_steps ? piece.end + band.hi : cols.end;
    const MaskType type = left_steps ? (right_steps ? MaskType::kBiCausal : MaskType::kInvCausal)
                                     : (right_steps ? MaskType::kCausal : MaskType::kFull);
    out.push_back(Slice{piece, Range{k0, k1}, piece.size() == 1 ? MaskType::kFull : type});
  }
  return out;
}

std::int64_t area(const Slice& s) { return band_cells(s.q_range, s.k_range, band_of(s)); }

std::int64_t area(const Slice& s, Range q_rows) {
  return band_cells(s.q_range.intersect(q_rows), s.k_range, band_of(s));
}

std::int64_t area(const Slice& s, Range q_rows, Range k_cols) {
  return band_cells(s.q_range.intersect(q_rows), s.k_range.intersect(k_cols), band_of(s));
}

TileClass classify(const Slice& s, Range q_rows, Range k_cols) {
  const std::int64_t a = area(s, q_rows, k_cols);
  if (a == 0) return TileClass::kEmpty;
  return a == q_rows.size() * k_cols.size() ? TileClass::kFull : TileClass::kPartial;
}

void validate_slices(std::int64_t total_q, std::int64_t total_k,
                     const std::vector<Slice>& slices) {
  MAGI_CHECK(total_q >= 0, "total_seqlen_q ", total_q, " is negative");
  MAGI_CHECK(total_k >= 0, "total_seqlen_k ", total_k, " is negative");
  MAGI_CHECK(total_k == 0 || total_q <= kMaxMaskCells / total_k,
             "total_seqlen_q x total_seqlen_k = ", total_q, " x ", total_k,
             " cells: more than the 2^62 an exact area can count");
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const Slice& s = slices[i];
    MAGI_CHECK(static_cast<unsigned>(s.type) <= 3u, slice_name(i), ": unknown mask type ",
               static_cast<unsigned>(s.type));
    check_range(s.q_range, total_q, i, "q_range", "total_seqlen_q");
    check_range(s.k_range, total_k, i, "k_range", "total_seqlen_k");
  }
  // Sweep over q: only slices whose q ranges overlap can share a cell.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < slices.size(); ++i)
    if (area(slices[i]) > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    const Range a = slices[x].q_range, b = slices[y].q_range;
    return a.start != b.start ? a.start < b.start : x < y;
  });
  std::vector<std::size_t> active;
  for (std::size_t i : order) {
    const Slice& s = slices[i];
    std::erase_if(active, [&](std::size_t j) { return slices[j].q_range.end <= s.q_range.start; });
    for (std::size_t j : active) {
      const Slice& t = slices[j];
      const Range rows = s.q_range.intersect(t.q_range);
      const Range cols = s.k_range.intersect(t.k_range);
      const Band band = intersect(band_of(s), band_of(t));
      if (band_cells(rows, cols, band) == 0) continue;
      // First shared row: the first q whose interval in cols is non-empty (concave length).
      const std::int64_t q = std::max(rows.start, cols.start - band.hi);
      const std::int64_t k = std::max(cols.start, q + band.lo);
      MAGI_FAIL("slices ", std::min(i, j), " (", to_string(slices[std::min(i, j)]),
                 ") and ", std::max(i, j), " (", to_string(slices[std::max(i, j)]),
                 ") both cover cell (q ", q, ", k ", k, ")");
    }
    active.push_back(i);
  }
}

Mask::Mask(std::int64_t total_q, std::int64_t total_k, std::vector<Slice> slices)
    : total_q_(total_q), total_k_(total_k), slices_(std::move(slices)) {
  validate_slices(total_q_, total_k_, slices_);
}

std::int64_t Mask::area() const {
  std::int64_t a = 0;
  for (const Slice& s : slices_) a += magi::area(s);
  return a;
}

std::int64_t Mask::area(Range q_rows) const {
  std::int64_t a = 0;
  for (const Slice& s : slices_) a += magi::area(s, q_rows);
  return a;
}

std::int64_t Mask::area(Range q_rows, Range k_cols) const {
  std::int64_t a = 0;
  for (const Slice& s : slices_) a += magi::area(s, q_rows, k_cols);
  return a;
}

double Mask::sparsity() const {
  const double cells = double(total_q_) * double(total_k_);
  return cells > 0 ? 1.0 - double(area()) / cells : 0.0;
}

bool Mask::visible(std::int64_t q, std::int64_t k) const {
  for (const Slice& s : slices_)
    if (magi::visible(s, q, k)) return true;
  return false;
}

TileGrid Mask::classify_tiles(std::int64_t block_q, std::int64_t block_k) const {
  MAGI_CHECK(block_q > 0 && block_k > 0, "tile size ", block_q, " x ", block_k,
             " must be positive");
  TileGrid g;
  g.block_q = block_q;
  g.block_k = block_k;
  g.num_q_tiles = (total_q_ + block_q - 1) / block_q;
  g.num_k_tiles = (total_k_ + block_k - 1) / block_k;
  std::vector<std::int64_t> cells(std::size_t(g.num_q_tiles * g.num_k_tiles), 0);
  for (const Slice& s : slices_) {
    if (s.q_range.empty() || s.k_range.empty()) continue;
    for (std::int64_t qi = s.q_range.start / block_q; qi * block_q < s.q_range.end; ++qi) {
      const Range rows{qi * block_q, std::min((qi + 1) * block_q, total_q_)};
      const Range keys = keys_seen_by(s, rows);
      for (std::int64_t ki = keys.start / block_k; ki * block_k < keys.end; ++ki) {
        const Range cols{ki * block_k, std::min((ki + 1) * block_k, total_k_)};
        cells[std::size_t(qi * g.num_k_tiles + ki)] += magi::area(s, rows, cols);
      }
    }
  }
  g.tiles.resize(cells.size());
  for (std::int64_t qi = 0; qi < g.num_q_tiles; ++qi) {
    const std::int64_t rows = std::min(block_q, total_q_ - qi * block_q);
    for (std::int64_t ki = 0; ki < g.num_k_tiles; ++ki) {
      const std::int64_t tile = rows * std::min(block_k, total_k_ - ki * block_k);
      const std::int64_t c = cells[std::size_t(qi * g.num_k_tiles + ki)];
      g.tiles[std::size_t(qi * g.num_k_tiles + ki)] =
          c == 0 ? TileClass::kEmpty : c == tile ? TileClass::kFull : TileClass::kPartial;
    }
  }
  return g;
}

std::string Mask::to_string() const {
  std::ostringstream os;
  os << "mask " << total_q_ << " x " << total_k_ << ", " << slices_.size() << " slices, area "
     << area() << "\n";
  for (std::size_t i = 0; i < slices_.size(); ++i)
    os << "  " << i << ": " << magi::to_string(slices_[i]) << "\n";
  return os.str();
}

}  // namespace magi
