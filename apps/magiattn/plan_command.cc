// `magiattn plan`: dispatch and solve a mask for cp ranks and print one aligned table per
// rank (tokens, visible area, K/V bytes in and out in binary units), the planning time and
// the K/V bytes against ring attention (zigzag) and all-gather; optionally save the plan as
// JSON. One imbalance figure: max / mean - 1 of the per-rank visible area, which is what
// dispatch minimises (the cost model only picks the stage count). Rank lines stop at
// --max-ranks so that cp 1024 stays readable.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "checks.h"
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

std::string printf_str(const char* format, double x) {
  char s[64];
  std::snprintf(s, sizeof s, format, x);
  return s;
}

std::string seconds_str(double s) {
  return s < 1 ? printf_str("%.1f ms", s * 1e3) : printf_str("%.2f s", s);
}

// Rows received and sent in one stage's cast (the forward's K/V; the backward returns as many
// dK/dV rows the other way).
std::pair<std::int64_t, std::int64_t> stage_rows(const plan::Stage& st) {
  std::int64_t in = 0, out = 0;
  for (std::int64_t s : st.cast.output_split_sizes) in += s;
  for (std::size_t i = 0; i < st.cast.input_split_sizes.size(); ++i)
    out += st.cast.input_split_sizes[i] * std::int64_t(st.cast.dst_ranks[i].size());
  return {in, out};
}

// Right-aligned columns as wide as their widest cell, two spaces apart.
void print_columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += (c == 0 ? "" : "  ") + std::string(width[c] - row[c].size(), ' ') + row[c];
    }
    std::cout << line << "\n";
  }
}

// One line per rank up to max_ranks: tokens, visible area (all of it, and the part against
// its own K/V), K/V bytes in and out over all stages, and per stage the bytes in when the
// plan has more than one.
void print_ranks(const plan::DistPlan& p, std::int64_t max_ranks) {
  const double row_bytes = p.cost.bytes_per_row;
  const std::size_t num_stages = p.ranks.empty() ? 0 : p.ranks[0].stages.size();
  std::vector<std::vector<std::string>> rows{
      {"rank", "tokens", "area", "host area", "K/V in", "K/V out"}};
  if (num_stages > 1) {
    for (std::size_t t = 0; t < num_stages; ++t)
      rows[0].push_back("stage " + std::to_string(t) + " in");
  }
  const std::size_t shown = std::min(p.ranks.size(), std::size_t(max_ranks));
  for (std::size_t r = 0; r < shown; ++r) {
    const plan::RankPlan& rp = p.ranks[r];
    std::int64_t area = rp.host_area, in = 0, out = 0;
    std::vector<std::string> per_stage;
    for (const plan::Stage& st : rp.stages) {
      const auto [stage_in, stage_out] = stage_rows(st);
      area += st.area, in += stage_in, out += stage_out;
      per_stage.push_back(readable_bytes(double(stage_in) * row_bytes));
    }
    rows.push_back({std::to_string(r), grouped(p.dispatch.rank_tokens(int(r))), grouped(area),
                    grouped(rp.host_area), readable_bytes(double(in) * row_bytes),
                    readable_bytes(double(out) * row_bytes)});
    if (num_stages > 1) rows.back().insert(rows.back().end(), per_stage.begin(), per_stage.end());
  }
  print_columns(rows);
  if (shown < p.ranks.size()) {
    std::cout << "... " << p.ranks.size() - shown << " more ranks (--max-ranks)\n";
  }
}

int run_plan(const PlanCommandFlags& flags) {
  MAGI_CHECK(flags.algorithm == "refined" || flags.algorithm == "minheap", "--algorithm '",
             flags.algorithm, "' is not one of minheap, refined");
  const NamedMask m = make_mask(flags.mask);
  print_mask_summary(std::cout, m);
  const std::int64_t tokens = m.mask.total_seqlen_q();
  require_divisible(tokens_label(flags.mask, tokens), tokens, "--cp " + std::to_string(flags.cp),
                    flags.cp, flags.chunk_size, flags.uneven);
  plan::PlanOptions opts;
  opts.dispatch.cp = flags.cp;
  opts.dispatch.chunk_size = flags.chunk_size;
  opts.dispatch.uneven = flags.uneven;
  opts.dispatch.algorithm = flags.algorithm == "minheap" ? plan::DispatchAlgorithm::kMinHeap
                                                         : plan::DispatchAlgorithm::kRefined;
  opts.num_stages = flags.stages;
  const auto start = std::chrono::steady_clock::now();
  const plan::DistPlan p = plan::make_plan(m.mask, opts);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::size_t num_stages = p.ranks.empty() ? 0 : p.ranks[0].stages.size();
  std::cout << "plan        cp " << p.dispatch.cp << ", chunks of "
            << grouped(p.dispatch.chunk_size) << " tokens, " << num_stages
            << (num_stages == 1 ? " stage" : " stages")
            << ", dispatch " << flags.algorithm << "\n"
            << "imbalance   " << printf_str("%.2f%%", (p.dispatch.imbalance() - 1) * 100)
            << " (max / mean - 1 of the ranks' visible area, which dispatch minimises)\n"
            << "predicted   " << seconds_str(p.predicted_seconds)
            << " forward, slowest rank (cost model)\n"
            << "planning    " << seconds_str(seconds) << "\n";
  print_ranks(p, flags.max_ranks);
  const plan::TrafficComparison t = plan::compare_traffic(m.mask, p);
  std::cout << "K/V bytes   ours " << readable_bytes(t.ours_bytes) << ", ring (zigzag) "
            << readable_bytes(t.ring_bytes) << ", all-gather " << readable_bytes(t.all_gather_bytes)
            << ", ours/ring "
            << printf_str("%.3f", t.ring_bytes > 0 ? t.ours_bytes / t.ring_bytes : 0.0) << "\n"
            << "            (rows of K and V at the cost model's "
            << grouped(std::int64_t(p.cost.bytes_per_row))
            << " bytes per row;\n             the backward returns as many dK/dV rows)\n";
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
      ->check(at_least(1));
  cmd->add_option("--stages", flags->stages, "remote stages (0: chosen by the cost model)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--chunk-size", flags->chunk_size, "dispatch chunk (0: automatic)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("--algorithm", flags->algorithm, "dispatch: minheap or refined")
      ->capture_default_str();
  cmd->add_flag("--uneven", flags->uneven, "allow ranks to differ by one chunk");
  cmd->add_option("--json", flags->json, "write the plan as JSON to this file");
  cmd->add_option("--max-ranks", flags->max_ranks, "per-rank lines to print")
      ->capture_default_str()
      ->check(at_least(0));
  return {cmd, [flags] { return run_plan(*flags); }};
}

}  // namespace magi::cli
