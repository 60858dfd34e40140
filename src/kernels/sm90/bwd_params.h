// Plain parameters of the sm90 backward (host and device see the same struct). Strides are in
// elements; every tensor's last dim is unit-stride (attention.cc checks it).
//
// The backward runs in three launches on the caller's stream (backward.cu):
// 1. bwd_rows: per (query row, q head) Delta = rowsum(out * dout) and lse in log2 units, into
//    head-major fp32 rows of the workspace, and the flags of q / dout rows holding a NaN/inf (a
//    memset before it zeroes the dq accumulator, the turn counters and the flags).
// 2. the main kernel (bwd_kernel.cuh): one CTA per (key tile, kv head) item, over every q head
//    of the group and every query block of the tile's pieces; dK, dV in registers, written
//    once by their owner; dQ added into the fp32 accumulator with bulk reductions.
// 3. the dq pass (bwd_kernel.cuh): dq = scale * accumulator (+ the given dq under
//    accumulate), in dq's dtype; and dsink (backward.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fwd_params.h"  // OutType, Tile, Piece
#include "work_list.h"

namespace magi::kernels::sm90 {

// Tile of the backward: query blocks of 64 rows; 128 keys per CTA (64 per consumer warpgroup)
// at D <= 128; 64 keys at D 192 and 256, where both consumer warpgroups own them, each with half
// of D of dK and dV (bwd_split_d: 64 keys x D of both in fp32 do not fit one warpgroup).
constexpr bool bwd_split_d(int head_dim) { return head_dim > 128; }
constexpr int bwd_block_n(int head_dim) { return bwd_split_d(head_dim) ? 64 : 128; }
constexpr int bwd_block_m(int) { return 64; }

// The fp32 dq accumulator holds, per q head and block of 64 rows (blocks on the grid of 64
// rows), 64 x D floats as two chunks, each consumer warpgroup's half of D (over all the tile's
// keys), in the dQ product's fragment order (element 4 v + e of thread t at float
// (v * 128 + t) * 4 + e). The main kernel adds a chunk with one bulk reduction, the dq pass reads
// it back through the same partition.
constexpr int bwd_dq_chunk(int head_dim) { return 64 * head_dim / 2; }

// The per-call workspace, 16-byte aligned pieces: the scheduler's counter, lse (log2 units)
// and Delta as [Hq][rows_pad] fp32 (rows padded to whole query blocks, the padding lse +inf so
// that P = 0 there), then the dq accumulator [Hq][rows_pad / 64][64 * D] (above), then the
// row flags q_bad, a 64-bit word per q head and block (bit r: row 64 b + r of q or dout holds
// a NaN/inf), and the deterministic mode's int32 turn counters [Hq][rows_pad / 64]; the three
// zeroed by one memset per call. In all 16 + 4 Hq R (D + 2) + 12 Hq R / 64 bytes, R = rows_pad
// (attention.h).
struct BwdWorkspaceLayout {
  std::size_t lse_off = 16, delta_off = 0, dq_off = 0, q_bad_off = 0, turns_off = 0, bytes = 0;
  std::int64_t rows_pad = 0;
};
constexpr BwdWorkspaceLayout bwd_workspace_layout(std::int64_t num_q, std::int64_t heads_q,
                                                  std::int64_t head_dim) {
  BwdWorkspaceLayout l;
  l.rows_pad = (num_q + 63) / 64 * 64;
  const std::size_t rows = std::size_t(l.rows_pad) * std::size_t(heads_q) * 4;
  const std::size_t blocks = std::size_t(l.rows_pad / 64) * std::size_t(heads_q);
  l.delta_off = l.lse_off + (rows + 15) / 16 * 16;
  l.dq_off = l.delta_off + (rows + 15) / 16 * 16;
  l.q_bad_off = l.dq_off + rows * std::size_t(head_dim);
  l.turns_off = l.q_bad_off + blocks * 8;
  l.bytes = l.turns_off + blocks * 4;
  return l;
}

struct BwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const void* dout = nullptr;
  const float* lse_in = nullptr;  // the forward's lse [Nq][Hq] (strided)
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  std::int64_t q_row, q_head, k_row, k_head, v_row, v_head, o_row, o_head, do_row, do_head;
  std::int64_t lse_row, lse_head, dq_row, dq_head, dk_row, dk_head, dv_row, dv_head;
  OutType dq_type = OutType::kBF16, dk_type = OutType::kBF16, dv_type = OutType::kBF16;
  std::int32_t num_q = 0, num_k = 0, heads_q = 0, heads_kv = 0;
  float scale = 0;          // softmax scale
  float softcap = 0;        // logit cap c (0: none): l = c tanh(scale * q.k / c)
  bool accumulate = false;  // dq, dk, dv (fp32) hold partial gradients to add to
  bool dkv_pairs = false;   // dk's and dv's strides and pointers let two adjacent columns go as one store
  bool dq_vec = false;      // dq's strides and pointer let 8 adjacent columns go as 16-byte stores
  // Deterministic mode: each block's dq chunk is added in a fixed order, its turn (a ticket of
  // the work image, device_work.h) awaited on the block's counter.
  bool deterministic = false;
  const std::int32_t* tickets = nullptr;
  std::int32_t* turns = nullptr;  // [Hq][rows_pad / 64]
  // Rows of q or dout with a NaN/inf, a word per q head and block of 64 rows (the row pass).
  unsigned long long* q_bad = nullptr;  // [Hq][rows_pad / 64]
  // Work list (key tiles, TileAxis::kKey) on the device and the scheduler's counter.
  const Tile* tiles = nullptr;
  const Piece* pieces = nullptr;
  std::int32_t num_tiles = 0;
  std::int32_t* counter = nullptr;
  // Workspace rows: lse * log2(e) and Delta, [Hq][rows_pad]; the fp32 dq accumulator.
  float* lse2 = nullptr;
  float* delta = nullptr;
  std::int64_t rows_pad = 0;
  float* dq_acc = nullptr;  // [Hq][rows_pad / 64][64 * D] in chunks (above)
};

}  // namespace magi::kernels::sm90
