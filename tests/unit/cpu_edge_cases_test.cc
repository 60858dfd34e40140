// Edge cases of the CPU backend that the forward and the backward must both get right, run
// once per direction (tests/support/cpu_checks.h): empty and length-one ranges, every slice
// type with shorter / equal / longer keys, sizes around the 64- and 256-row tiles, rows shared
// by several slices, rows that see nothing, GQA/MQA and head dims.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>

#include "cpu_checks.h"

namespace magi::testing {
namespace {

class CpuEdgeCases : public ::testing::TestWithParam<Direction> {
 protected:
  void both(const Mask& mask, std::int64_t hq, std::int64_t hkv, std::int64_t d, Config cfg = {},
            std::int64_t sink_len = 0) {
    check_both(GetParam(), mask, hq, hkv, d, cfg, sink_len);
  }
};

TEST_P(CpuEdgeCases, EmptyAndLengthOneRanges) {
  const Mask mask(9, 7, {Slice{{0, 0}, {0, 7}, MaskType::kFull},
                         Slice{{0, 9}, {3, 3}, MaskType::kCausal},
                         Slice{{2, 3}, {0, 1}, MaskType::kFull},
                         Slice{{4, 5}, {1, 7}, MaskType::kCausal},
                         Slice{{5, 9}, {6, 7}, MaskType::kInvCausal},
                         Slice{{6, 7}, {0, 1}, MaskType::kBiCausal}});
  both(mask, 2, 1, 16);
  both(Mask(1, 1, {Slice{{0, 1}, {0, 1}, MaskType::kCausal}}), 1, 1, 8);
}

TEST_P(CpuEdgeCases, EveryTypeWithShorterEqualAndLongerKeys) {
  for (int t = 0; t < 4; ++t)
    for (auto [sq, sk] : {std::pair{37, 61}, {61, 37}, {64, 64}, {1, 9}, {9, 1}, {65, 129}}) {
      SCOPED_TRACE(::testing::Message() << "type " << t << " sq " << sq << " sk " << sk);
      both(one_slice(sq + 7, sk + 9, Slice{{3, 3 + sq}, {5, 5 + sk}, MaskType(t)}), 2, 1, 64);
    }
}

TEST_P(CpuEdgeCases, SizesAroundTileMultiples) {
  const std::int64_t sizes[] = {1, 63, 64, 65, 127, 128, 129};
  for (std::int64_t n : sizes)
    for (std::int64_t m : sizes)
      for (MaskType t : {MaskType::kCausal, MaskType::kInvCausal}) {
        std::mt19937_64 rng(std::uint64_t(n * 1000 + m));
        const Config cfg = config_for(DType::kF32);
        check(GetParam(), one_slice(n, m, Slice{{0, n}, {0, m}, t}),
              random_problem(rng, n, m, 1, 1, 32, cfg), cfg);
      }
  both(one_slice(129, 128, Slice{{1, 129}, {0, 127}, MaskType::kFull}), 2, 2, 64);
  both(one_slice(128, 129, Slice{{0, 65}, {1, 129}, MaskType::kBiCausal}), 2, 2, 64);
}

TEST_P(CpuEdgeCases, QueryRowsSharedBySeveralSlices) {
  // Documents with global tokens: rows 8.. see keys [0, 8) from one slice and their
  // document from another.
  both(Mask(150, 150, {Slice{{0, 150}, {0, 8}, MaskType::kFull},
                       Slice{{8, 70}, {8, 70}, MaskType::kCausal},
                       Slice{{70, 150}, {70, 150}, MaskType::kCausal}}),
       4, 2, 64);
  // A causal triangle and the strict upper triangle as inv_causal tile the full square.
  both(Mask(100, 100, {Slice{{0, 100}, {0, 100}, MaskType::kCausal},
                       Slice{{0, 99}, {1, 100}, MaskType::kInvCausal}}),
       2, 1, 32);
  // Interleaved key ranges of one query block.
  both(Mask(70, 200, {Slice{{0, 70}, {0, 40}, MaskType::kBiCausal},
                      Slice{{0, 70}, {40, 130}, MaskType::kFull},
                      Slice{{10, 70}, {130, 200}, MaskType::kCausal}}),
       2, 1, 64);
}

TEST_P(CpuEdgeCases, RowsThatSeeNothing) {
  // Rows 0-9 are in no slice, 10-19 are the rows a causal slice with sq > sk leaves empty,
  // and 70-74 hold a bi-causal slice with sq > sk, which is empty.
  const Mask mask(80, 50, {Slice{{10, 70}, {0, 50}, MaskType::kCausal},
                           Slice{{70, 75}, {0, 3}, MaskType::kBiCausal}});
  both(mask, 2, 1, 32);
  Config cfg;
  both(mask, 2, 1, 32, cfg, 2);
  cfg.opts.sink_layout = SinkLayout::kSSH;
  both(mask, 2, 1, 32, cfg, 3);
}

TEST_P(CpuEdgeCases, GqaAndMqa) {
  const Mask mask(100, 120, {Slice{{0, 100}, {20, 120}, MaskType::kCausal},
                             Slice{{0, 100}, {0, 10}, MaskType::kFull}});
  for (std::int64_t hkv : {8, 4, 2, 1}) {
    SCOPED_TRACE(::testing::Message() << "hkv " << hkv);
    both(mask, 8, hkv, 32);
  }
}

TEST_P(CpuEdgeCases, HeadDims) {
  const Mask mask(70, 90, {Slice{{0, 70}, {0, 90}, MaskType::kCausal}});
  for (std::int64_t d : {8, 64, 72, 128, 192, 256}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    both(mask, 2, 1, d);
  }
}

INSTANTIATE_TEST_SUITE_P(Directions, CpuEdgeCases,
                         ::testing::Values(Direction::kForward, Direction::kBackward),
                         [](const ::testing::TestParamInfo<Direction>& info) {
                           return std::string(info.param == Direction::kForward ? "Forward"
                                                                                : "Backward");
                         });

}  // namespace
}  // namespace magi::testing
