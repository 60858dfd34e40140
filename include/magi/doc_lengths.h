// Document-length distributions for packed-sequence benchmarks (docs/semantics.md §4). The built-in
// table is the histogram MagiAttention published with its benchmark; users may load their own CSV
// in the same form ("range,number,percentage(%),cumulative-percentage(%)").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace magi {

struct LengthBin {
  std::int64_t lo = 0;  // inclusive
  std::int64_t hi = 0;  // inclusive
  double weight = 0;    // relative frequency (any positive scale)
};

struct DocLengthHistogram {
  std::vector<LengthBin> bins;

  static DocLengthHistogram builtin();
  static DocLengthHistogram from_csv(const std::string& path);
};

// Document lengths summing exactly to total, each in [1, max_len] (the last one is cut to fit);
// deterministic for a seed. max_len <= 0 means total / 4 (docs/semantics.md §4's cap).
std::vector<std::int64_t> sample_doc_lengths(const DocLengthHistogram& hist, std::int64_t total,
                                             std::int64_t max_len, std::uint64_t seed);
std::vector<std::int64_t> cu_seqlens_from_lengths(const std::vector<std::int64_t>& lengths);

}  // namespace magi
