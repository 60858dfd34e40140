// Mask flags: families come from mask_families.h, files from mask_json.h, so the CLI adds no
// mask logic of its own. --mask-file excludes every flag that shapes a family.
#include "mask_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "checks.h"
#include "magi/doc_lengths.h"
#include "magi/error.h"
#include "magi/mask_json.h"
#include "memory_estimate.h"

namespace magi::cli {
namespace {

constexpr double kSliceBytes = sizeof(Slice);

// Documents a family packs into `tokens`: twice the expected count under the histogram with
// the family's length cap (each bin at its midpoint), at most one per token.
double expected_docs(const FamilySpec& s, const DocLengthHistogram& hist, double tokens) {
  const double cap =
      s.max_doc_len > 0 ? double(s.max_doc_len) : std::max(1.0, std::floor(double(s.seqlen) / 4));
  double weight = 0, length = 0;
  for (const LengthBin& b : hist.bins) {
    weight += b.weight;
    length += b.weight * std::clamp(double(b.lo + b.hi) / 2, 1.0, cap);
  }
  const double mean = weight > 0 ? std::max(1.0, length / weight) : 1.0;
  return std::min(tokens, 2 * tokens / mean + 1);
}

// Peak bytes of build_family (src/mask/families.cc, builders.cc): slices of 40 bytes; per
// document its length and cumulative offset plus up to 3 slices; block-sparse also its
// byte-per-block mask (num_blocks^2: 61 GB at 1e8 tokens of 128-token blocks).
double family_bytes(const FamilySpec& s, const DocLengthHistogram& hist) {
  const double n = double(s.seqlen);
  const auto block = [&](double fallback) { return s.block > 0 ? double(s.block) : fallback; };
  const auto docs = [&](double tokens) {
    return expected_docs(s, hist, tokens) * (16 + 3 * kSliceBytes);
  };
  const std::string& f = s.family;
  if (f == "block-causal") return (n / block(2048) + 2) * 2 * kSliceBytes;
  if (f == "varlen-block-causal") return docs(n) + (n / block(2048) + 2) * kSliceBytes;
  if (f == "varlen-full" || f == "varlen-causal" || f == "sliding-window") return docs(n);
  if (f == "shared-question" || f == "shared-prefix") return docs(n) + 4 * kSliceBytes;
  if (f == "block-sparse") {
    const double num_blocks = std::ceil(n / block(128));
    const double per_row = std::clamp(std::round(s.density * num_blocks), 1.0, num_blocks);
    return num_blocks * num_blocks + 8 * num_blocks + num_blocks * per_row * kSliceBytes;
  }
  return 16 * kSliceBytes;  // full, causal, prefix-lm: a slice or two
}

DocLengthHistogram histogram_of(const MaskFlags& flags) {
  return flags.doc_lengths_file.empty() ? DocLengthHistogram::builtin()
                                        : DocLengthHistogram::from_csv(flags.doc_lengths_file);
}

}  // namespace

void add_mask_flags(CLI::App& cmd, MaskFlags& flags) {
  std::string names;
  for (auto n : family_names()) names += (names.empty() ? "" : ", ") + std::string(n);
  FamilySpec& s = flags.spec;
  auto* family = cmd.add_option("--mask", s.family, "mask family: " + names)->capture_default_str();
  auto* seqlen = cmd.add_option("--seqlen", s.seqlen, "tokens (the mask is seqlen x seqlen)")
                     ->capture_default_str()
                     ->check(at_least(1));
  cmd.add_option("--seed", s.seed, "seed for document lengths, sparse blocks and tensors")
      ->capture_default_str();
  auto* window = cmd.add_option("--window", s.window, "sliding-window: keys back from each query")
                     ->capture_default_str()
                     ->check(at_least(0));
  auto* block = cmd.add_option("--block", s.block,
                               "block size (0: 2048 for block-causal families, 128 for "
                               "block-sparse)")
                    ->capture_default_str()
                    ->check(at_least(0));
  auto* density =
      cmd.add_option("--density", s.density, "block-sparse: fraction of key blocks per query block")
          ->capture_default_str()
          ->check(in_range_above(0, 1));
  auto* prefix =
      cmd.add_option("--prefix", s.prefix_len, "prefix-lm, shared-question: prefix tokens (0: 1/4)")
          ->capture_default_str()
          ->check(at_least(0));
  auto* max_doc =
      cmd.add_option("--max-doc-len", s.max_doc_len, "document length cap (0: seqlen / 4)")
          ->capture_default_str()
          ->check(at_least(0));
  auto* doc_lengths = cmd.add_option(
      "--doc-lengths", flags.doc_lengths_file,
      "CSV histogram of document lengths (default: the built-in published one)");
  auto* file = cmd.add_option("--mask-file", flags.mask_file,
                              "JSON mask file instead of a family (its tokens replace --seqlen)");
  for (CLI::Option* o : {family, seqlen, window, block, density, prefix, max_doc, doc_lengths})
    file->excludes(o);
  cmd.add_flag("--no-memory-check", flags.no_memory_check,
               "skip the check of the estimated memory against the available memory");
}

double mask_bytes_estimate(const MaskFlags& flags) {
  if (!flags.mask_file.empty()) {  // the parsed JSON and the slices: a few times the text
    std::error_code ec;
    const auto size = std::filesystem::file_size(flags.mask_file, ec);
    return ec ? 0.0 : 16.0 * double(size);
  }
  return family_bytes(flags.spec, histogram_of(flags));
}

NamedMask make_mask(const MaskFlags& flags) {
  if (!flags.no_memory_check) {
    MemoryEstimate e;
    e.add("mask", mask_bytes_estimate(flags));
    require_memory(e, "the mask", "lower --seqlen");
  }
  if (!flags.mask_file.empty()) {
    Mask mask = load_mask(flags.mask_file);  // refuses more cells than an area can count
    return {std::move(mask), "file " + flags.mask_file};
  }
  MAGI_CHECK(flags.spec.seqlen <= kMaxSeqlen, "--seqlen ", grouped(flags.spec.seqlen),
             ": at most ", grouped(kMaxSeqlen),
             " tokens (the mask's area, up to seqlen^2 cells, is an exact 64-bit count)");
  FamilySpec spec = flags.spec;
  if (!flags.doc_lengths_file.empty()) spec.doc_lengths = histogram_of(flags);
  return {build_family(spec), spec.family};
}

std::string tokens_label(const MaskFlags& flags, std::int64_t tokens) {
  if (flags.mask_file.empty()) return "--seqlen " + grouped(tokens);
  return "mask file '" + flags.mask_file + "' (" + grouped(tokens) + " tokens)";
}

std::string grouped(std::int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

void print_mask_summary(std::ostream& os, const NamedMask& m) {
  char sparsity[32];
  std::snprintf(sparsity, sizeof sparsity, "%.2f%%", 100.0 * m.mask.sparsity());
  const std::int64_t nq = m.mask.total_seqlen_q(), nk = m.mask.total_seqlen_k();
  os << "mask        " << m.name << "\n"
     << "tokens      " << (nq == nk ? grouped(nq) : grouped(nq) + " q x " + grouped(nk) + " k")
     << "\n"
     << "slices      " << grouped(std::int64_t(m.mask.size())) << "\n"
     << "area        " << grouped(m.mask.area()) << "\n"
     << "sparsity    " << sparsity << "\n";
}

}  // namespace magi::cli
