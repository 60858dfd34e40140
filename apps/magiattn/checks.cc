// Flag bounds, byte units and error text for the command line (see checks.h).
#include "checks.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <regex>

#include "magi/error.h"

namespace magi::cli {
namespace {

std::string number(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%.15g", x);
  return s;
}

// Runs `fails(x)` on the option's value when it parses as a number; `bound` is the message.
template <typename Fails>
CLI::Validator bound(const std::string& bound_text, Fails fails) {
  return CLI::Validator(
      [bound_text, fails](std::string& value) -> std::string {
        double x = 0;
        if (!CLI::detail::lexical_cast(value, x)) return {};
        return fails(x) ? "must be " + bound_text + " (got " + value + ")" : std::string();
      },
      bound_text);
}

}  // namespace

CLI::Validator at_least(double lo) {
  return bound(">= " + number(lo), [lo](double x) { return !(x >= lo); });
}

CLI::Validator above(double lo) {
  return bound("> " + number(lo), [lo](double x) { return !(x > lo); });
}

CLI::Validator in_range(double lo, double hi) {
  return bound("in [" + number(lo) + ", " + number(hi) + "]",
               [lo, hi](double x) { return !(x >= lo && x <= hi); });
}

CLI::Validator in_range_above(double lo, double hi) {
  return bound("in (" + number(lo) + ", " + number(hi) + "]",
               [lo, hi](double x) { return !(x > lo && x <= hi); });
}

CLI::Validator multiple_of(std::int64_t m) {
  return bound("a multiple of " + std::to_string(m),
               [m](double x) { return std::fmod(x, double(m)) != 0; });
}

void require_divisible(const std::string& tokens_label, std::int64_t tokens,
                       const std::string& cp_label, std::int64_t cp, std::int64_t chunk_size,
                       bool uneven) {
  MAGI_CHECK(tokens >= cp, tokens_label, ": fewer tokens than ", cp_label,
             " (every rank needs a chunk of at least one token)");
  if (uneven) return;
  if (chunk_size > 0) {
    MAGI_CHECK(tokens % (cp * chunk_size) == 0, tokens_label, ": not divisible by ", cp_label,
               " x --chunk-size ", chunk_size, " (pass --uneven to allow a short last chunk)");
  }
  MAGI_CHECK(tokens % cp == 0, tokens_label, ": not divisible by ", cp_label,
             " (pass --uneven to allow uneven shards)");
}

std::string readable_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  while (unit + 1 < std::size(kUnits) && std::abs(bytes) >= 1024) bytes /= 1024, ++unit;
  char s[32];
  std::snprintf(s, sizeof s, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return s;
}

std::string error_text(const std::exception& e, bool verbose) {
  if (verbose) return e.what();
  const auto* magi_error = dynamic_cast<const Error*>(&e);
  const std::string text = magi_error ? magi_error->message() : std::string(e.what());
  if (!magi_error) return text;
  // A message re-thrown as Error(prefix + inner.what()) still ends in the inner's location.
  static const std::regex kWhere(" \\((check `.*` failed at|at) [^ ()]+:[0-9]+\\)$");
  return std::regex_replace(text, kWhere, "");
}

int exit_code_of(const std::exception& e) {
  return dynamic_cast<const Error*>(&e) ? kUsageError : kInternalError;
}

bool& verbose_errors() {
  static bool verbose = false;
  return verbose;
}

int report_error(const std::exception& e, const std::string& prefix) {
  const int code = exit_code_of(e);
  std::cerr << (code == kUsageError ? "magiattn: error: " : "magiattn: internal error: ")
            << prefix << error_text(e, verbose_errors()) << std::endl;
  return code;
}

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

}  // namespace magi::cli
