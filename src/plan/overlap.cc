// Stage split and forward-time model. Stages hold equal remote row counts (the reference's
// uniform algorithm): comm per stage is then equal, and the search only picks how many, 1..8,
// because the blog warns that finer automatic tuning chases an inexact compute/comm ratio.
#include "overlap.h"

#include <algorithm>

#include "magi/error.h"

namespace magi::plan::detail {

std::vector<std::int64_t> stage_cuts(std::int64_t remote_rows, int num_stages) {
  MAGI_CHECK(num_stages >= 1, "num_stages ", num_stages, " must be at least 1");
  std::vector<std::int64_t> cuts(num_stages + 1);
  for (int t = 0; t <= num_stages; ++t) cuts[t] = remote_rows * t / num_stages;
  return cuts;
}

double comm_seconds(const CostModel& cost, const StageCost& stage) {
  return double(stage.rows) * cost.bytes_per_row / cost.bytes_per_second +
         double(stage.messages) * cost.seconds_per_message;
}

double forward_seconds(const CostModel& cost, std::int64_t host_area,
                       const std::vector<StageCost>& stages) {
  const double host = double(host_area) * cost.seconds_per_cell;
  if (stages.empty()) return host;
  double total = std::max(comm_seconds(cost, stages[0]), host);
  for (std::size_t t = 1; t < stages.size(); ++t)
    total +=
        std::max(comm_seconds(cost, stages[t]), double(stages[t - 1].area) * cost.seconds_per_cell);
  return total + double(stages.back().area) * cost.seconds_per_cell;
}

int choose_num_stages(const std::vector<std::vector<double>>& seconds) {
  MAGI_CHECK(!seconds.empty(), "no stage counts to choose from");
  int best = 0;
  double best_time = 0;
  for (std::size_t s = 0; s < seconds.size(); ++s) {
    const auto& per_rank = seconds[s];
    const double t = per_rank.empty() ? 0.0 : *std::max_element(per_rank.begin(), per_rank.end());
    if (best == 0 || t < best_time - 1e-9) best = int(s) + 1, best_time = t;
  }
  return best;
}

}  // namespace magi::plan::detail
