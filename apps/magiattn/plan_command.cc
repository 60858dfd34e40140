// `magiattn plan`: dispatch and solve a mask for cp ranks, print the summary, the planning
// time and the K/V bytes against ring attention (zigzag) and all-gather, and optionally save
// the plan as JSON. Per-rank lines stop at --max-ranks so that cp 1024 stays readable.
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "magi/error.h"
#include "magi/plan.h"
#include "mask_flags.h"

namespace magi::cli {
namespace {

struct PlanCommandFlags {
  MaskFlags mask;
  int cp = 8;
  int stages = 0;
  std::int64_t chunk_size = 0;
  std::string algorithm = "refined";
  bool uneven = false;
  std::string json;
  std::int64_t max_ranks = 16;
};

std::string gigabytes(double bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  os << bytes / 1e9 << " GB";
  return os.str();
}

int run_plan(const PlanCommandFlags& flags) {
  const NamedMask m = make_mask(flags.mask);
  print_mask_summary(std::cout, m);
  plan::PlanOptions opts;
  opts.dispatch.cp = flags.cp;
  opts.dispatch.chunk_size = flags.chunk_size;
  opts.dispatch.uneven = flags.uneven;
  MAGI_CHECK(flags.algorithm == "refined" || flags.algorithm == "minheap", "--algorithm '",
             flags.algorithm, "' is not one of minheap, refined");
  opts.dispatch.algorithm = flags.algorithm == "minheap" ? plan::DispatchAlgorithm::kMinHeap
                                                         : plan::DispatchAlgorithm::kRefined;
  opts.num_stages = flags.stages;
  const auto start = std::chrono::steady_clock::now();
  const plan::DistPlan p = plan::make_plan(m.mask, opts);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::istringstream summary(p.summary());
  std::string line;
  for (std::int64_t i = 0; std::getline(summary, line); ++i) {
    if (i == 3 + flags.max_ranks) {
      std::cout << "... " << p.ranks.size() - std::size_t(flags.max_ranks)
                << " more ranks (--max-ranks)\n";
      break;
    }
    std::cout << line << "\n";
  }
  const plan::TrafficComparison t = plan::compare_traffic(m.mask, p);
  std::cout << "dispatch imbalance " << (p.dispatch.imbalance() - 1) * 100 << "% ("
            << flags.algorithm << ")\n";
  std::cout << "planning time " << seconds << " s\n";
  std::cout << "kv bytes  ours " << gigabytes(t.ours_bytes) << "  ring (zigzag) "
            << gigabytes(t.ring_bytes) << "  all-gather " << gigabytes(t.all_gather_bytes)
            << "  ours/ring " << (t.ring_bytes > 0 ? t.ours_bytes / t.ring_bytes : 0.0) << "\n";
  if (!flags.json.empty()) {
    std::ofstream out(flags.json);
    MAGI_CHECK(out.good(), "cannot write the plan to '", flags.json, "'");
    out << p.to_json() << "\n";
    MAGI_CHECK(out.good(), "writing the plan to '", flags.json, "' failed");
    std::cout << "saved " << flags.json << "\n";
  }
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& parent) {
  auto flags = std::make_shared<PlanCommandFlags>();
  CLI::App* cmd = parent.add_subcommand("plan", "dispatch and solve a mask over cp ranks");
  add_mask_flags(*cmd, flags->mask);
  cmd->add_option("--cp", flags->cp, "context-parallel ranks")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--stages", flags->stages, "remote stages (0: chosen by the cost model)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--chunk-size", flags->chunk_size, "dispatch chunk (0: automatic)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--algorithm", flags->algorithm, "dispatch: minheap or refined")
      ->capture_default_str();
  cmd->add_flag("--uneven", flags->uneven, "allow ranks to differ by one chunk");
  cmd->add_option("--json", flags->json, "write the plan as JSON to this file");
  cmd->add_option("--max-ranks", flags->max_ranks, "per-rank summary lines to print")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return {cmd, [flags] { return run_plan(*flags); }};
}

}  // namespace magi::cli
