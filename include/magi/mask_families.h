// The benchmark mask families of docs/semantics.md §4 by name, so that the CLI, the benches and the
// tests build the same masks from the same few numbers. Document-packed families draw their lengths
// from a histogram (the published one by default) with a fixed seed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "magi/doc_lengths.h"
#include "magi/mask.h"

namespace magi {

struct FamilySpec {
  std::string family = "varlen-causal";
  std::int64_t seqlen = 16384;  // tokens; masks are square (self-attention)
  std::uint64_t seed = 0;       // document lengths and block-sparse picks
  std::int64_t window = 1024;   // sliding-window: each query sees itself and `window` keys back
  std::int64_t block = 0;       // 0: the family's default (2048 block-causal, 128 block-sparse)
  double density = 0.1;         // block-sparse: fraction of key blocks each query block sees
  std::int64_t prefix_len = 0;  // prefix-lm, shared-question: 0 means seqlen / 4
  std::optional<DocLengthHistogram> doc_lengths;  // empty: DocLengthHistogram::builtin()
  std::int64_t max_doc_len = 0;                   // <= 0: seqlen / 4 (docs/semantics.md §4's cap)
};

// Throws magi::Error listing the valid names for an unknown family.
Mask build_family(const FamilySpec& spec);

// Valid family names, in the order of docs/semantics.md §4, for help texts and error messages.
const std::vector<std::string_view>& family_names();

}  // namespace magi
