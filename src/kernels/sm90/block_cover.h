// Which key blocks of a piece a run of query rows sees whole (no element mask), on the host
// (tests/unit) and in the forward and backward kernels. Every slice type is a band
// lo <= k - q <= hi (work_list.h), so for fixed rows the blocks seen whole form one interval.
#pragma once

#include "work_list.h"

#if defined(__CUDACC__)
#define MAGI_HOST_DEVICE __host__ __device__
#else
#define MAGI_HOST_DEVICE
#endif

namespace magi::kernels::sm90 {

// Whether the piece covers every cell of the block for rows [r0, r0 + rows): no element mask.
MAGI_HOST_DEVICE inline bool covers(const Piece& pc, int r0, int rows, int kb, int block_n) {
  return r0 >= pc.q0 && r0 + rows <= pc.q1 && kb >= pc.k0 && kb + block_n <= pc.k1 &&
         kb - (r0 + rows - 1) >= pc.lo && kb + block_n - 1 - r0 <= pc.hi;
}

// The longest run the forward's block info carries (BlockInfo::kRunShift).
inline constexpr int kMaxUnmaskedRun = 1 << 22;

// The blocks right after block kb of piece pc (kb, kb + block_n, ... up to k1) that the rows
// [r0, r0 + rows) see whole, none of them the tile's last block (last_piece: pc is the tile's
// last piece, whose last block is the tile's), at most kMaxUnmaskedRun: the forward's
// consumers run those blocks without reading their info. No sum here passes the int range
// (make_work_list checks the lengths; hi is up to kBandClamp).
MAGI_HOST_DEVICE inline int unmasked_run(const Piece& pc, int r0, int rows, int kb, int block_n,
                                         bool last_piece) {
  if (r0 < pc.q0 || r0 + rows > pc.q1) return 0;
  // One past the last key a run's block may reach: k1, or k1 - 1 in the tile's last piece (its
  // last block has kb + block_n >= k1), or where the band's top edge leaves row r0 (only where
  // that is below k1, so hi + r0 + 1 does not overflow).
  int end = pc.k1 - (last_piece ? 1 : 0);
  if (pc.hi < pc.k1 - 1 - r0 && pc.hi + r0 + 1 < end) end = pc.hi + r0 + 1;
  // The next block (kb + block_n) must start past the band's bottom edge for the last row and
  // end by `end`; the covered blocks after it follow on to `end`.
  if (kb - r0 + (block_n - rows + 1) < pc.lo || kb > end - 2 * block_n) return 0;
  const int n = (end - 2 * block_n - kb) / block_n + 1;
  return n < kMaxUnmaskedRun ? n : kMaxUnmaskedRun;
}

}  // namespace magi::kernels::sm90
