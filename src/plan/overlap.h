// Multi-stage overlap (docs/semantics.md §3, magi_notes §5.3): the remote K/V rows of a rank are
// cut into stages of equal row counts, and the forward time of a candidate split is predicted with
// the CostModel. Internal to the planner; the solver feeds it per-rank stage costs.
#pragma once

#include <cstdint>
#include <vector>

#include "magi/plan.h"

namespace magi::plan::detail {

inline constexpr int kMaxAutoStages = 8;  // the reference's dynamic_max_degree

struct StageCost {
  std::int64_t rows = 0;      // K/V rows received
  std::int64_t messages = 0;  // distinct source ranks
  std::int64_t area = 0;      // visible cells computed against this stage's rows
};

// Positions in the remote buffer where stage t starts: cuts[t], t = 0..num_stages (cuts[S] = rows).
std::vector<std::int64_t> stage_cuts(std::int64_t remote_rows, int num_stages);

double comm_seconds(const CostModel& cost, const StageCost& stage);
// max(comm(0), host) + sum_{t>=1} max(comm(t), compute(t-1)) + compute(last).
double forward_seconds(const CostModel& cost, std::int64_t host_area,
                       const std::vector<StageCost>& stages);

// seconds[s - 1][rank]: predicted time with s stages. Returns the s whose slowest rank is
// fastest; ties (within 1 ns) go to fewer stages, which means fewer launches and messages.
int choose_num_stages(const std::vector<std::vector<double>>& seconds);

}  // namespace magi::plan::detail
