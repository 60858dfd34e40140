// Benchmark mask families by name (docs/semantics.md §4): each entry is a few lines over
// mask_builders.h. The decisions live here: defaults (window 1024, block 2048, 128x128 sparse
// blocks at 10%), documents drawn from the histogram with the spec's cap, and block-sparse rows
// that all see the same number of key blocks, as top-k sparse attention does, so no query row is
// empty.
#include "magi/mask_families.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "magi/error.h"
#include "magi/mask_builders.h"
#include "portable_random.h"

namespace magi {
namespace {

constexpr std::int64_t kBlockCausalBlock = 2048;
constexpr std::int64_t kBlockSparseBlock = 128;

std::int64_t block_or(const FamilySpec& s, std::int64_t fallback) {
  MAGI_CHECK(s.block >= 0, "mask family '", s.family, "': block ", s.block, " is negative");
  return s.block > 0 ? s.block : fallback;
}

std::int64_t prefix_of(const FamilySpec& s) {
  const std::int64_t prefix = s.prefix_len > 0 ? s.prefix_len : s.seqlen / 4;
  MAGI_CHECK(prefix <= s.seqlen, "mask family '", s.family, "': prefix length ", prefix,
             " exceeds seqlen ", s.seqlen);
  return prefix;
}

// Lengths of documents packed into `total` tokens, each capped at seqlen / 4 unless told.
std::vector<std::int64_t> doc_lengths(const FamilySpec& s, std::int64_t total) {
  const std::int64_t cap =
      s.max_doc_len > 0 ? s.max_doc_len : std::max<std::int64_t>(1, s.seqlen / 4);
  return sample_doc_lengths(s.doc_lengths ? *s.doc_lengths : DocLengthHistogram::builtin(), total,
                            cap, s.seed);
}

std::vector<std::int64_t> doc_cu_seqlens(const FamilySpec& s) {
  return cu_seqlens_from_lengths(doc_lengths(s, s.seqlen));
}

Mask sliding_window(const FamilySpec& s) {
  MAGI_CHECK(s.window >= 0, "mask family 'sliding-window': window ", s.window, " is negative");
  return masks::varlen_sliding_window(doc_cu_seqlens(s), masks::Window{s.window, 0});
}

Mask shared_question(const FamilySpec& s) {
  const std::int64_t question = prefix_of(s);
  return masks::shared_question(question, doc_lengths(s, s.seqlen - question));
}

Mask block_sparse(const FamilySpec& s) {
  MAGI_CHECK(s.density > 0 && s.density <= 1, "mask family 'block-sparse': density ", s.density,
             " must be in (0, 1]");
  const std::int64_t block = block_or(s, kBlockSparseBlock);
  const std::int64_t num_blocks = (s.seqlen + block - 1) / block;
  const std::int64_t per_row =
      std::clamp<std::int64_t>(std::llround(s.density * double(num_blocks)), 1, num_blocks);

  std::mt19937_64 rng(s.seed);
  std::vector<std::uint8_t> block_mask(num_blocks * num_blocks, 0);
  std::vector<std::int64_t> ids(num_blocks);
  for (std::int64_t q_idx = 0; q_idx < num_blocks; ++q_idx) {
    // A partial Fisher-Yates shuffle: the first per_row ids are a uniform sample.
    std::iota(ids.begin(), ids.end(), 0);
    for (std::int64_t i = 0; i < per_row; ++i) {
      std::swap(ids[i], ids[i + std::int64_t(detail::uniform_below(rng, num_blocks - i))]);
      block_mask[q_idx * num_blocks + ids[i]] = 1;
    }
  }
  return masks::block_sparse(block_mask, s.seqlen, s.seqlen, block, block);
}

struct Family {
  std::string_view name;
  Mask (*build)(const FamilySpec&);
};

constexpr Family kFamilies[] = {
    {"full", [](const FamilySpec& s) { return masks::full(s.seqlen, s.seqlen); }},
    {"causal", [](const FamilySpec& s) { return masks::causal(s.seqlen, s.seqlen); }},
    {"varlen-full", [](const FamilySpec& s) { return masks::varlen_full(doc_cu_seqlens(s)); }},
    {"varlen-causal", [](const FamilySpec& s) { return masks::varlen_causal(doc_cu_seqlens(s)); }},
    {"sliding-window", sliding_window},
    {"varlen-block-causal",
     [](const FamilySpec& s) {
       return masks::varlen_block_causal(doc_cu_seqlens(s), block_or(s, kBlockCausalBlock));
     }},
    {"block-causal",
     [](const FamilySpec& s) {
       return masks::block_causal(s.seqlen, block_or(s, kBlockCausalBlock));
     }},
    {"shared-prefix", shared_question},
    {"shared-question", shared_question},
    {"prefix-lm", [](const FamilySpec& s) { return masks::prefix_lm(s.seqlen, prefix_of(s)); }},
    {"block-sparse", block_sparse},
};

std::string joined_names() {
  std::string names;
  for (const auto& f : kFamilies) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names;
}

}  // namespace

const std::vector<std::string_view>& family_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const auto& f : kFamilies) v.push_back(f.name);
    return v;
  }();
  return names;
}

Mask build_family(const FamilySpec& spec) {
  const auto* family = std::find_if(std::begin(kFamilies), std::end(kFamilies),
                                    [&](const Family& f) { return f.name == spec.family; });
  MAGI_CHECK(family != std::end(kFamilies), "unknown mask family '", spec.family,
             "' (valid: ", joined_names(), ")");
  MAGI_CHECK(spec.seqlen > 0, "mask family '", spec.family, "': seqlen ", spec.seqlen,
             " must be positive");
  return family->build(spec);
}

}  // namespace magi
