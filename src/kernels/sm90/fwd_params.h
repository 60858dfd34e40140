// Plain parameters of the sm90 forward kernel (host and device see the same struct). Strides
// are in elements; every tensor's last dim is unit-stride (attention.cc checks it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "work_list.h"

namespace magi::kernels::sm90 {

enum class OutType : std::int32_t { kBF16, kF16, kF32 };

// CTA tile, shared by the host (work list tiles) and the kernel: 64 query rows per consumer
// warpgroup, key blocks of 128 (fewer above D 128: fwd_block_n). Two consumer warpgroups
// (128-row tiles), but three at D 64 (192-row tiles): its GEMMs are half as long per softmax
// as at D 128, so a third warpgroup's softmax keeps the tensor cores fed (measured +1-4 % on
// full/causal, +9 % on varlen causal at 16k/32k). 128-key blocks there too: with 96 the
// per-block work (waits, descriptors, row reductions) was spread over fewer keys, and 128
// measured +2-6 % over 96, despite a few spilled registers in the loop. A 64-row tile on one
// warpgroup with 2 CTAs per SM was measured slower at D 128 and equal at D 64
// (docs/benchmarks.md).
constexpr int fwd_consumer_warpgroups(int head_dim) { return head_dim == 64 ? 3 : 2; }
constexpr int fwd_block_m(int head_dim) { return 64 * fwd_consumer_warpgroups(head_dim); }
// The softmax rewrites S per element (softcap, or a negative scale) in a separate kernel, so
// the plain one carries none of that code's registers (it runs without spills).
inline bool fwd_rewrite(float scale, float softcap) { return softcap > 0.f || scale < 0.f; }
// Keys per block: 128 up to D 128; 96 at D 192 (two K/V stages instead of three with 64, and
// +11-13 % over 64 on full and causal 16k/32k); 64 at D 256 (80, with two stages both ways,
// measured 0.65-0.74x cuDNN against 64's 0.90-1.02x). docs/benchmarks.md has the A/Bs.
constexpr int fwd_block_n(int head_dim) {
  return head_dim > 192 ? 64 : head_dim > 128 ? 96 : 128;
}

// Words of NaN/inf row flags a key block spans (32 keys per word, blocks of at most 128 keys).
inline constexpr int kBadWords = 4;

// The stale word's value for the call after `epoch`: an odd multiplier and a constant make it
// a bijection with no small or regular fixed values (constexpr: the kernels call it too).
constexpr unsigned long long fwd_stale_mark(unsigned long long epoch) {
  return (epoch + 1) * 0x9E3779B97F4A7C15ull + 0x5851F42D4C957F2Dull;
}

// The per-call workspace (attention.h FwdArgs::workspace), in 16-byte aligned pieces: the
// scheduler's counter and the count of finished CTAs (int32 each), the call count (u64), the
// stale-ranges word (u64), one "some row flagged" word per kv head, then bad_words row-flag
// words per kv head (one bit per key row, kBadWords + 1 words of padding for the blocks'
// reads). Nothing is zeroed on the host: the pre-pass zeroes both counters,
// overwrites every flag word, sets the "some row flagged" word of each head with a flagged row
// and marks the stale word with the call's mark (fwd_stale_mark); the kernel's last CTA to
// finish clears the "some row flagged" words and adds 1 to the epoch. So any initial content
// gives exact results: a "some row flagged" word left nonzero only costs the per-row check,
// and the stale word of a fresh buffer holds its epoch's mark only by a 2^-64 chance (a mixed
// value, so that leftover data such as an int64 -1 followed by 0 does not look like one).
struct FwdWorkspaceLayout {
  std::size_t done_off = 4, epoch_off = 8, stale_off = 16, any_off = 32, flags_off = 0,
              bytes = 0;
  std::int32_t bad_words = 0;
};
constexpr FwdWorkspaceLayout fwd_workspace_layout(std::int64_t num_k, std::int64_t heads_kv) {
  FwdWorkspaceLayout l;
  l.flags_off = (l.any_off + std::size_t(heads_kv) * 4 + 15) / 16 * 16;
  l.bad_words = std::int32_t((num_k + 31) / 32) + kBadWords + 1;
  l.bytes = l.flags_off + std::size_t(l.bad_words) * std::size_t(heads_kv) * 4;
  return l;
}

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  float* max_logits = nullptr;  // nullptr: not requested
  const float* sink = nullptr;  // nullptr: no sink
  std::int64_t q_row, q_head, k_row, k_head, v_row, v_head, o_row, o_head, lse_row, lse_head;
  std::int64_t sink_row = 0, sink_s = 0, sink_head = 0;  // sink_row 0: per head ("sh")
  std::int32_t sink_len = 0;
  std::int32_t num_q = 0, num_k = 0, heads_q = 0, heads_kv = 0;
  float scale = 0;       // softmax scale
  float softcap = 0;     // 0: off
  OutType out_type = OutType::kBF16;
  bool accumulate = false;  // out (fp32) and lse hold a partial result to merge with
  bool out_pairs = false;   // out's strides and pointer let two adjacent columns go as one store
  bool out_rows16 = false;  // 16-bit out whose strides and pointer let 8 columns go as one 16-byte store
  // Work list on the device, and the persistent scheduler's counter.
  const Tile* tiles = nullptr;
  const Piece* pieces = nullptr;
  std::int32_t num_tiles = 0;
  std::int32_t* counter = nullptr;
  // The workspace's bookkeeping (FwdWorkspaceLayout): finished CTAs and the call count.
  unsigned* done = nullptr;
  unsigned long long* epoch = nullptr;
  // Per kv head, one bit per key row: its K or V row holds a NaN/inf (docs/numerics.md),
  // written by a pass over K and V before the kernel; bad_words words per head (padded), and
  // bad_any[head] != 0 when some row of the head may be flagged (so clean heads skip the bits).
  const unsigned* bad_rows = nullptr;
  unsigned* bad_any = nullptr;
  std::int32_t bad_words = 0;
  // fwd_stale_mark(*epoch) when the caller's device ranges differ from the prepared ones (the
  // pre-pass compares them, attention.h DeviceRanges): every out, lse and max_logits element
  // is NaN.
  const unsigned long long* stale = nullptr;
};

// What the pre-pass compares: the caller's ranges and the prepared copy, int32 [N][5] (q0, q1,
// k0, k1, type) per slice.
struct RangeCheck {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* types = nullptr;  // null: every slice full
  std::int32_t range_bytes = 4, type_bytes = 4, count = 0;
  const std::int32_t* expect = nullptr;
  unsigned long long* stale = nullptr;
};

}  // namespace magi::kernels::sm90
