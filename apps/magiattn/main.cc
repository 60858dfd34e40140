// magiattn: the command-line front. Parsing errors and magi::Error both end here as one
// "magiattn: error: ..." line and exit code 2, so scripts can tell bad input (2) from a
// failed accuracy check (1) and from anything else thrown (3). The line carries the message
// only; --verbose adds the source location and failed check that magi::Error keeps for bug
// reports. Under mpirun every rank parses the same flags and fails the same way, so only
// rank 0 prints (distributed `run` compares its ranks' failures itself: distributed.h).
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "checks.h"
#include "magi/error.h"
#include "mask_flags.h"

int main(int argc, char** argv) {
  using namespace magi::cli;
  CLI::App app{"magiattn: exact attention over slice-list masks (CPU backend)", "magiattn"};
  app.set_version_flag("--version", std::string("magiattn ") + MAGI_VERSION);
  app.add_flag("--verbose", verbose_errors(),
               "errors also show where the library raised them (for bug reports)");
  app.fallthrough();  // --verbose after the subcommand too
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    const bool conflict = dynamic_cast<const CLI::ExcludesError*>(&e) != nullptr;
    return "magiattn: error: " + std::string(e.what()) +
           (conflict ? " (give one or the other)" : "") + "\nrun with --help for the flags\n";
  });
  const Command commands[] = {add_run_command(app), add_mask_command(app),
                              add_plan_command(app)};
  const bool quiet = launcher_rank() != 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (quiet && e.get_exit_code() != 0) return kUsageError;
    return app.exit(e) == 0 ? 0 : kUsageError;
  }
  try {
    for (const auto& c : commands) {
      if (c.app->parsed()) return c.main();
    }
  } catch (const std::exception& e) {  // magi::Error: bad input (2); else a bug or OOM (3)
    return quiet ? exit_code_of(e) : report_error(e);
  }
  return kUsageError;
}
