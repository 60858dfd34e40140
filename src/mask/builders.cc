// Mask builders (docs/semantics.md §1). Every builder emits few, non-overlapping slices computed in
// closed form from row-interval edges: a window over one block is at most 3 slices (the left edge
// is clamped or stepping, the right edge likewise); with global tokens the keys split at G, at most
// 2 slices over [0, G) and the window over [G, sk), so no two slices' rectangles overlap.
// Single-row slices are FULL and merge with FULL neighbours.
#include <algorithm>
#include <string_view>
#include <vector>

#include "magi/error.h"
#include "magi/mask_builders.h"

namespace magi::masks {
namespace {

using Span = std::span<const std::int64_t>;

void check_len(std::int64_t v, std::string_view name) {
  MAGI_CHECK(v >= 0, name, " is negative (", v, ")");
}

void check_block(std::int64_t v, std::string_view name) {
  MAGI_CHECK(v > 0, name, " must be positive (got ", v, ")");
}

void check_cu_seqlens(Span cu, std::string_view name) {
  MAGI_CHECK(!cu.empty(), name, " is empty (needs at least [0])");
  MAGI_CHECK(cu[0] == 0, name, "[0] must be 0 (got ", cu[0], ")");
  for (std::size_t i = 1; i < cu.size(); ++i) {
    MAGI_CHECK(cu[i] >= cu[i - 1], name, " decreases at index ", i, " (", cu[i - 1], " -> ", cu[i],
               ")");
  }
}

void check_pair(Span cu_q, Span cu_k) {
  check_cu_seqlens(cu_q, "cu_seqlens_q");
  check_cu_seqlens(cu_k, "cu_seqlens_k");
  MAGI_CHECK(cu_q.size() == cu_k.size(), "cu_seqlens_q has ", cu_q.size(),
             " entries but cu_seqlens_k has ", cu_k.size(), " (documents pair up by index)");
}

std::int64_t clamp64(std::int64_t v, std::int64_t lo, std::int64_t hi) {
  return std::min(std::max(v, lo), hi);
}

void push_nonempty(std::vector<Slice>& out, Range q, Range k, MaskType t) {
  if (!q.empty() && !k.empty()) out.push_back({q, k, t});
}

// One row of any type sees its whole k_range, so it is FULL; adjacent FULL slices with the
// same k_range then fuse. Keeps e.g. a window that spans the whole block at 1 slice, not 3.
std::vector<Slice> tidy(std::vector<Slice> in) {
  std::vector<Slice> out;
  for (Slice s : in) {
    if (s.q_range.size() == 1) s.type = MaskType::kFull;
    if (!out.empty()) {
      Slice& last = out.back();
      if (last.type == MaskType::kFull && s.type == MaskType::kFull && last.k_range == s.k_range &&
          last.q_range.end == s.q_range.start) {
        last.q_range.end = s.q_range.end;
        continue;
      }
    }
    out.push_back(s);
  }
  return out;
}

// Row i (local) of a windowed block sees keys [max(0, i + a), min(sk - 1, i + c)]; an
// unbounded side is a clamp on every row. Windows wider than sq + sk behave as unbounded,
// which also keeps a and c far from overflow.
struct WindowEdges {
  std::int64_t a = 0, c = 0;
  bool left_open = false, right_open = false;
};

WindowEdges window_edges(std::int64_t sq, std::int64_t sk, Window w) {
  const std::int64_t d = sk - sq;
  WindowEdges e;
  e.left_open = w.left < 0 || w.left > sq + sk;
  e.right_open = w.right < 0 || w.right > sq + sk;
  e.a = e.left_open ? 0 : d - w.left;
  e.c = e.right_open ? 0 : d + w.right;
  return e;
}

void check_range(Range r, std::string_view name) {
  MAGI_CHECK(r.start >= 0, name, " ", to_string(r), " starts below 0");
  MAGI_CHECK(r.start <= r.end, name, " ", to_string(r), " is reversed");
}

Mask varlen(Span cu_q, Span cu_k, MaskType type) {
  check_pair(cu_q, cu_k);
  std::vector<Slice> slices;
  for (std::size_t i = 0; i + 1 < cu_q.size(); ++i) {
    push_nonempty(slices, {cu_q[i], cu_q[i + 1]}, {cu_k[i], cu_k[i + 1]}, type);
  }
  return Mask(cu_q.back(), cu_k.back(), std::move(slices));
}

}  // namespace

Mask full(std::int64_t seqlen_q, std::int64_t seqlen_k) {
  check_len(seqlen_q, "seqlen_q");
  check_len(seqlen_k, "seqlen_k");
  std::vector<Slice> slices;
  push_nonempty(slices, {0, seqlen_q}, {0, seqlen_k}, MaskType::kFull);
  return Mask(seqlen_q, seqlen_k, std::move(slices));
}

Mask causal(std::int64_t seqlen_q, std::int64_t seqlen_k) {
  check_len(seqlen_q, "seqlen_q");
  check_len(seqlen_k, "seqlen_k");
  std::vector<Slice> slices;
  push_nonempty(slices, {0, seqlen_q}, {0, seqlen_k}, MaskType::kCausal);
  return Mask(seqlen_q, seqlen_k, std::move(slices));
}

Mask varlen_full(Span cu_seqlens_q, Span cu_seqlens_k) {
  return varlen(cu_seqlens_q, cu_seqlens_k, MaskType::kFull);
}
Mask varlen_causal(Span cu_seqlens_q, Span cu_seqlens_k) {
  return varlen(cu_seqlens_q, cu_seqlens_k, MaskType::kCausal);
}
Mask varlen_full(Span cu_seqlens) { return varlen_full(cu_seqlens, cu_seqlens); }
Mask varlen_causal(Span cu_seqlens) { return varlen_causal(cu_seqlens, cu_seqlens); }

namespace {

// Rows split at two thresholds: L (first row whose left edge steps rather than sits at 0) and
// H (first row whose right edge is clamped at sk - 1). [0, min(L, H)) is CAUSAL, [H, L) FULL,
// [L, H) BI_CAUSAL, [max(L, H), sq) INV_CAUSAL. Rows that see nothing are trimmed, and so are
// rows before first_row (rows whose aligned position is negative, see the header).
std::vector<Slice> window_slices_from(Range q_range, Range k_range, Window w,
                                      std::int64_t first_row) {
  const std::int64_t sq = q_range.size(), sk = k_range.size();
  std::vector<Slice> out;
  if (sq == 0 || sk == 0) return out;
  const WindowEdges e = window_edges(sq, sk, w);
  const std::int64_t first_left_step = e.left_open ? sq : clamp64(-e.a, 0, sq);
  const std::int64_t first_right_clamp = e.right_open ? 0 : clamp64(sk - e.c, 0, sq);
  const std::int64_t row_begin =
      std::max(first_row, e.right_open ? std::int64_t{0} : clamp64(-e.c, 0, sq));
  const std::int64_t row_end = e.left_open ? sq : clamp64(sk - e.a, 0, sq);

  // A stepping edge makes the k bound a function of the first or last kept row, so rows are
  // trimmed before the bounds are taken.
  auto emit = [&](std::int64_t r0, std::int64_t r1, MaskType t) {
    r0 = std::max(r0, row_begin);
    r1 = std::min(r1, row_end);
    if (r0 >= r1) return;
    const bool left_steps = t == MaskType::kInvCausal || t == MaskType::kBiCausal;
    const bool right_steps = t == MaskType::kCausal || t == MaskType::kBiCausal;
    const std::int64_t k_start = left_steps ? r0 + e.a : 0;
    const std::int64_t k_end = right_steps ? r1 + e.c : sk;
    out.push_back({{q_range.start + r0, q_range.start + r1},
                   {k_range.start + k_start, k_range.start + k_end},
                   t});
  };
  const std::int64_t lo = std::min(first_left_step, first_right_clamp);
  const std::int64_t hi = std::max(first_left_step, first_right_clamp);
  emit(0, lo, MaskType::kCausal);
  emit(lo, hi, first_right_clamp < first_left_step ? MaskType::kFull : MaskType::kBiCausal);
  emit(hi, sq, MaskType::kInvCausal);
  return tidy(std::move(out));
}

// The first sq - sk rows of a block with more queries than keys sit left of key 0.
std::int64_t first_aligned_row(std::int64_t sq, std::int64_t sk) {
  return std::max<std::int64_t>(0, sq - sk);
}

}  // namespace

std::vector<Slice> window_slices(Range q_range, Range k_range, Window w) {
  check_range(q_range, "q_range");
  check_range(k_range, "k_range");
  return window_slices_from(q_range, k_range, w,
                            first_aligned_row(q_range.size(), k_range.size()));
}

Mask sliding_window(std::int64_t seqlen_q, std::int64_t seqlen_k, Window w) {
  check_len(seqlen_q, "seqlen_q");
  check_len(seqlen_k, "seqlen_k");
  return Mask(seqlen_q, seqlen_k, window_slices({0, seqlen_q}, {0, seqlen_k}, w));
}

// With G globals the keys split at G so that no two slices' rectangles overlap: the window
// over keys [G, sk) (both blocks end at sk, so the bottom-right alignment is the document's)
// and, left of it, row i's global keys [0, min(G, i + c + 1)): CAUSAL while that end steps,
// FULL once it reaches G. An unbounded left side already covers the globals.
Mask varlen_sliding_window(Span cu_seqlens_q, Span cu_seqlens_k, Window w,
                           std::int64_t num_global) {
  check_pair(cu_seqlens_q, cu_seqlens_k);
  check_len(num_global, "num_global");
  std::vector<Slice> slices;
  for (std::size_t d = 0; d + 1 < cu_seqlens_q.size(); ++d) {
    const Range q{cu_seqlens_q[d], cu_seqlens_q[d + 1]};
    const Range k{cu_seqlens_k[d], cu_seqlens_k[d + 1]};
    const std::int64_t sq = q.size(), sk = k.size(), g = std::min(num_global, sk);
    const std::int64_t first_row = first_aligned_row(sq, sk);
    const WindowEdges e = window_edges(sq, sk, w);
    if (g == 0 || sq == 0 || e.left_open) {
      const std::vector<Slice> doc = window_slices_from(q, k, w, first_row);
      slices.insert(slices.end(), doc.begin(), doc.end());
      continue;
    }
    std::vector<Slice> global;
    const std::int64_t step_begin =
        std::max(first_row, e.right_open ? std::int64_t{0} : clamp64(-e.c, 0, sq));
    const std::int64_t full_begin =
        std::max(step_begin, e.right_open ? std::int64_t{0} : clamp64(g - 1 - e.c, 0, sq));
    if (step_begin < full_begin) {  // row i sees [0, i + c + 1), which stays below G here
      global.push_back({{q.start + step_begin, q.start + full_begin},
                        {k.start, k.start + full_begin + e.c},
                        MaskType::kCausal});
    }
    push_nonempty(global, {q.start + full_begin, q.end}, {k.start, k.start + g}, MaskType::kFull);
    global = tidy(std::move(global));
    slices.insert(slices.end(), global.begin(), global.end());
    const std::vector<Slice> window = window_slices_from(q, {k.start + g, k.end}, w, first_row);
    slices.insert(slices.end(), window.begin(), window.end());
  }
  return Mask(cu_seqlens_q.back(), cu_seqlens_k.back(), std::move(slices));
}

Mask varlen_sliding_window(Span cu_seqlens, Window w, std::int64_t num_global) {
  return varlen_sliding_window(cu_seqlens, cu_seqlens, w, num_global);
}

Mask block_causal(std::int64_t seqlen, std::int64_t block) {
  check_len(seqlen, "seqlen");
  check_block(block, "block");
  const std::int64_t cu[] = {0, seqlen};
  return varlen_block_causal(cu, block);
}

Mask varlen_block_causal(Span cu_seqlens, std::int64_t block, bool last_block_global) {
  check_cu_seqlens(cu_seqlens, "cu_seqlens");
  check_block(block, "block");
  const std::int64_t total = cu_seqlens.back();
  std::vector<Slice> slices;
  for (std::size_t d = 0; d + 1 < cu_seqlens.size(); ++d) {
    const std::int64_t doc_start = cu_seqlens[d], doc_end = cu_seqlens[d + 1];
    for (std::int64_t b = doc_start, b_end = 0; b < doc_end; b = b_end) {
      b_end = b + std::min(block, doc_end - b);
      const bool global = last_block_global && b_end == doc_end;
      slices.push_back(
          {{b, b_end}, global ? Range{0, total} : Range{doc_start, b_end}, MaskType::kFull});
    }
  }
  return Mask(total, total, std::move(slices));
}

Mask prefix_lm(std::int64_t seqlen, std::int64_t prefix_len) {
  check_len(seqlen, "seqlen");
  check_len(prefix_len, "prefix_len");
  MAGI_CHECK(prefix_len <= seqlen, "prefix_len ", prefix_len, " exceeds seqlen ", seqlen);
  std::vector<Slice> slices;
  push_nonempty(slices, {0, prefix_len}, {0, prefix_len}, MaskType::kFull);
  // Row q >= P sees [0, q]: CAUSAL over k [0, seqlen) with sq = seqlen - P gives j <= q.
  push_nonempty(slices, {prefix_len, seqlen}, {0, seqlen}, MaskType::kCausal);
  return Mask(seqlen, seqlen, tidy(std::move(slices)));
}

Mask shared_question(std::int64_t question_len, Span answer_lens) {
  check_len(question_len, "question_len");
  std::int64_t total = question_len;
  for (std::size_t a = 0; a < answer_lens.size(); ++a) {
    MAGI_CHECK(answer_lens[a] >= 0, "answer_lens[", a, "] is negative (", answer_lens[a], ")");
    total += answer_lens[a];
  }
  std::vector<Slice> slices;
  push_nonempty(slices, {0, question_len}, {0, question_len}, MaskType::kCausal);
  std::int64_t start = question_len;
  for (std::int64_t len : answer_lens) {
    const Range ans{start, start + len};
    push_nonempty(slices, ans, {0, question_len}, MaskType::kFull);
    push_nonempty(slices, ans, ans, MaskType::kCausal);
    start += len;
  }
  return Mask(total, total, std::move(slices));
}

// Consecutive block rows with identical runs also fuse vertically: a dense block mask is one
// slice, and the slices stay aligned to the block grid.
Mask block_sparse(std::span<const std::uint8_t> block_mask, std::int64_t seqlen_q,
                  std::int64_t seqlen_k, std::int64_t block_q, std::int64_t block_k) {
  check_len(seqlen_q, "seqlen_q");
  check_len(seqlen_k, "seqlen_k");
  check_block(block_q, "block_q");
  check_block(block_k, "block_k");
  const std::int64_t nqb = (seqlen_q + block_q - 1) / block_q;
  const std::int64_t nkb = (seqlen_k + block_k - 1) / block_k;
  const auto size = static_cast<std::int64_t>(block_mask.size());
  MAGI_CHECK((nkb == 0 ? size == 0 : size % nkb == 0 && size / nkb == nqb), "block_mask has ", size,
             " entries but needs ", nqb, " x ", nkb,
             " (ceil(seqlen_q / block_q) x ceil(seqlen_k / block_k))");
  std::vector<Slice> slices;
  std::vector<Range> prev_runs, runs;
  std::size_t prev_first = 0;  // index in slices of the previous block row's first run
  for (std::int64_t qb = 0; qb < nqb; ++qb) {
    runs.clear();
    const std::uint8_t* row = block_mask.data() + qb * nkb;
    for (std::int64_t kb = 0; kb < nkb;) {
      if (!row[kb]) {
        ++kb;
        continue;
      }
      const std::int64_t run_start = kb;
      while (kb < nkb && row[kb]) ++kb;
      runs.push_back({run_start * block_k, std::min(kb * block_k, seqlen_k)});
    }
    const Range q{qb * block_q, std::min((qb + 1) * block_q, seqlen_q)};
    if (qb > 0 && !runs.empty() && runs == prev_runs) {
      for (std::size_t r = 0; r < runs.size(); ++r) slices[prev_first + r].q_range.end = q.end;
      continue;
    }
    prev_first = slices.size();
    for (Range k : runs) slices.push_back({q, k, MaskType::kFull});
    std::swap(prev_runs, runs);
  }
  return Mask(seqlen_q, seqlen_k, std::move(slices));
}

Mask block_sparse_topk(Span indices, std::int64_t topk, std::int64_t seqlen_q,
                       std::int64_t seqlen_k, std::int64_t block_q, std::int64_t block_k) {
  check_len(topk, "topk");
  check_len(seqlen_q, "seqlen_q");
  check_len(seqlen_k, "seqlen_k");
  check_block(block_q, "block_q");
  check_block(block_k, "block_k");
  const std::int64_t nqb = (seqlen_q + block_q - 1) / block_q;
  const std::int64_t nkb = (seqlen_k + block_k - 1) / block_k;
  const auto size = static_cast<std::int64_t>(indices.size());
  MAGI_CHECK((topk == 0 ? size == 0 : size % topk == 0 && size / topk == nqb), "indices has ", size,
             " entries but needs ", nqb, " x ", topk, " (ceil(seqlen_q / block_q) x topk)");
  std::vector<std::uint8_t> block_mask(static_cast<std::size_t>(nqb * nkb), 0);
  for (std::int64_t qb = 0; qb < nqb; ++qb) {
    for (std::int64_t t = 0; t < topk; ++t) {
      const std::int64_t id = indices[qb * topk + t];
      if (id == -1) continue;
      MAGI_CHECK(id >= 0 && id < nkb, "indices[", qb, ", ", t, "] = ", id, " is out of range [0, ",
                 nkb, ") (use -1 for padding)");
      std::uint8_t& cell = block_mask[qb * nkb + id];
      MAGI_CHECK(!cell, "indices[", qb, ", ", t, "] = ", id, " repeats a k-block of q-block ", qb);
      cell = 1;
    }
  }
  return block_sparse(block_mask, seqlen_q, seqlen_k, block_q, block_k);
}

}  // namespace magi::masks
