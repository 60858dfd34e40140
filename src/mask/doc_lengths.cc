// Document lengths for packed-sequence benchmarks. The built-in histogram is a table of
// figures, not a file read at run time, so every binary reproduces the published benchmark
// setting from a seed alone; users can still load their own histogram from a CSV.
#include "magi/doc_lengths.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <random>
#include <string_view>

#include "magi/error.h"
#include "portable_random.h"

namespace magi {
namespace {

// The document-length histogram of a real pre-training dataset, published by MagiAttention
// (SandAI) with its benchmarks: exps/dist_attn/benchmark/datasets/default/
// doc_length_distribution.csv. Bins are inclusive token counts; the weight is the published
// percentage of documents, rounded to 2 decimals (so the 14 figures sum to 100.02).
constexpr LengthBin kBuiltinBins[] = {
    {0, 10, 0.22},         {11, 50, 2.91},         {51, 100, 5.20},      {101, 200, 10.23},
    {201, 500, 28.19},     {501, 1024, 24.64},     {1025, 2048, 15.65},  {2049, 4096, 7.34},
    {4097, 8192, 3.05},    {8193, 16384, 1.29},    {16385, 32768, 0.85}, {32769, 65536, 0.14},
    {65537, 131072, 0.17}, {131073, 196608, 0.14},
};

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

// One CSV line to trimmed fields; double quotes group commas ("[0, 10]"), "" is a quote.
std::vector<std::string> split_csv(std::string_view line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"' && quoted && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  for (auto& f : fields) f = std::string(trim(f));
  return fields;
}

template <typename T>
bool parse_number(std::string_view s, T& value) {
  s = trim(s);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// "[lo, hi]", both ends inclusive, as in the published file.
LengthBin parse_range(std::string_view text, const std::string& where) {
  const std::string_view s = trim(text);
  const auto comma = s.find(',');
  MAGI_CHECK(
      s.size() >= 2 && s.front() == '[' && s.back() == ']' && comma != std::string_view::npos,
      where, ": range '", text, "' is not of the form \"[lo, hi]\"");
  LengthBin bin;
  MAGI_CHECK(parse_number(s.substr(1, comma - 1), bin.lo) &&
                 parse_number(s.substr(comma + 1, s.size() - comma - 2), bin.hi),
             where, ": range '", text, "' does not hold two integers");
  MAGI_CHECK(bin.lo >= 0 && bin.lo <= bin.hi, where, ": range '", text,
             "' must satisfy 0 <= lo <= hi");
  return bin;
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const LengthBin& pick_bin(const std::vector<LengthBin>& bins, double total_weight,
                          std::mt19937_64& rng) {
  const double u = detail::uniform_unit(rng) * total_weight;
  double acc = 0;
  const LengthBin* last = nullptr;
  for (const auto& bin : bins) {
    if (bin.weight <= 0) continue;
    acc += bin.weight;
    last = &bin;
    if (u < acc) return bin;
  }
  return *last;  // u landed on the rounding edge of the last positive bin
}

}  // namespace

DocLengthHistogram DocLengthHistogram::builtin() {
  return {std::vector<LengthBin>(std::begin(kBuiltinBins), std::end(kBuiltinBins))};
}

DocLengthHistogram DocLengthHistogram::from_csv(const std::string& path) {
  std::ifstream in(path);
  MAGI_CHECK(in.good(), "doc lengths file '", path, "' cannot be opened");
  std::string line;
  MAGI_CHECK(std::getline(in, line).good() || !line.empty(), "doc lengths file '", path,
             "' is empty (expected a header line)");

  // Columns are found by name so that extra columns (number, cumulative) may come in any order.
  const auto header = split_csv(line);
  std::size_t range_col = header.size(), weight_col = header.size();
  for (std::size_t i = 0; i < header.size(); ++i) {
    const std::string name = lower(header[i]);
    if (name == "range" && range_col == header.size()) range_col = i;
    if (name.starts_with("percentage") && weight_col == header.size()) weight_col = i;
  }
  MAGI_CHECK(range_col < header.size() && weight_col < header.size(), "doc lengths file '", path,
             "' line 1: header needs a 'range' and a 'percentage' column, got '", trim(line), "'");

  DocLengthHistogram hist;
  double total_weight = 0;
  for (int line_idx = 2; std::getline(in, line); ++line_idx) {
    if (trim(line).empty()) continue;
    const std::string where = "doc lengths file '" + path + "' line " + std::to_string(line_idx);
    const auto fields = split_csv(line);
    MAGI_CHECK(fields.size() > std::max(range_col, weight_col), where, ": expected ", header.size(),
               " columns, got ", fields.size());
    LengthBin bin = parse_range(fields[range_col], where);
    MAGI_CHECK(parse_number(fields[weight_col], bin.weight) && std::isfinite(bin.weight) &&
                   bin.weight >= 0,
               where, ": percentage '", fields[weight_col], "' is not a number >= 0");
    total_weight += bin.weight;
    hist.bins.push_back(bin);
  }
  MAGI_CHECK(total_weight > 0, "doc lengths file '", path,
             "' has no bin with a positive percentage");
  return hist;
}

std::vector<std::int64_t> sample_doc_lengths(const DocLengthHistogram& hist, std::int64_t total,
                                             std::int64_t max_len, std::uint64_t seed) {
  MAGI_CHECK(total >= 0, "sample_doc_lengths: total ", total, " is negative");
  double total_weight = 0;
  for (std::size_t i = 0; i < hist.bins.size(); ++i) {
    const auto& bin = hist.bins[i];
    MAGI_CHECK(bin.lo >= 0 && bin.lo <= bin.hi && std::isfinite(bin.weight) && bin.weight >= 0,
               "doc length bin ", i, ": [", bin.lo, ", ", bin.hi, "] weight ", bin.weight,
               " needs 0 <= lo <= hi and a weight >= 0");
    total_weight += bin.weight;
  }
  MAGI_CHECK(total_weight > 0, "doc length histogram: no bin has a positive weight");
  if (max_len <= 0) max_len = std::max<std::int64_t>(1, total / 4);

  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> lengths;
  for (std::int64_t left = total; left > 0;) {
    const LengthBin& bin = pick_bin(hist.bins, total_weight, rng);
    const auto offset = detail::uniform_below(rng, std::uint64_t(bin.hi - bin.lo) + 1);
    const std::int64_t len =
        std::clamp<std::int64_t>(bin.lo + std::int64_t(offset), 1, std::min(max_len, left));
    lengths.push_back(len);
    left -= len;
  }
  return lengths;
}

std::vector<std::int64_t> cu_seqlens_from_lengths(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int64_t> cu(lengths.size() + 1, 0);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    MAGI_CHECK(lengths[i] >= 0, "document ", i, ": length ", lengths[i], " is negative");
    cu[i + 1] = cu[i] + lengths[i];
  }
  return cu;
}

}  // namespace magi
