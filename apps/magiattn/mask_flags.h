// Flags that choose a mask, shared by `magiattn run` and `magiattn mask`: a benchmark family
// (SPEC §4) with its parameters, or a JSON mask file. The defaults are the SPEC's benchmark
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
};

struct NamedMask {
  Mask mask;
  std::string name;  // the family, or "file <path>"
};

void add_mask_flags(CLI::App& cmd, MaskFlags& flags);
NamedMask make_mask(const MaskFlags& flags);

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
