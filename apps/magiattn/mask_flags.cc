// Mask flags: families come from mask_families.h, files from mask_json.h, so the CLI adds no
// mask logic of its own. --mask-file excludes --mask; the family flags are then ignored.
#include "mask_flags.h"

#include <cstdio>

#include "magi/doc_lengths.h"
#include "magi/mask_json.h"

namespace magi::cli {

void add_mask_flags(CLI::App& cmd, MaskFlags& flags) {
  std::string names;
  for (auto n : family_names()) names += (names.empty() ? "" : ", ") + std::string(n);
  FamilySpec& s = flags.spec;
  auto* family = cmd.add_option("--mask", s.family, "mask family: " + names)->capture_default_str();
  cmd.add_option("--seqlen", s.seqlen, "tokens (the mask is seqlen x seqlen)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--seed", s.seed, "seed for document lengths, sparse blocks and tensors")
      ->capture_default_str();
  cmd.add_option("--window", s.window, "sliding-window: keys back from each query")
      ->capture_default_str();
  cmd.add_option("--block", s.block,
                 "block size (0: 2048 for block-causal families, 128 for block-sparse)")
      ->capture_default_str();
  cmd.add_option("--density", s.density, "block-sparse: fraction of key blocks per query block")
      ->capture_default_str();
  cmd.add_option("--prefix", s.prefix_len, "prefix-lm, shared-question: prefix tokens (0: 1/4)")
      ->capture_default_str();
  cmd.add_option("--max-doc-len", s.max_doc_len, "document length cap (0: seqlen / 4)")
      ->capture_default_str();
  cmd.add_option("--doc-lengths", flags.doc_lengths_file,
                 "CSV histogram of document lengths (default: the built-in published one)");
  cmd.add_option("--mask-file", flags.mask_file, "JSON mask file instead of a family")
      ->excludes(family);
}

NamedMask make_mask(const MaskFlags& flags) {
  if (!flags.mask_file.empty()) return {load_mask(flags.mask_file), "file " + flags.mask_file};
  FamilySpec spec = flags.spec;
  if (!flags.doc_lengths_file.empty()) {
    spec.doc_lengths = DocLengthHistogram::from_csv(flags.doc_lengths_file);
  }
  return {build_family(spec), spec.family};
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
