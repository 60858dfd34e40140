// Distributed planning (docs/semantics.md §3), pure host code: dispatch (which rank owns which
// chunks), the static solver (which K/V rows each rank fetches, localized slices per stage, group-
// collective arguments) and the overlap stage split. Every output is a plain value with == and
// JSON; every rank computes the same plan from the same mask with no communication.
//
// Self-attention layout: Q and K share one token partition (total_seqlen_q == total_seqlen_k).
// A rank's local buffer is the concatenation of its chunks in ascending chunk order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "magi/mask.h"

namespace magi::plan {

// ---------------------------------------------------------------- dispatch

enum class DispatchAlgorithm : std::uint8_t {
  kMinHeap,  // the reference's greedy LPT min-heap (the floor)
  kRefined,  // LPT, then pairwise-swap refinement; never worse than kMinHeap
};

struct DispatchOptions {
  int cp = 1;                      // ranks
  std::int64_t chunk_size = 0;     // 0: automatic
  DispatchAlgorithm algorithm = DispatchAlgorithm::kRefined;
  bool uneven = false;             // allow ranks to differ by one chunk (seqlen not divisible)
};

struct Dispatch {
  int cp = 1;
  std::int64_t total_seqlen = 0;
  std::int64_t chunk_size = 0;
  std::vector<std::int64_t> chunk_area;               // [num_chunks] visible cells of its rows
  std::vector<std::vector<std::int32_t>> rank_chunks;  // [cp] chunk ids, ascending
  std::vector<std::int64_t> rank_area;                 // [cp]

  std::int64_t num_chunks() const { return std::int64_t(chunk_area.size()); }
  Range chunk_range(std::int64_t chunk_idx) const;
  // Global token ranges of a rank, merged, in local order (adjacent chunks fused).
  std::vector<Range> host_ranges(int rank) const;
  std::int64_t rank_tokens(int rank) const;
  // perm[i] = global token at position i of the rank-major dispatched order; inverse too.
  std::vector<std::int64_t> permutation() const;
  std::vector<std::int64_t> inverse_permutation() const;
  // Global position of every local token of a rank (RoPE position ids).
  std::vector<std::int64_t> position_ids(int rank) const;
  double imbalance() const;  // max / mean rank area (1.0 is perfect)

  friend bool operator==(const Dispatch&, const Dispatch&) = default;
};

Dispatch dispatch(const Mask& mask, const DispatchOptions& opts);

// ---------------------------------------------------------------- solver

// Group-collective arguments of one rank for one stage (docs/semantics.md §3, magi_notes §5.5).
// Cast: the rank's host K buffer is cut into consecutive splits (input_split_sizes, summing
// to at most its host tokens; rows not sent to anyone are covered by splits with no
// destination); split i goes to every rank in dst_ranks[i]. The stage's receive buffer is cut
// into output_split_sizes, split j coming from src_rank[j], in the source's split order.
// The backward reduce is the transpose (reduce_args()).
struct GroupCollectiveArgs {
  std::vector<std::int64_t> input_split_sizes;
  std::vector<std::vector<std::int32_t>> dst_ranks;
  std::vector<std::int64_t> output_split_sizes;
  std::vector<std::int32_t> src_rank;

  friend bool operator==(const GroupCollectiveArgs&, const GroupCollectiveArgs&) = default;
};

// Transposed arguments for group_reduce: input = the receive buffer (partial dK/dV), each
// split to its single owner; output = host K rows, each split reduced over its rank set.
struct GroupReduceArgs {
  std::vector<std::int64_t> input_split_sizes;
  std::vector<std::int32_t> dst_rank;
  std::vector<std::int64_t> output_split_sizes;
  std::vector<std::vector<std::int32_t>> src_ranks;

  friend bool operator==(const GroupReduceArgs&, const GroupReduceArgs&) = default;
};
GroupReduceArgs reduce_args(const GroupCollectiveArgs& cast);

struct Stage {
  std::vector<Range> remote_k_ranges;  // global, ascending, merged; the receive buffer layout
  std::vector<Slice> slices;           // local: q in the host Q buffer, k in the receive buffer
  GroupCollectiveArgs cast;
  std::int64_t area = 0;

  friend bool operator==(const Stage&, const Stage&) = default;
};

struct RankPlan {
  std::vector<Range> host_ranges;   // global, in local order (Q and K alike)
  std::vector<Slice> host_slices;   // local: q and k in the host buffer
  std::int64_t host_area = 0;
  std::vector<Stage> stages;        // remote stages in execution order

  friend bool operator==(const RankPlan&, const RankPlan&) = default;
};

// ---------------------------------------------------------------- overlap

// Cost model (seconds): compute per visible cell and head-dim unit, bytes per K/V row,
// latency per message. Defaults are rough H200/NVLink figures; measured values replace them.
struct CostModel {
  double seconds_per_cell = 4.0 * 128 * 32 / 600e12;  // fwd, D 128, 32 heads at 600 TFLOP/s
  double bytes_per_row = 2.0 * 8 * 128 * 2;           // K and V, 8 kv heads, D 128, bf16
  double bytes_per_second = 150e9;
  double seconds_per_message = 10e-6;

  friend bool operator==(const CostModel&, const CostModel&) = default;
};

struct PlanOptions {
  DispatchOptions dispatch;
  int num_stages = 0;  // 0: choose 1..8 by the cost model; else exactly this many
  CostModel cost;
};

struct DistPlan {
  Dispatch dispatch;
  std::vector<RankPlan> ranks;
  CostModel cost;
  double predicted_seconds = 0;  // slowest rank's forward under the cost model

  std::string to_json(int indent = -1) const;
  std::string summary() const;  // per-rank tokens, area, bytes in/out per stage, imbalance
  friend bool operator==(const DistPlan&, const DistPlan&) = default;
};

DistPlan make_plan(const Mask& mask, const PlanOptions& opts);
DistPlan plan_from_json(const std::string& text);

// Bytes each scheme moves for the same mask and cp, for comparison (K and V rows x
// bytes_per_row): ours (sum over ranks of received rows), ring attention with zigzag
// sharding (every rank receives all other ranks' K/V), all-gather (same as ring, one shot).
struct TrafficComparison {
  double ours_bytes = 0, ring_bytes = 0, all_gather_bytes = 0;
};
TrafficComparison compare_traffic(const Mask& mask, const DistPlan& plan);

}  // namespace magi::plan
