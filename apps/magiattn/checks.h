// What the command line shows a user: flag bounds whose messages state the bound (CLI11's
// PositiveNumber prints the whole double range, "Value 0 not in range 0.000000 to 1797693..."
// with 309 digits), byte counts in binary units, and errors without the source location that
// MAGI_CHECK appends (kept for --verbose and bug reports).
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

namespace magi::cli {

// "--seqlen: must be >= 1 (got 0)". Strings that are not numbers pass, so that CLI11's own
// conversion names them ("--seqlen: Value abc could not be converted").
CLI::Validator at_least(double lo);
CLI::Validator in_range(double lo, double hi);        // [lo, hi]
CLI::Validator in_range_above(double lo, double hi);  // (lo, hi]: --density
CLI::Validator above(double lo);                      // > lo: --comm-timeout
CLI::Validator multiple_of(std::int64_t m);

// dispatch's rule (src/plan/dispatch.cc) restated with this command's flags, so that its hint
// names a flag that exists: at least one token per rank and, without --uneven, `tokens` split
// into cp equal shares (of whole chunks when chunk_size > 0).
// "--seqlen 1,000: not divisible by --cp 3 (pass --uneven to allow uneven shards)".
void require_divisible(const std::string& tokens_label, std::int64_t tokens,
                       const std::string& cp_label, std::int64_t cp, std::int64_t chunk_size,
                       bool uneven);

// 1536 -> "1.5 KiB"; below 1 KiB "512 B"; up to EiB.
std::string readable_bytes(double bytes);

// The text after "magiattn: error: ": magi::Error::message() (what() under --verbose), with
// any trailing " (check `...` failed at file:line)" or " (at file:line)" removed even when an
// error was re-wrapped into a plain message.
std::string error_text(const std::exception& e, bool verbose);

// Exit codes: 1 is a failed accuracy check, 2 bad input (magi::Error), 3 anything else thrown
// (a bug, out of memory).
inline constexpr int kUsageError = 2;
inline constexpr int kInternalError = 3;
int exit_code_of(const std::exception& e);

// --verbose, set by main before any command runs.
bool& verbose_errors();

// Prints "magiattn: error: <prefix><text>" (or "internal error") to stderr; returns the code.
int report_error(const std::exception& e, const std::string& prefix = "");

// This process's rank as the MPI launcher announces it in the environment (Open MPI, MPICH
// and PMI, PMIx, Slurm), readable before MPI_Init; 0 when not launched by one.
int launcher_rank();

}  // namespace magi::cli
