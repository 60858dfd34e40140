// magiattn: the command-line front. Parsing errors and magi::Error both end here as one
// "magiattn: error: ..." line and exit code 2, so scripts can tell bad input (2) from a
// failed accuracy check (1) and from anything else thrown (3).
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "magi/error.h"
#include "mask_flags.h"

namespace {
constexpr int kUsageError = 2;
constexpr int kInternalError = 3;
}

int main(int argc, char** argv) {
  CLI::App app{"magiattn: exact attention over slice-list masks (CPU backend)", "magiattn"};
  app.set_version_flag("--version", std::string("magiattn ") + MAGI_VERSION);
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "magiattn: error: " + std::string(e.what()) + "\nrun with --help for the flags\n";
  });
  const magi::cli::Command commands[] = {magi::cli::add_run_command(app),
                                         magi::cli::add_mask_command(app),
                                         magi::cli::add_plan_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageError;
  }
  try {
    for (const auto& c : commands) {
      if (c.app->parsed()) return c.main();
    }
  } catch (const magi::Error& e) {
    std::cerr << "magiattn: error: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::exception& e) {  // a bug or out of memory, not bad input
    std::cerr << "magiattn: internal error: " << e.what() << "\n";
    return kInternalError;
  }
  return kUsageError;
}
