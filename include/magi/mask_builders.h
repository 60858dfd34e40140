// Builders for the masks every user expects (docs/semantics.md §1). Each returns a validated Mask
// whose slices never overlap; each is tested cell by cell against its dense definition. cu_seqlens
// are prefix sums starting at 0 (document i is [cu[i], cu[i+1])).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "magi/mask.h"

namespace magi::masks {

Mask full(std::int64_t seqlen_q, std::int64_t seqlen_k);
Mask causal(std::int64_t seqlen_q, std::int64_t seqlen_k);  // bottom-right aligned

// One slice per document; q and k documents pair up by index.
Mask varlen_full(std::span<const std::int64_t> cu_seqlens_q,
                 std::span<const std::int64_t> cu_seqlens_k);
Mask varlen_causal(std::span<const std::int64_t> cu_seqlens_q,
                   std::span<const std::int64_t> cu_seqlens_k);
Mask varlen_full(std::span<const std::int64_t> cu_seqlens);  // self-attention shorthand
Mask varlen_causal(std::span<const std::int64_t> cu_seqlens);

// Sliding window, bottom-right aligned like CAUSAL: local query i sits at key position
// p = i + (sk - sq) and sees keys j with p - left <= j <= p + right (a negative bound means
// unbounded on that side). (left, 0) is causal sliding window. Rows with p < 0 (the first
// sq - sk rows when sq > sk) see nothing, whatever the window: MagiAttention's rule, so that
// (-1, -1) on a block with more queries than keys is FULL on its last sk rows only.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;
};

// Slices (at most 3, non-overlapping) for a window over one (q_range, k_range) block.
std::vector<Slice> window_slices(Range q_range, Range k_range, Window w);
Mask sliding_window(std::int64_t seqlen_q, std::int64_t seqlen_k, Window w);
// Per document; with num_global > 0 every query with p >= 0 also sees the first num_global
// keys of its document, capped so that a query never sees a global key beyond its window's
// right edge. The slices' rectangles are disjoint (globals and window split the keys at G).
Mask varlen_sliding_window(std::span<const std::int64_t> cu_seqlens_q,
                           std::span<const std::int64_t> cu_seqlens_k, Window w,
                           std::int64_t num_global = 0);
Mask varlen_sliding_window(std::span<const std::int64_t> cu_seqlens, Window w,
                           std::int64_t num_global = 0);

// Block b of size `block` sees keys [0, end of block b) (bidirectional inside a block).
Mask block_causal(std::int64_t seqlen, std::int64_t block);
// Per document; with last_block_global the last block of every document sees all keys of the
// packed sequence (Magi-1's video setting).
Mask varlen_block_causal(std::span<const std::int64_t> cu_seqlens, std::int64_t block,
                         bool last_block_global = false);

// Prefix-LM: the first prefix_len tokens see each other fully, the rest is causal.
Mask prefix_lm(std::int64_t seqlen, std::int64_t prefix_len);
// Shared question (RL with many answers): the question is causal; answer a sees the whole
// question and itself causally, never another answer. Packed as [question, a0, a1, ...].
Mask shared_question(std::int64_t question_len, std::span<const std::int64_t> answer_lens);

// Block-sparse: block_mask is row-major [ceil(sq/block_q), ceil(sk/block_k)], nonzero = visible.
// Runs of visible blocks in a block row become one FULL slice.
Mask block_sparse(std::span<const std::uint8_t> block_mask, std::int64_t seqlen_q,
                  std::int64_t seqlen_k, std::int64_t block_q, std::int64_t block_k);
// Top-k: indices is row-major [num_q_blocks, topk] of k-block ids, -1 = padding; duplicates
// and out-of-range ids are errors.
Mask block_sparse_topk(std::span<const std::int64_t> indices, std::int64_t topk,
                       std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t block_q,
                       std::int64_t block_k);

// Dense boolean mask (row-major [sq, sk], nonzero = visible) to slices: runs of equal rows
// become FULL slices and rows whose interval edges step by one become CAUSAL, INV_CAUSAL or
// BI_CAUSAL slices.
Mask from_dense(std::span<const std::uint8_t> dense, std::int64_t seqlen_q, std::int64_t seqlen_k);
std::vector<std::uint8_t> to_dense(const Mask& mask);

}  // namespace magi::masks
