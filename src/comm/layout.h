// Backend-neutral bookkeeping of the group collectives: which rows go to / come from each peer,
// packing rows into one contiguous message per peer, and the ascending-rank combine. A backend
// only moves one byte buffer per peer (magi_notes §5.6, the all-to-all-v form); everything that
// decides bits lives here, so every backend produces identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "magi/comm.h"

namespace magi::comm {

// `count` rows starting at row `begin` of a buffer; `scale` multiplies a reduced contribution
// (1 / number of sources for kAvg).
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  double scale = 1.0;
};

// Per peer (self included), in message order: the input rows packed into the message to it and
// the output rows its message lands in.
struct ExchangeLayout {
  std::vector<std::vector<RowRange>> send;  // [peer]
  std::vector<std::vector<RowRange>> recv;  // [peer]
};

// Each group collective's argument checks and layout, one definition for every backend (an
// input fails alike on MPI and NCCL, naming the operation). `op` names a group_cast in errors
// (all_gather_v is one).
ExchangeLayout group_cast_layout(const char* op, int rank, int size, const Rows& input,
                                 std::span<const std::int64_t> input_split_sizes,
                                 std::span<const std::vector<std::int32_t>> dst_ranks,
                                 const Rows& output,
                                 std::span<const std::int64_t> output_split_sizes,
                                 std::span<const std::int32_t> src_rank);
ExchangeLayout group_reduce_layout(int rank, int size, const Rows& input,
                                   std::span<const std::int64_t> input_split_sizes,
                                   std::span<const std::int32_t> dst_rank, const Rows& output,
                                   std::span<const std::int64_t> output_split_sizes,
                                   std::span<const std::vector<std::int32_t>> src_ranks,
                                   ReduceOp op);
// in, out: {out rows, lse rows}.
ExchangeLayout group_reduce_lse_layout(int rank, int size, std::span<const Rows, 2> in,
                                       std::span<const std::int64_t> input_split_sizes,
                                       std::span<const std::int32_t> dst_rank,
                                       std::span<const Rows, 2> out,
                                       std::span<const std::int64_t> output_split_sizes,
                                       std::span<const std::vector<std::int32_t>> src_ranks);
// Every rank's counts[r] rows to every rank, in rank order (a group_cast).
ExchangeLayout all_gather_v_layout(int rank, int size, const Rows& input, const Rows& output,
                                   std::span<const std::int64_t> counts);
// Rank r receives (and sums, ascending source rank) rows [sum(counts[:r]), +counts[r]) of
// every rank's input into its first counts[r] output rows.
ExchangeLayout reduce_scatter_layout(int rank, int size, const Rows& input, const Rows& output,
                                     std::span<const std::int64_t> counts);
void check_all_reduce(const Rows& data, ReduceOp op);

std::int64_t total_rows(std::span<const RowRange> ranges);

// A message row is the concatenation of one row of every column (out then lse for kLseMerge).
std::int64_t message_row_bytes(std::span<const Rows> columns);
std::vector<std::byte> pack(std::span<const Rows> columns, std::span<const RowRange> ranges);
// Writes (kSum/kAvg: adds, kMax: maxes, kLseMerge: merges, else copies) a message into columns.
enum class Combine : std::uint8_t { kCopy, kSum, kMax, kLseMerge };
void combine(std::span<const Rows> columns, std::span<const std::byte> message,
             std::span<const RowRange> ranges, Combine how);


}  // namespace magi::comm
