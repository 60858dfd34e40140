// Flags that choose a mask, shared by `magiattn run` and `magiattn mask`: a benchmark family
// (docs/semantics.md §4) with its parameters, or a JSON mask file. The defaults are the benchmark
// settings, so a bare command reproduces the published protocol.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>

#include "magi/mask.h"
#include "magi/mask_families.h"

namespace magi::cli {

struct MaskFlags {
  FamilySpec spec;
  std::string mask_file;
  std::string doc_lengths_file;
  bool no_memory_check = false;
};

struct NamedMask {
  Mask mask;
  std::string name;  // the family, or "file <path>"
};

// --mask-file conflicts with the flags that shape a family (--seqlen, --window, ...): the file
// fixes them, so giving both is an error rather than a silent override. --seed stays free.
void add_mask_flags(CLI::App& cmd, MaskFlags& flags);

// Bytes the mask and its builder take, from the flags alone (a family's sizes and expected
// document count, a file's size): checked before anything is built.
double mask_bytes_estimate(const MaskFlags& flags);
// Checks the memory estimate (unless --no-memory-check) and the size limit, then builds.
NamedMask make_mask(const MaskFlags& flags);

// How an error names the mask's tokens: "--seqlen 1,000" or "mask file 'x.json' (1,000 tokens)".
std::string tokens_label(const MaskFlags& flags, std::int64_t tokens);

// Tokens of a family mask at most: seqlen^2 cells within the library's kMaxMaskCells (2^62).
inline constexpr std::int64_t kMaxSeqlen = std::int64_t(1) << 31;

// Family, tokens, slices, area and sparsity as "key  value" lines.
void print_mask_summary(std::ostream& os, const NamedMask& m);
std::string grouped(std::int64_t n);  // 12345678 -> "12,345,678"

// A subcommand registered on the top-level app; `main` runs it after a successful parse.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> main;
};
Command add_run_command(CLI::App& parent);
Command add_mask_command(CLI::App& parent);
Command add_plan_command(CLI::App& parent);

}  // namespace magi::cli
