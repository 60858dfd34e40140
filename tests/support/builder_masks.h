// Masks of every builder of docs/semantics.md §1, drawn by index from a seeded generator (the
// same on every rank), for the distributed runtime's tests on the host and on the GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "attn_case.h"
#include "magi/mask.h"
#include "magi/mask_builders.h"

namespace magi::testing {

// Document boundaries 0 = cu[0] < ... < cu.back() = n of random lengths.
inline std::vector<std::int64_t> random_cu(std::mt19937_64& rng, std::int64_t n) {
  std::vector<std::int64_t> cu{0};
  while (cu.back() < n)
    cu.push_back(std::min(n, cu.back() + 1 + std::int64_t(rng() % std::uint64_t(n / 2 + 1))));
  return cu;
}

// Every builder of docs/semantics.md §1 by index (kNumBuilderMasks - 1: a random mask with overlapping q
// ranges and all four slice types); every rank draws the same one.
inline constexpr int kNumBuilderMasks = 15;

inline Mask builder_mask(int kind, std::mt19937_64& rng, std::int64_t n, std::int64_t chunk) {
  switch (kind) {
    case 0: return masks::full(n, n);
    case 1: return masks::causal(n, n);
    case 2: return masks::varlen_full(random_cu(rng, n));
    case 3: return masks::varlen_causal(random_cu(rng, n));
    case 4: return masks::sliding_window(n, n, {3, 1});
    case 5: return masks::varlen_sliding_window(random_cu(rng, n), {4, 0}, 2);
    case 6: return masks::block_causal(n, 3);
    case 7: return masks::varlen_block_causal(random_cu(rng, n), 3, true);
    case 8: return masks::prefix_lm(n, n / 3);
    case 9: {  // overlapping q ranges: every answer sees the shared question
      const std::int64_t question = n / 3, a = (n - question) / 2;
      const std::vector<std::int64_t> answers{a, n - question - a};
      return masks::shared_question(question, answers);
    }
    case 10: {  // block-sparse from a random block mask (blocks of 3, last block short)
      const std::int64_t nb = (n + 2) / 3;
      std::vector<std::uint8_t> blocks(std::size_t(nb * nb));
      for (auto& b : blocks) b = rng() % 3 == 0;
      return masks::block_sparse(blocks, n, n, 3, 3);
    }
    case 11: {  // block-sparse from top-k indices, with -1 padding
      const std::int64_t nb = (n + 3) / 4, topk = std::min<std::int64_t>(2, nb);
      std::vector<std::int64_t> idx;
      for (std::int64_t r = 0; r < nb; ++r) {
        idx.push_back(std::int64_t(rng() % std::uint64_t(nb)));
        if (topk > 1) idx.push_back(rng() % 2 ? -1 : (idx.back() + 1) % nb);
      }
      return masks::block_sparse_topk(idx, topk, n, n, 4, 4);
    }
    case 12: {  // from a dense boolean mask (random rows of intervals)
      std::vector<std::uint8_t> dense(std::size_t(n * n));
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t a = std::int64_t(rng() % std::uint64_t(n)), b = a + 1 + std::int64_t(rng() % std::uint64_t(n - a));
        for (std::int64_t j = a; j < b; ++j) dense[std::size_t(i * n + j)] = 1;
      }
      return masks::from_dense(dense, n, n);
    }
    case 13:  // only the first chunk's rows see anything: most ranks' tokens are all masked
      return Mask(n, n, {Slice{{0, chunk}, {0, n}, MaskType::kFull}});
    default: return testing::random_mask(rng, n, n, 6);
  }
}

}  // namespace magi::testing
