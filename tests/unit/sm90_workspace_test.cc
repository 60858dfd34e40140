// The sm90 forward's per-call workspace (src/kernels/sm90/fwd_params.h): the pieces the
// pre-pass and the kernel share are 16-byte aligned and disjoint, the row flags cover every
// key block a kernel reads (with its padding), and the stale word's mark of an epoch is never
// a value that leftover data plausibly holds at that offset, nor the mark of a nearby epoch.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "kernels/sm90/fwd_params.h"

namespace magi::kernels::sm90 {
namespace {

TEST(Sm90Workspace, PiecesAreAlignedDisjointAndCoverEveryKeyBlock) {
  for (std::int64_t num_k : {0, 1, 31, 32, 33, 127, 128, 4096, 65537}) {
    for (std::int64_t heads_kv : {1, 2, 3, 8, 64}) {
      SCOPED_TRACE("Nk " + std::to_string(num_k) + ", Hkv " + std::to_string(heads_kv));
      const FwdWorkspaceLayout l = fwd_workspace_layout(num_k, heads_kv);
      EXPECT_EQ(l.epoch_off % 8, 0u);
      EXPECT_EQ(l.stale_off % 8, 0u);
      EXPECT_EQ(l.any_off % 16, 0u);
      EXPECT_EQ(l.flags_off % 16, 0u);
      // counter [0, 4), done [4, 8), epoch [8, 16), stale [16, 24), any, flags: in this order
      EXPECT_GE(l.done_off, 4u);
      EXPECT_GE(l.epoch_off, l.done_off + 4);
      EXPECT_GE(l.stale_off, l.epoch_off + 8);
      EXPECT_GE(l.any_off, l.stale_off + 8);
      EXPECT_GE(l.flags_off, l.any_off + std::size_t(heads_kv) * 4);
      // A key block starting at the last key reads kBadWords words past its first one.
      EXPECT_GE(std::int64_t(l.bad_words), (num_k + 31) / 32 + kBadWords);
      EXPECT_EQ(l.bytes, l.flags_off + std::size_t(l.bad_words) * std::size_t(heads_kv) * 4);
    }
  }
}

TEST(Sm90Workspace, StaleMarksAreDistinctAndIrregular) {
  // Epochs a fresh buffer's words could hold (0, all ones, small counts) and the calls after
  // them: no mark equals a "regular" value, and consecutive epochs have different marks.
  const std::uint64_t regular[] = {0, 1, ~0ull, ~0ull - 1, 0xffffffffull, 0x100000000ull};
  std::set<std::uint64_t> marks;
  for (std::uint64_t base : {1000ull, ~0ull - 99, 0xffffffffull - 100}) {  // one wraps to 0
    for (std::uint64_t e = base; e != base + 200; ++e) {
      const std::uint64_t m = fwd_stale_mark(e);
      for (std::uint64_t r : regular) EXPECT_NE(m, r) << "epoch " << e;
      marks.insert(m);
    }
  }
  EXPECT_EQ(marks.size(), 600u);
  static_assert(fwd_stale_mark(5) != fwd_stale_mark(6));  // usable in device code: constexpr
}

}  // namespace
}  // namespace magi::kernels::sm90
