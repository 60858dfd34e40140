// The NCCL communicator's device side: packing rows into per-peer messages, unpacking them, and
// the reductions of layout.cc's combine() on the GPU. Every kernel walks a table of segments in
// device memory (the caller uploads it on the same stream); a segment is a 2-D block of rows:
// `rows` rows of `width` bytes, src rows `src_pitch` bytes apart, dst rows `dst_pitch` apart.
// A RowRange of one column is one segment; a message of two columns (out, lse) interleaves them
// per row, which a pitch expresses without one segment per row.
//
// Bits: sums and maxes are layout.cc's, operation for operation (explicitly rounded adds and
// multiplies, never contracted into an FMA); so are merges, except that exp / log1p come from
// CUDA's math library, not glibc's, and may differ in the last bit. NaN payloads may differ too
// (the GPU's arithmetic returns its canonical NaN).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "magi/dtype.h"

namespace magi::comm::nccl {

struct Segment {
  const unsigned char* src = nullptr;
  unsigned char* dst = nullptr;
  std::int64_t src_pitch = 0, dst_pitch = 0;
  std::int64_t width = 0;  // bytes per row
  std::int64_t rows = 0;
  double scale = 1.0;      // kSum: contribution multiplier (kAvg's 1 / number of sources)
};

// A message of lse-merge rows: per row, heads * d elements of out then heads of lse.
struct LseSegment {
  const unsigned char* src = nullptr;
  unsigned char* out = nullptr;  // output out rows (heads * d elements each, contiguous)
  unsigned char* lse = nullptr;  // output lse rows (heads elements each, contiguous)
  std::int64_t src_pitch = 0;    // bytes per message row
  std::int64_t rows = 0;
};

enum class RowOp : std::uint8_t { kCopy, kSum, kMax };

// `n` segments at `segments` (device memory); `max_bytes`: the largest rows * width among them
// (sizes the grid). kSum / kMax treat the bytes as `dtype` (fp32 or fp64) elements: dst = dst +
// src (* scale when scale != 1), dst = nan_max(dst, src). Segments must not overlap in dst.
void launch_rows(RowOp op, DType dtype, const Segment* segments, int n, std::int64_t max_bytes,
                 cudaStream_t stream);

// layout.cc's lse_merge of every (row, head) of `n` segments into (out, lse).
void launch_lse_merge(DType dtype, const LseSegment* segments, int n, std::int64_t max_rows,
                      std::int64_t heads, std::int64_t d, cudaStream_t stream);

}  // namespace magi::comm::nccl
